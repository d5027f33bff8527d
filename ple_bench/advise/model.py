"""The what-if model: a decode step's cost for configurations the runs did not measure
(bigger tables, token counts past the measured ones, ETP groups, ETP across nodes, more host
cores), calibrated on what runs measured, its error measured two ways, every prediction bounded
below by what is physically possible.

Reads stored records and meta.json ceilings only (never measures).  A *path* is everything that
makes two step records the same configuration but tokens, table and compute length: impl · kernel,
prefetch, ids on host/device, graph mode, SM limit, hot-row cache size, gather threads, the
**timer** (``cuda_event`` and ``host_sync`` figures are never fitted together, nor compared), the
id distribution (``ids``), the host allocation (``host_alloc``; "" for a resident table) and the
**compute kind** (``compute``: the matmul chain, whose length ``compute_us`` the model fits, or one
decoder configuration -- shape, layers, context -- whose measured time is its own; the two are
never fitted together, nor their compute pooled: :mod:`ple_bench.advise.compute_kind`).

Every slope below (per row, per microsecond of compute) is fitted non-negative (bounded least
squares, :func:`scipy.optimize.lsq_linear`); intercepts are free except the lookup's (>= 0: a
lookup of no rows takes no negative time).

* **compute** ``C = c0 + c1 · compute_us + c2 · rows`` -- on ``compute_ms`` (the step without its
  lookup) over every path of the same timer, graph mode and id placement (falling back to the
  same timer and graph mode, then the same timer -- never across timers; a path with fewer pooled
  steps, or a resident step's host-sync twin, fits its own): the compute does not depend on the
  lookup path; never across compute kinds.  ``C >= 0``.
* **lookup alone** ``L = l0 + l1 · rows · (table / 32 GiB)^δ`` -- on the path's ``lookup_ms``.
  ``δ`` is how the row rate falls with the table (TLB / page-walk reach): fitted from the runs'
  lookup records of pinned kernel paths at several table sizes (≥ 4 GiB), and from the
  ``host_gather`` ceilings (meta.json) for host-gather paths; device-resident tables: 0 (flat in
  the runs).  A host-gather path's per-row part scales with host cores by the thread fit
  ``s + p/n + o·n`` of records with ``gather_threads`` varied.
* **lookup floors** -- ``L`` is never below (a) the path's physical floor, ``rows · row_bytes``
  over the fastest measured ceiling that binds it (the fastest over all runs' meta.json, so the
  floor is a lower bound): host-gather paths the ``host_gather`` ceiling's rows/s at the row size
  (scaled by the thread fit when more host cores are asked) and ``h2d_gbps``; pinned kernels
  ``h2d_gbps`` (the random-row ceiling is not a bound: measured lookups exceed it); resident
  tables and hot-row caches ``d2d_gbps``; nor (b) the smallest lookup the path measured at fewer
  or equal rows on a table no larger (not applied with more host cores than measured).
* **exposed** -- serial (prefetch off): ``L``; prefetch on: ``max(0, L − C)`` (what the compute
  cannot hide); plus the path's own measured residual ``e0 + e1 · rows`` (launch, sync, the side
  stream's competition for SMs), never below 0 (a step is never shorter than its compute).
* **ETP n** (tp 1: n replicas share one table split in n): each rank reads a shard of
  ``table / n`` (the same expected rows per rank: the ids of all n replicas, of which 1/n hit the
  shard -- an assumption), plus the all-reduce of ``n · rows · row_bytes`` bytes,
  ``alpha + bytes · 2(n−1)/n / busbw`` with alpha and busbw fitted on the runs' ETP lookup records
  (``reduce_ms`` vs ``reduce_bytes``).  Across ``nodes`` with an inter-node link
  (``link_gbps`` GB/s per GPU, ``link_latency_us``): busbw ``min(busbw, link_gbps)`` and alpha
  plus ``2 (nodes − 1) · link_latency`` (a ring's inter-node steps -- an assumption).  The reduce
  runs in finalize after the compute: no prefetch hides it.

Step = C + exposed (+ nothing else).  A prediction that a floor raised says which
(:attr:`Prediction.floors`); one at rows outside the path's measured row range is
*extrapolated* (:attr:`Prediction.extrapolated`).

Its error is measured two ways, and travels with every prediction (per path and overall):

* :func:`leave_one_out` -- by **configuration group**: all the steps of one (path, table size,
  compute) group are left out together (every token count of that configuration), the path is
  refitted on its other groups, and the pooled compute fit on every step but that group and its
  twins (the same path but for ``ids`` / ``host_alloc``, at the same table and compute); paths
  measured in one group only are not checked this way.
* :func:`extrapolation_holdout` -- each path's largest measured row count is left out (at every
  table and compute), the path is refitted on its smaller row counts, the compute on every step of
  fewer rows, and the held-out steps predicted: the error of a prediction past the measured range.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, NamedTuple, Sequence

import numpy as np
from scipy.optimize import lsq_linear

from ..record import device_resident, num, resident_figures
from .compute_kind import compute_kind
from ..report.data import KERNEL_FREE_IMPLS
from ..results import load_meta, load_records

GIB = 1 << 30
REF_TABLE = 32 * GIB  # the table size the per-row term is quoted at
#: δ when the runs have no table-size sweep: 32 → 28 Mrow/s from 32 to 100 GiB (docs/host-allocation.md)
DEFAULT_DELTA = math.log(32 / 28) / math.log(100 / 32)
#: a table within this factor of a measured one counts as measured (47.7 GiB vs 51.2 GB)
TABLE_SLACK = 1.05


def _s(v: Any) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


class PathKey(NamedTuple):
    """What makes two step records the same path (everything but tokens, table and compute)."""

    impl: str
    kernel: str
    prefetch: bool
    ids_on: str
    graph: str
    sm_limit: int
    cache_rows: int
    gather_threads: int
    timer: str
    ids: str
    host_alloc: str  # "" for a device-resident table (no host allocation)
    #: the compute kind (:func:`ple_bench.advise.compute_kind.compute_kind`): "matmul", or one decoder
    #: configuration -- a memory-bound decoder step is never fitted, nor its compute pooled, with the chain
    compute: str = "matmul"


def path_key(r: dict[str, Any]) -> PathKey:
    return PathKey(str(r.get("impl")), _s(r.get("kernel")), bool(r.get("prefetch")),
                   _s(r.get("ids_on")) or "device", _s(r.get("graph")) or "eager",
                   int(num(r.get("sm_limit")) or 0), int(num(r.get("cache_rows")) or 0),
                   int(num(r.get("gather_threads")) or 0), _s(r.get("timer")), _s(r.get("ids")),
                   "" if device_resident(r) else _s(r.get("host_alloc")), compute_kind(r))


def path_label(key: Sequence) -> str:
    impl, kernel, _pf, _ids, _graph, sm, cache, threads = tuple(key)[:8]
    name = impl if not kernel else f"{impl} · {kernel}"
    if sm:
        name += f" · {sm} SMs"
    if cache:
        name += f" · cache {cache} rows"
    if threads:
        name += f" · {threads} threads"
    return name


def path_id(key: PathKey) -> str:
    """The path in words, every part of its key named."""
    out = f"{path_label(key)} | prefetch {'on' if key.prefetch else 'off'} | ids {key.ids_on} | {key.graph}"
    out += f" | {key.timer or 'timer ?'} | {key.ids or 'ids ?'}"
    out += f" | alloc {key.host_alloc}" if key.host_alloc else ""
    return out + (f" | {key.compute}" if key.compute != "matmul" else "")


@dataclass
class Point:
    """One measured decode step, as the model reads it."""

    key: PathKey
    case_id: str
    run_id: str
    rows: int  # tokens x heads
    tokens: int
    table_bytes: int
    row_bytes: int
    compute_us: float
    compute_ms: float
    lookup_ms: float
    step_ms: float
    resident: bool
    host_gather: bool  # rows gathered by host cores (a host_gather ceiling applies)
    #: a resident event-timed step's host-sync twin (``step_host_sync_ms``): its step on the host
    #: clock, its compute and lookup as the events measured them
    host_twin: bool = False


def step_points(records: Iterable[dict[str, Any]]) -> list[Point]:
    """The model's points: ok GPU decode steps of one rank with step, compute and lookup times; the
    newest run's measurement of each case (run ids sort by date).  A resident step timed by CUDA
    events that also recorded ``step_host_sync_ms`` gives a second point on the ``host_sync``
    timer (its host-sync twin: the resident step a host-timed path is compared with)."""
    newest: dict[str, dict[str, Any]] = {}
    for r in sorted(records, key=lambda r: str(r.get("_run_id", ""))):
        if (r.get("status") != "ok" or r.get("kind") != "step" or r.get("mode", "gpu") == "functional"
                or int(num(r.get("world_size")) or 1) != 1):
            continue
        if None in (num(r.get("step_ms")), num(r.get("compute_ms")), num(r.get("lookup_ms")),
                    num(r.get("table_bytes")), num(r.get("num_tokens")), num(r.get("num_heads"))):
            continue
        newest[str(r.get("case_id"))] = r
    out, twins = [], []
    for r in newest.values():
        base = Point(key=path_key(r), case_id=str(r.get("case_id")), run_id=str(r.get("_run_id", "")),
                     rows=int(num(r.get("rows")) or num(r["num_tokens"]) * num(r["num_heads"])),
                     tokens=int(num(r["num_tokens"])), table_bytes=int(num(r["table_bytes"])),
                     row_bytes=int(num(r.get("row_bytes")) or 0), compute_us=float(num(r.get("compute_us")) or 0),
                     compute_ms=float(r["compute_ms"]), lookup_ms=float(r["lookup_ms"]),
                     step_ms=float(r["step_ms"]), resident=device_resident(r),
                     host_gather=_host_gather(r))
        out.append(base)
        # the resident step's other figures (record.resident_figures: its host-sync twin, the full
        # graph of a breakable step on either timer), each a point of its own graph mode and timer,
        # so that the HBM row a pinned option is held against is the one record.Peers holds it against
        for f in resident_figures(r) if base.key.timer else ():  # a record that names its timer
            if (f.graph, f.timer) != (base.key.graph, base.key.timer):
                what = "/".join(x for x, own in ((f.graph, base.key.graph), (f.timer, base.key.timer)) if x != own)
                twins.append(replace(base, key=base.key._replace(graph=f.graph, timer=f.timer), host_twin=True,
                                     case_id=f"{base.case_id}#{what}", step_ms=f.ms))
    measured_keys = {p.key for p in out}
    return out + [t for t in twins if t.key not in measured_keys]


def _host_gather(r: dict[str, Any]) -> bool:
    """Rows moved by host cores / copy engines (the paths with no GPU gather kernel), not by a
    GPU kernel reading host memory."""
    return str(r.get("impl")) in KERNEL_FREE_IMPLS or num(r.get("host_gather_ceiling_ms")) is not None


# ------------------------------------------------------------------ machine rates

@dataclass
class Rates:
    """What the model takes from the machine, each with where it came from."""

    delta_kernel: float = DEFAULT_DELTA
    delta_host: float = DEFAULT_DELTA
    h2d_gbps: float | None = None
    reduce_alpha_ms: float | None = None
    reduce_busbw_gbps: float | None = None
    reduce_points: int = 0
    threads_fit: tuple[float, float, float] | None = None  # s, p, o of t(n) = s + p/n + o n (ms)
    measured_threads: int = 16
    # the floors' bandwidths: the fastest any run measured (a lower bound on every lookup)
    floor_h2d_gbps: float | None = None
    floor_d2d_gbps: float | None = None
    floor_host_gather_rows_per_s: dict[int, float] = field(default_factory=dict)  # by row bytes
    floor_host_gather_gbps: float | None = None  # any row size: the fallback
    sources: dict[str, str] = field(default_factory=dict)

    def thread_factor(self, cores: int) -> float:
        """The host gather's time at ``cores`` threads over its time at the measured thread count."""
        n0 = self.measured_threads
        if self.threads_fit:
            s, p, o = self.threads_fit
            return (s + p / cores + o * cores) / (s + p / n0 + o * n0)
        return n0 / cores  # assumption: linear in cores


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def _median_slope(rates: "Rates", name: str, sweeps: dict[Any, dict[int, float]], what: str, assumed: str) -> None:
    """``rates.<name>``: the median (>= 0) of the ms-vs-table-bytes slopes of ``sweeps`` with two
    table sizes or more, its source named; left as assumed (``assumed`` says what) where none has."""
    slopes = [_slope(list(g), list(g.values())) for g in sweeps.values() if len(g) >= 2]
    if slopes:
        setattr(rates, name, max(0.0, statistics.median(slopes)))
        rates.sources[name] = f"median of {len(slopes)} {what}"
    else:
        rates.sources[name] = assumed


def calibrate(records: Iterable[dict[str, Any]], metas: Iterable[dict[str, Any]]) -> Rates:
    """Fit the machine rates from lookup records and meta.json ceilings."""
    records = list(records)
    metas = list(metas)
    rates = Rates()
    # row rate vs table size, pinned kernel paths: log(time per row) vs log(table) at fixed rows
    groups: dict[tuple, dict[int, float]] = {}
    for r in records:
        if (r.get("status") == "ok" and r.get("kind") == "lookup" and r.get("mode", "gpu") != "functional"
                and int(num(r.get("world_size")) or 1) == 1 and not device_resident(r) and not r.get("prefetch")
                and not _host_gather(r) and (num(r.get("table_bytes")) or 0) >= 4 * GIB
                and num(r.get("median_ms"))):
            # one sweep: one run, one path, one id workload, one row count
            k = (r.get("_run_id"), str(r.get("impl")), _s(r.get("kernel")), num(r.get("rows")),
                 num(r.get("row_bytes")), _s(r.get("host_alloc")), _s(r.get("ids")), _s(r.get("ids_on")))
            groups.setdefault(k, {})[int(r["table_bytes"])] = float(r["median_ms"])
    _median_slope(rates, "delta_kernel", groups, "table-size sweeps of pinned lookups (>= 4 GiB)",
                  "assumed: 32 -> 28 Mrow/s from 32 to 100 GiB (docs/host-allocation.md)")
    # host gather vs table size, and the thread count it was measured at (meta ceilings)
    hg: dict[tuple, dict[int, float]] = {}
    for m in metas:
        for v in ((m.get("ceilings") or {}).get("host_gather") or {}).values():
            if isinstance(v, dict) and num(v.get("ms")) and num(v.get("table_bytes")):
                hg.setdefault((v.get("rows"), v.get("row_bytes"), v.get("threads")), {})[int(v["table_bytes"])] = \
                    float(v["ms"])
                rates.measured_threads = int(num(v.get("threads")) or rates.measured_threads)
                rows, rb = num(v.get("rows")), num(v.get("row_bytes"))
                if rows and rb:
                    rps = rows / (float(v["ms"]) * 1e-3)
                    fhg = rates.floor_host_gather_rows_per_s
                    fhg[int(rb)] = max(fhg.get(int(rb), 0.0), rps)
                    rates.floor_host_gather_gbps = max(rates.floor_host_gather_gbps or 0.0, rps * rb / 1e9)
    _median_slope(rates, "delta_host", hg, "table-size pairs of the host_gather ceiling",
                  "assumed as for pinned kernels (no host_gather ceiling at two table sizes)")
    if rates.floor_host_gather_rows_per_s:
        rates.sources["floor_host_gather"] = "the fastest host_gather ceiling (rows/s) of the runs' meta.json"
    h2d = [num((m.get("ceilings") or {}).get("h2d_gbps")) for m in metas]
    h2d = [v for v in h2d if v]
    if h2d:
        rates.h2d_gbps = statistics.median(h2d)
        rates.floor_h2d_gbps = max(h2d)
        rates.sources["h2d_gbps"] = f"median h2d_gbps of {len(h2d)} runs' ceilings (the floor: their fastest)"
    d2d = [num((m.get("ceilings") or {}).get("d2d_gbps")) for m in metas]
    d2d = [v for v in d2d if v]
    if d2d:
        rates.floor_d2d_gbps = max(d2d)
        rates.sources["floor_d2d_gbps"] = f"the fastest d2d_gbps of {len(d2d)} runs' ceilings"
    # all-reduce alpha-beta: reduce_ms = alpha + reduce_bytes * 2(n-1)/n / busbw
    xs, ys = [], []
    for r in records:
        b, t, n = num(r.get("reduce_bytes")), num(r.get("reduce_ms")), num(r.get("etp"))
        if r.get("status") == "ok" and b and t and n and n > 1:
            xs.append(b * 2 * (n - 1) / n)
            ys.append(t)
    if len(set(xs)) >= 2:
        slope, alpha = np.polyfit(xs, ys, 1)
        if slope > 0:
            rates.reduce_alpha_ms, rates.reduce_busbw_gbps = max(0.0, float(alpha)), 1e-6 / float(slope)
            rates.reduce_points = len(xs)
            rates.sources["reduce"] = f"least squares on {len(xs)} ETP lookups' reduce_ms vs reduce_bytes"
    if rates.reduce_busbw_gbps is None:
        bw = [num(v) for m in metas for k, v in (m.get("ceilings") or {}).items() if k.startswith("allreduce_busbw")]
        bw = [v for v in bw if v]
        if bw:
            rates.reduce_busbw_gbps = statistics.median(bw)
            rates.sources["reduce"] = "busbw from the allreduce_busbw ceilings; no alpha measured (no ETP lookups)"
    # host-gather threads: t(n) = s + p/n + o n on lookups with gather_threads varied
    tg: dict[tuple, dict[int, float]] = {}
    for r in records:
        if (r.get("status") == "ok" and r.get("kind") == "lookup" and num(r.get("host_gather_ceiling_ms"))
                and num(r.get("median_ms"))):
            n = int(num(r.get("gather_threads")) or 0) or rates.measured_threads
            tg.setdefault((r.get("impl"), num(r.get("rows")), num(r.get("table_bytes")), r.get("ids_on")), {})[n] = \
                float(r["median_ms"])
    best = max(tg.values(), key=len, default={})
    if len(best) >= 3:
        ns = np.array(sorted(best), dtype=float)
        A = np.stack([np.ones_like(ns), 1 / ns, ns], axis=1)
        sol, *_ = np.linalg.lstsq(A, np.array([best[int(n)] for n in ns]), rcond=None)
        rates.threads_fit = tuple(float(v) for v in sol)
        rates.sources["threads"] = f"t(n) = s + p/n + o n on a host-gather lookup at {len(best)} thread counts"
    else:
        rates.sources["threads"] = "assumed: the host gather's per-row time falls linearly with host cores"
    return rates


# ------------------------------------------------------------------ per-path fit

def bounded_fit(X: Sequence[Sequence[float]], y: Sequence[float], free: Sequence[int] = ()) -> list[float]:
    """Least squares ``X · b ≈ y`` with every coefficient ``>= 0`` but those in ``free`` (the
    intercepts): :func:`scipy.optimize.lsq_linear`, bounded-variable least squares."""
    A = np.asarray(X, dtype=float)
    lower = np.zeros(A.shape[1])
    lower[list(free)] = -np.inf
    return [float(v) for v in lsq_linear(A, np.asarray(y, dtype=float), bounds=(lower, np.inf), method="bvls").x]


def _line(xs: Sequence[float], ys: Sequence[float], intercept_free: bool) -> tuple[float, float]:
    """``a + b x`` with ``b >= 0`` (and ``a >= 0`` unless ``intercept_free``); one distinct x:
    ``a`` = the mean, ``b = 0`` (no slope measured, none assumed: the floors bound the rest)."""
    if len(set(xs)) < 2:
        m = statistics.fmean(ys)
        return (m if intercept_free else max(0.0, m)), 0.0
    a, b = bounded_fit([[1.0, x] for x in xs], ys, free=(0,) if intercept_free else ())
    return a, b


@dataclass
class ComputeFit:
    c0: float
    c1: float  # ms per us of compute (>= 0)
    c2: float  # ms per row (>= 0)
    n: int
    source: str


def compute_fit(points: Sequence[Point], key: PathKey) -> ComputeFit | None:
    """compute_ms = c0 + c1 compute_us + c2 rows (c1, c2 >= 0) over the steps of ``key``'s timer,
    graph mode and id placement; else its timer and graph mode; else its timer (never another
    timer's, nor a host-sync twin's, whose compute the events timed).  None: fewer than 4 such
    steps at 2+ compute lengths, or ``key`` the path of host-sync twins (it fits its own compute
    -- c0 + c1 compute_us + c2 rows, bounded -- on its event-timed compute; its residual takes the
    host clock's extra)."""
    if any(p.host_twin and p.key == key for p in points):
        return None
    points = [p for p in points if not p.host_twin and p.key.compute == key.compute]  # one compute kind
    levels = (("timer, graph, ids placement", lambda p: (p.key.timer, p.key.graph, p.key.ids_on)
               == (key.timer, key.graph, key.ids_on)),
              ("timer, graph", lambda p: (p.key.timer, p.key.graph) == (key.timer, key.graph)),
              ("timer", lambda p: p.key.timer == key.timer))
    for name, same in levels:
        ps = [p for p in points if same(p)]
        if len(ps) >= 4 and len({p.compute_us for p in ps}) >= 2:
            c0, c1, c2 = bounded_fit([[1.0, p.compute_us, p.rows] for p in ps], [p.compute_ms for p in ps], free=(0,))
            return ComputeFit(c0, c1, c2, len(ps), f"pooled over {len(ps)} steps of the same {name}")
    return None


def compute_fits(points: Sequence[Point]) -> dict[tuple, ComputeFit | None]:
    """:func:`compute_fit` for every (timer, graph, ids placement, compute kind) of ``points``."""
    out: dict[tuple, ComputeFit | None] = {}
    for p in points:
        k = (p.key.timer, p.key.graph, p.key.ids_on, p.key.compute)
        if k not in out:
            out[k] = compute_fit(points, p.key)
    return out


@dataclass
class PathFit:
    key: tuple
    c0: float
    c1: float
    c2: float  # compute_ms per row (the consumer of the rows)
    l0: float
    l1: float  # ms per row at the reference table
    e0: float
    e1: float
    n: int
    tables: tuple[int, int]
    rows: tuple[int, int]
    computes: tuple[float, float]
    resident: bool
    host_gather: bool
    prefetch: bool
    row_bytes: int
    #: (rows, table_bytes, lookup_ms) of every fitted step: the measured floor
    measured: tuple[tuple[int, int, float], ...] = ()
    compute_source: str = ""

    @property
    def cached(self) -> bool:
        """A hot-row cache in HBM serves part of the rows."""
        return bool(len(self.key) > 6 and self.key[6]) or (self.key and self.key[0] == "pinned_hot_cache")


def _delta(p: Point | PathFit, rates: Rates) -> float:
    return 0.0 if p.resident else (rates.delta_host if p.host_gather else rates.delta_kernel)


def _eff_rows(rows: float, table: float, delta: float) -> float:
    return rows * (table / REF_TABLE) ** delta


def fit_path(points: Sequence[Point], rates: Rates, compute: ComputeFit | None) -> PathFit:
    """Fit one path on its ``points`` (one key); ``compute``: the pooled compute fit (None: the
    path's own line, c2 = 0)."""
    p0 = points[0]
    key = p0.key
    cu = [p.compute_us for p in points]
    if compute is not None:
        c0, c1, c2, csrc = compute.c0, compute.c1, compute.c2, compute.source
    elif len(set(cu)) >= 2 and len({p.rows for p in points}) >= 2:  # not pooled: this path's own plane
        c0, c1, c2 = bounded_fit([[1.0, p.compute_us, p.rows] for p in points], [p.compute_ms for p in points],
                                 free=(0,))
        csrc = f"the path's own {len(points)} steps"
    else:  # its own line (one row count or one compute length)
        (c0, c1), c2 = _line(cu, [p.compute_ms for p in points], intercept_free=True), 0.0
        if len(set(cu)) < 2:
            c0, c2 = _line([p.rows for p in points], [p.compute_ms for p in points], intercept_free=True)
        csrc = f"the path's own {len(points)} steps"
    delta = _delta(p0, rates)
    eff = [_eff_rows(p.rows, p.table_bytes, delta) for p in points]
    l0, l1 = _line(eff, [p.lookup_ms for p in points], intercept_free=False)
    fit = PathFit(key, c0, c1, c2, l0, l1, 0.0, 0.0, len(points),
                  (min(p.table_bytes for p in points), max(p.table_bytes for p in points)),
                  (min(p.rows for p in points), max(p.rows for p in points)), (min(cu), max(cu)),
                  p0.resident, p0.host_gather, bool(key[2]), p0.row_bytes,
                  tuple(sorted((p.rows, p.table_bytes, p.lookup_ms) for p in points)), csrc)
    resid = [p.step_ms - p.compute_ms - _base_exposed(fit, l0 + l1 * e, max(0.0, c0 + c1 * p.compute_us + c2 * p.rows))
             for p, e in zip(points, eff)]
    fit.e0, fit.e1 = _line([p.rows for p in points], resid, intercept_free=True)
    return fit


def _base_exposed(fit: PathFit, lookup_ms: float, compute_ms: float) -> float:
    return max(0.0, lookup_ms - compute_ms) if fit.prefetch else lookup_ms


@dataclass
class Prediction:
    step_ms: float
    compute_ms: float
    lookup_ms: float
    exposed_ms: float
    reduce_ms: float
    outside: list[str]  # where the asked point lies outside what the path was fitted on
    extrapolated: bool = False  # rows outside the path's measured row range
    floors: list[str] = field(default_factory=list)  # the floors that raised this prediction
    lookup_floor_ms: float = 0.0  # the larger of the physical and the measured floor


def reduce_ms(rates: Rates, etp: int, message_bytes: float, nodes: int = 1, link_gbps: float | None = None,
              link_latency_us: float = 0.0) -> float:
    """The ETP all-reduce: alpha + bytes * 2(n-1)/n / busbw (over nodes: the link bounds busbw and
    adds 2 (nodes-1) link latencies)."""
    if etp <= 1:
        return 0.0
    if rates.reduce_busbw_gbps is None:
        raise ValueError("no all-reduce was measured (run the topology suite on 2+ GPUs)")
    alpha = rates.reduce_alpha_ms or 0.0
    bw = rates.reduce_busbw_gbps
    if nodes > 1:
        if link_gbps:
            bw = min(bw, link_gbps)
        alpha += 2 * (nodes - 1) * link_latency_us * 1e-3
    return alpha + message_bytes * 2 * (etp - 1) / etp / (bw * 1e6)


def physical_floor(fit: PathFit, rates: Rates, rows: int, host_cores: int | None = None) -> tuple[float, str]:
    """(ms, in words): ``rows · row_bytes`` over the fastest measured ceiling that binds the path
    (0 where the runs carry none)."""
    nbytes = rows * fit.row_bytes
    cands: list[tuple[float, str]] = []
    if fit.resident or fit.cached:
        if rates.floor_d2d_gbps:
            cands.append((nbytes / (rates.floor_d2d_gbps * 1e6), f"d2d {rates.floor_d2d_gbps:.0f} GB/s"))
    else:
        if rates.floor_h2d_gbps:
            cands.append((nbytes / (rates.floor_h2d_gbps * 1e6), f"h2d {rates.floor_h2d_gbps:.1f} GB/s"))
        if fit.host_gather:
            rps = rates.floor_host_gather_rows_per_s.get(fit.row_bytes)
            if rps:
                t, what = rows / rps * 1e3, f"host-gather ceiling {rps / 1e6:.0f} Mrow/s"
            elif rates.floor_host_gather_gbps:
                t, what = nbytes / (rates.floor_host_gather_gbps * 1e6), \
                    f"host-gather ceiling {rates.floor_host_gather_gbps:.1f} GB/s"
            else:
                t, what = 0.0, ""
            if t and host_cores and host_cores > rates.measured_threads:  # more cores may gather faster
                t *= min(1.0, rates.thread_factor(host_cores))
                what += f" x the thread fit at {host_cores} cores"
            if t:
                cands.append((t, what))
    return max(cands, default=(0.0, ""))


def predict(fit: PathFit, rates: Rates, *, rows: int, table_bytes: int, compute_us: float, etp: int = 1,
            nodes: int = 1, link_gbps: float | None = None, link_latency_us: float = 0.0,
            host_cores: int | None = None) -> Prediction:
    outside = []
    shard = table_bytes / etp
    if not fit.tables[0] / TABLE_SLACK <= shard <= fit.tables[1] * TABLE_SLACK:
        outside.append(f"table {shard / GIB:.1f} GiB per rank (measured {fit.tables[0] / GIB:.1f}–"
                       f"{fit.tables[1] / GIB:.1f} GiB)")
    extrapolated = not fit.rows[0] <= rows <= fit.rows[1]
    if extrapolated:
        outside.append(f"{rows} rows (measured {fit.rows[0]}–{fit.rows[1]})")
    if not fit.computes[0] <= compute_us <= fit.computes[1]:
        outside.append(f"compute {compute_us:g} us (measured {fit.computes[0]:g}–{fit.computes[1]:g})")
    per_row = fit.l1 * (shard / REF_TABLE) ** _delta(fit, rates)
    if fit.host_gather and host_cores:
        per_row *= rates.thread_factor(host_cores)
        outside.append(f"{host_cores} host cores (measured {rates.measured_threads} threads)")
    red = reduce_ms(rates, etp, etp * rows * fit.row_bytes, nodes, link_gbps, link_latency_us) if etp > 1 else 0.0
    if etp > 1:
        outside.append(f"ETP {etp}" + (f" over {nodes} nodes" if nodes > 1 else ""))
    floors = []
    fitted = fit.l0 + per_row * rows
    phys, phys_what = physical_floor(fit, rates, rows, host_cores)
    seen = [ms for r, t, ms in fit.measured if r <= rows and t <= shard * TABLE_SLACK]
    seen_floor = min(seen) if seen and not (fit.host_gather and host_cores and host_cores > rates.measured_threads) \
        else 0.0
    local = max(fitted, phys, seen_floor)
    if local > fitted:
        floors.append(f"lookup at its physical floor ({rows} rows x {fit.row_bytes} B over the {phys_what})"
                      if phys >= seen_floor else
                      f"lookup at the smallest it measured at <= {rows} rows ({seen_floor:.3f} ms)")
    compute = fit.c0 + fit.c1 * compute_us + fit.c2 * rows
    if compute < 0:
        floors.append("compute at 0")
        compute = 0.0
    # the ETP all-reduce runs in finalize, on the main stream after the compute: a prefetch cannot
    # hide it, so it adds to the exposed time of every path (the resident one included)
    exposed = _base_exposed(fit, local, compute) + fit.e0 + fit.e1 * rows
    if exposed < 0:
        floors.append("step at its compute (a step is never shorter than its compute)")
        exposed = 0.0
    exposed += red
    return Prediction(compute + exposed, compute, local + red, exposed, red, outside, extrapolated, floors,
                      max(phys, seen_floor))


# ------------------------------------------------------------------ the model and its error

@dataclass
class LooCase:
    case_id: str
    path: str
    measured_ms: float
    predicted_ms: float
    run_id: str = ""
    timer: str = ""
    graph: str = ""

    @property
    def rel_err(self) -> float:
        return abs(self.predicted_ms - self.measured_ms) / self.measured_ms


@dataclass
class ErrorStats:
    n: int
    median_pct: float | None
    worst_pct: float | None
    worst_case: str = ""
    what: str = "leave-one-out"  # | "extrapolation"
    scope: str = "path"  # | "all paths" (the path's own was not measured)

    def text(self) -> str:
        if not self.n:
            return f"{self.what} error not measured"
        scope = "" if self.scope == "path" else f", {self.scope}"
        return f"{self.what} error median {self.median_pct:.0f} %, worst {self.worst_pct:.0f} % ({self.n} steps{scope})"


def _stats(cases: Sequence[LooCase], what: str = "leave-one-out", scope: str = "path") -> ErrorStats:
    if not cases:
        return ErrorStats(0, None, None, what=what, scope=scope)
    errs = [c.rel_err for c in cases]
    worst = max(cases, key=lambda c: c.rel_err)
    return ErrorStats(len(cases), 100 * statistics.median(errs), 100 * max(errs), worst.case_id, what, scope)


@dataclass
class Model:
    rates: Rates
    fits: dict[tuple, PathFit]
    points: list[Point]
    loo_cases: list[LooCase] = field(default_factory=list)
    loo_by_path: dict[str, ErrorStats] = field(default_factory=dict)
    loo_overall: ErrorStats = field(default_factory=lambda: ErrorStats(0, None, None))
    extrap_cases: list[LooCase] = field(default_factory=list)
    extrap_by_path: dict[str, ErrorStats] = field(default_factory=dict)
    extrap_overall: ErrorStats = field(default_factory=lambda: ErrorStats(0, None, None, what="extrapolation"))

    def error(self, key: tuple) -> ErrorStats:
        """The path's leave-one-out error; the overall one (so marked) where it was not measured."""
        own = self.loo_by_path.get(path_id(key))
        return own or ErrorStats(**{**asdict(self.loo_overall), "scope": "all paths"})

    def extrap_error(self, key: tuple) -> ErrorStats:
        """The path's extrapolation error; the overall one (so marked) where it was not measured."""
        own = self.extrap_by_path.get(path_id(key))
        return own or ErrorStats(**{**asdict(self.extrap_overall), "scope": "all paths"})

    def summary(self) -> dict[str, Any]:
        return {"rates": asdict(self.rates), "loo_overall": asdict(self.loo_overall),
                "extrap_overall": asdict(self.extrap_overall),
                "loo_by_path": {k: asdict(v) for k, v in sorted(self.loo_by_path.items())},
                "extrap_by_path": {k: asdict(v) for k, v in sorted(self.extrap_by_path.items())},
                "paths_fitted": len(self.fits), "steps_fitted": len(self.points)}


def _groups(points: Sequence[Point]) -> dict[tuple, list[Point]]:
    g: dict[tuple, list[Point]] = {}
    for p in points:
        g.setdefault(p.key, []).append(p)
    return g


def fit(points: Sequence[Point], rates: Rates) -> dict[tuple, PathFit]:
    computes = compute_fits(points)
    return {k: fit_path(ps, rates, computes[(k.timer, k.graph, k.ids_on, k.compute)]) for k, ps in _groups(points).items()}


def config_group(p: Point) -> tuple:
    """The unit :func:`leave_one_out` leaves out: one (path, table size, compute) configuration,
    all its token counts."""
    return (p.key, p.table_bytes, p.compute_us)


def _twin(p: Point) -> tuple:
    """A configuration group but for the id distribution and the host allocation."""
    return (p.key._replace(ids="", host_alloc=""), p.table_bytes, p.compute_us)


def _case(p: Point, pred: Prediction) -> LooCase:
    return LooCase(p.case_id, path_id(p.key), p.step_ms, pred.step_ms, p.run_id, p.key.timer, p.key.graph)


def _predict_point(f: PathFit, rates: Rates, p: Point) -> Prediction:
    return predict(f, rates, rows=p.rows, table_bytes=p.table_bytes, compute_us=p.compute_us)


def leave_one_out(points: Sequence[Point], rates: Rates) -> list[LooCase]:
    """Leave out one configuration group (:func:`config_group`: a path at one table size and one
    compute, every token count) at a time: refit its path on the path's other groups and the
    compute on every step but the group and its twins (:func:`_twin`: the same but for ``ids`` /
    ``host_alloc``), and predict each left-out step.  Paths measured in one group only cannot be
    checked this way and are left out."""
    out = []
    for k, ps in _groups(points).items():
        groups: dict[tuple, list[Point]] = {}
        for p in ps:
            groups.setdefault(config_group(p), []).append(p)
        if len(groups) < 2:
            continue
        for g, held in groups.items():
            rest = [p for p in ps if config_group(p) != g]
            twins = {_twin(h) for h in held}
            f = fit_path(rest, rates, compute_fit([p for p in points if _twin(p) not in twins], k))
            out += [_case(h, _predict_point(f, rates, h)) for h in held]
    return out


def extrapolation_holdout(points: Sequence[Point], rates: Rates) -> list[LooCase]:
    """Leave out each path's largest measured row count (every table and compute at it): refit the
    path on its smaller row counts and the compute on every step of fewer rows (no step at or past
    the held-out rows informs the fit), and predict the held-out steps.  Paths measured at one row
    count are left out."""
    out = []
    for k, ps in _groups(points).items():
        top = max(p.rows for p in ps)
        rest = [p for p in ps if p.rows < top]
        if not rest:
            continue
        f = fit_path(rest, rates, compute_fit([p for p in points if p.rows < top], k))
        out += [_case(h, _predict_point(f, rates, h)) for h in ps if h.rows == top]
    return out


def _by_path(cases: Sequence[LooCase], what: str) -> dict[str, ErrorStats]:
    by: dict[str, list[LooCase]] = {}
    for c in cases:
        by.setdefault(c.path, []).append(c)
    return {k: _stats(v, what) for k, v in by.items()}


def build_model(records: Sequence[dict[str, Any]], metas: Sequence[dict[str, Any]], *,
                row_bytes: int | None = None, loo: bool = True) -> Model:
    """Calibrate and fit on ``records`` (each with ``_run_id``); ``row_bytes`` keeps only steps of
    that row size.  ``loo``: measure the leave-one-out and the extrapolation error too."""
    rates = calibrate(records, metas)
    points = [p for p in step_points(records) if row_bytes is None or p.row_bytes == row_bytes]
    m = Model(rates, fit(points, rates), points)
    if loo:
        m.loo_cases = leave_one_out(points, rates)
        m.loo_by_path = _by_path(m.loo_cases, "leave-one-out")
        m.loo_overall = _stats(m.loo_cases, "leave-one-out", "all paths")
        m.extrap_cases = extrapolation_holdout(points, rates)
        m.extrap_by_path = _by_path(m.extrap_cases, "extrapolation")
        m.extrap_overall = _stats(m.extrap_cases, "extrapolation", "all paths")
    return m


def error_markdown(m: Model) -> str:
    """The model's two errors as a markdown table: all steps, per run, per timer, per graph mode."""
    def row(name: str, keep) -> str:
        cells = []
        for cases in (m.loo_cases, m.extrap_cases):
            st = _stats([c for c in cases if keep(c)])
            cells.append(f"{st.n} | {st.median_pct:.1f} % | {st.worst_pct:.0f} %" if st.n else "0 | – | –")
        return f"| {name} | {' | '.join(cells)} |"

    cases = m.loo_cases + m.extrap_cases
    lines = ["| steps | LOO n | median | worst | extrapolation n | median | worst |",
             "| --- | --- | --- | --- | --- | --- | --- |", row("**all**", lambda c: True)]
    for attr in ("timer", "graph", "run_id"):
        for v in sorted({getattr(c, attr) for c in cases}):
            lines.append(row(f"{attr} {v}", lambda c, v=v, a=attr: getattr(c, a) == v))
    return "\n".join(lines)


def load_runs(run_dirs: Sequence[str | Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every record (tagged with ``_run_id``) and every meta.json of the run folders."""
    records, metas = [], []
    for d in run_dirs:
        run_id = Path(d).name
        metas.append(load_meta(d))
        for r in load_records(d):
            r["_run_id"] = run_id
            records.append(r)
    return records, metas
