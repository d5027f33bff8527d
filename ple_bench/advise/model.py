"""The what-if model: a decode step's cost for configurations the runs did not measure -- another
table size, **another row shape** (dim x dtype x heads), token counts past the measured ones, ETP
groups, ETP across nodes, more or fewer host cores, **another machine** -- made of the quantities
the suite measures, calibrated on what runs measured, its error measured on held-out shapes, every
prediction bounded below by what is physically possible.

Reads stored records and meta.json ceilings only (never measures).  A *path* is everything that
makes two step records the same configuration but tokens, table, **row shape** and compute length:
impl · kernel, prefetch, ids on host/device, graph mode, SM limit, hot-row cache size, gather
threads, the **timer** (``cuda_event`` and ``host_sync`` figures are never fitted together, nor
compared), the id distribution (``ids``), the host allocation (``host_alloc``; "" for a resident
table) and the **compute kind** (``compute``: the matmul chain, whose length ``compute_us`` the
model fits, or one decoder configuration -- shape, layers, context -- whose measured time is its
own; the two are never fitted together, nor their compute pooled:
:mod:`ple_bench.advise.compute_kind`).  The row shape is not in the key: every shape's steps fit
one path model, and any dim x dtype x heads is predicted from the rows and the bytes it moves.

Every coefficient below is fitted non-negative (bounded least squares,
:func:`scipy.optimize.lsq_linear`) but the compute's and the residual's intercepts.

* **compute** ``C = c0 + c1 · compute_us + c2 · rows (+ c3 · rows · row_bytes)`` -- on
  ``compute_ms`` (the step without its lookup) over every path of the same timer, graph mode and id
  placement (falling back to the same timer and graph mode, then the same timer -- never across
  timers; a path with fewer pooled steps, or a resident step's host-sync twin, fits its own); the
  bytes term only where the pooled steps hold two row sizes or more; never across compute kinds.
* **lookup alone** ``L = fixed + per_row · rows + Σ efficiency_i · rows · seconds_per_row_i`` --
  on the path's ``lookup_ms``.  ``fixed``: launches, polls, graph nodes; ``per_row``: fixed
  per-row work (ids, hashing, the output's write); ``seconds_per_row_i`` the path's rate terms,
  from the runs' own per-case ceilings (:class:`ple_bench.advise.machine.CeilingRates`) at the
  point's table size and row size: a GPU kernel reading a pinned table, the ``random_row``
  ceiling of pinned memory (sorted order for a kernel that reads sorted, the path's ids and
  allocation where measured) -- latency-bound per row (interpolated over table sizes in log-log)
  or ``max(row_bytes, SECTOR_BYTES)`` over the H2D link, the larger; a resident table, the device
  ``random_row`` ceiling, or the row's bytes over the HBM read rate; a hot-row cache, both; a
  host-gather path (CPU gather, copy engines, host graph / flag), the ``host_gather`` ceiling's
  gather part (scaled by the thread fit ``s + p/n + o·n`` of records with ``gather_threads``
  varied) and the row's bytes over ``h2d_gbps``.  ``efficiency`` is how far the path is from the
  ceiling (1: at it).  The per-row term is fitted only where the path's steps hold two table or
  row sizes (else it cannot be told from the rate term).
* **another machine** (:class:`ple_bench.advise.machine.Machine`): each rate term is scaled by the
  measured figure over the target's (:meth:`Machine.factors`): pinned kernels by the H2D rate and
  (fewer SMs) the SM count, resident kernels by the HBM read rate, host gathers by the host-gather
  rate and the thread fit at the target's host cores, host copies by the H2D rate.
* **lookup floors** -- ``L`` is never below (a) the path's physical floor, ``rows · row_bytes``
  over the fastest measured ceiling that binds it (the fastest over all runs' meta.json, so the
  floor is a lower bound; the target machine's where one is given): host-gather paths the
  ``host_gather`` ceiling's fastest row rate (rows/s: a larger row is never cheaper per row) and
  ``h2d_gbps``; pinned kernels ``h2d_gbps``; resident tables and hot-row caches ``d2d_gbps``;
  nor (b) the smallest lookup the path measured at fewer or equal rows of no more bytes on a table
  no larger (not on another machine, nor with more host cores than measured).
* **exposed** -- serial (prefetch off): ``L``; prefetch on: ``max(0, L − C)`` (what the compute
  cannot hide); plus the path's own measured residual ``e0 + e1 · rows`` (launch, sync, the side
  stream's competition for SMs), never below 0 (a step is never shorter than its compute).
* **ETP n** (tp 1: n replicas share one table split in n): each rank reads a shard of
  ``table / n`` (the same expected rows per rank -- an assumption), plus the all-reduce of
  ``n · rows · row_bytes`` bytes, ``alpha + bytes · 2(n−1)/n / busbw`` with alpha and busbw fitted
  on the runs' ETP lookup records.  Across ``nodes`` with an inter-node link (``link_gbps``,
  ``link_latency_us``): busbw ``min(busbw, link_gbps)`` and alpha plus ``2 (nodes − 1) ·
  link_latency``.  The reduce runs in finalize after the compute: no prefetch hides it.

Step = C + exposed.  A prediction that a floor raised says which (:attr:`Prediction.floors`); one
at rows outside the path's measured row range is *extrapolated* (:attr:`Prediction.extrapolated`).

Its error is measured three ways (:func:`error_markdown` prints them):

* :func:`shape_holdout` -- **the headline**: one whole shape (table size x row bytes x heads) left
  out at a time, every path and the compute refitted on the other shapes, the held-out steps
  predicted.  ``strict``: the held-out shape's ceilings are left out of meta.json too (a shape no
  run ever touched; without it, the shape's ceilings -- seconds of a cold run -- are known).
* :func:`extrapolation_holdout` -- each path's largest measured row count left out (at every
  table, shape and compute), the path refitted on its smaller row counts, the held-out steps
  predicted: the error of a prediction past the measured range.
* :func:`leave_one_out` -- by configuration group (one path at one table, row shape and compute,
  every token count; with its twins of another id distribution or allocation).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import numpy as np
from scipy.optimize import lsq_linear

from ..record import Record, as_record, device_resident, resident_figures
from .compute_kind import compute_kind
from .machine import CeilingRates, Machine, measured_machine
from ..impl_facts import facts_of, impls_where
from ..results import load_records
from ..run_meta import RunMeta, as_meta

GIB = 1 << 30
#: a table within this factor of a measured one counts as measured (47.7 GiB vs 51.2 GB)
TABLE_SLACK = 1.05
#: host-side paths: rows gathered by host cores or copied by copy engines (no GPU gather kernel), as
#: the backends declare them (ple_bench.impl_facts)
HOST_IMPLS = impls_where(kernel_free=True)
#: the rate terms of each kind of lookup (:func:`rate_columns`), in column order
RATE_TERMS = {"device": ("device rows",), "pinned": ("pinned rows",), "cached": ("device rows", "pinned rows"),
              "host": ("host gather", "h2d copy")}


def _warms_cache(impl: Any) -> bool:
    """The built-in impl declares a hot-row cache in HBM (:mod:`ple_bench.impl_facts`)."""
    facts = facts_of(impl)
    return bool(facts and facts.warms_cache)


def _s(v: Any) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


class PathKey(NamedTuple):
    """What makes two step records the same path (everything but tokens, table, row shape and
    compute)."""

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
    #: the host->device link shared with a concurrent copy (``h2d_background``: a machine condition)
    link_shared: bool = False


def path_key(r: Mapping[str, Any]) -> PathKey:
    r = as_record(r)
    return PathKey(str(r.impl), _s(r.kernel), bool(r.prefetch), _s(r.ids_on) or "device", _s(r.graph) or "eager",
                   int(r.sm_limit or 0), int(r.cache_rows or 0), int(r.gather_threads or 0), _s(r.timer), _s(r.ids),
                   "" if device_resident(r) else _s(r.host_alloc), compute_kind(r), bool(r.h2d_background))


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
    out += " | link shared" if key.link_shared else ""
    return out + (f" | {key.compute}" if key.compute != "matmul" else "")


def lookup_kind(r: dict[str, Any]) -> str:
    """How a path moves its rows: ``device`` (a kernel reading HBM), ``pinned`` (a GPU kernel
    reading pinned host memory), ``cached`` (a hot-row cache in HBM, the rest pinned), ``host``
    (host cores gather, a copy moves them: the declared ``lookup_mechanism`` host_gather /
    host_copy, else the impl)."""
    r = as_record(r)
    if device_resident(r):
        return "device"
    if int(r.cache_rows or 0) or _warms_cache(r.impl):
        return "cached"
    mech = _s(r.lookup_mechanism)
    if mech in ("host_gather", "host_copy") or (not mech and str(r.impl) in HOST_IMPLS):
        return "host"
    return "pinned"


def reads_sorted(key: Sequence) -> bool:
    """A kernel that reads its rows in ascending id order (the dedup kernels): its ceiling is the
    sorted random-row gather."""
    return str(tuple(key)[1]).startswith("dedup")


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
    heads: int = 0
    kind: str = ""  # lookup_kind
    #: how many runs the step, compute and lookup are the median over (:func:`step_points`)
    runs: int = 1

    @property
    def shape(self) -> tuple[float, int, int]:
        """What :func:`shape_holdout` leaves out together: (table GiB to 0.1, row bytes, heads)."""
        return (round(self.table_bytes / GIB, 1), self.row_bytes, self.heads)


def _config(r: Record) -> tuple:
    """What must match for two runs' records of one case to be pooled: the path and the point's
    coordinates (rows, tokens, table, row shape, compute)."""
    return (path_key(r), int(r.rows or r.num_tokens * r.num_heads), int(r.num_tokens), int(r.table_bytes),
            int(r.row_bytes or 0), int(r.num_heads), float(r.compute_us or 0))


def median_run(records: Sequence[Record]) -> Record:
    """The run whose step is the median of the runs' (``step_ms``; the lower of the two middle runs
    for an even count): a point stays one run's measurement (its compute and lookup with its step),
    and slow outliers in no more than half the runs -- a bug's runs archived as evidence (``…-ba4b``,
    ``…-0502``), a condition that did not reproduce -- neither decide nor average into it."""
    ranked = sorted(records, key=lambda x: float(x.step_ms))
    return ranked[(len(ranked) - 1) // 2]


def step_points(records: Iterable[dict[str, Any]]) -> list[Point]:
    """The model's points: ok GPU decode steps of one rank with step, compute and lookup times; each
    case's the **median run's** (:func:`median_run`) over the runs that measured it in the
    configuration of its newest run (:func:`_config`; run ids sort by date; a run's record counts
    once, a repeated record with the mean of its processes; within a run the last record of a case),
    so that one outlying run -- the newest included -- does not decide the fit.  :attr:`Point.run_id`
    is the median run's, :attr:`Point.runs` how many runs it is the median of.  A resident step timed
    by CUDA events that also recorded ``step_host_sync_ms`` gives a second point on the ``host_sync``
    timer (its host-sync twin: the resident step a host-timed path is compared with), its figure the
    median (the lower for an even count) over the same runs."""
    by_case: dict[str, dict[str, Record]] = {}  # case -> run -> its (last) record of the case
    for r in sorted(map(as_record, records), key=lambda r: str(r.get("_run_id", ""))):
        if r.status != "ok" or r.kind != "step" or r.mode == "functional" or int(r.world_size or 1) != 1:
            continue
        if None in (r.step_ms, r.compute_ms, r.lookup_ms, r.table_bytes, r.num_tokens, r.num_heads):
            continue
        runs = by_case.setdefault(str(r.case_id), {})
        runs.pop(str(r.get("_run_id", "")), None)  # re-inserted last: dict order stays by run id
        runs[str(r.get("_run_id", ""))] = r
    out, twins = [], []
    for per_run in by_case.values():
        newest = list(per_run.values())[-1]  # its configuration is the case's
        same = [x for x in per_run.values() if _config(x) == _config(newest)]
        r = median_run(same)
        kind = lookup_kind(r)
        base = Point(key=path_key(r), case_id=str(r.case_id), run_id=str(r.get("_run_id", "")),
                     rows=int(r.rows or r.num_tokens * r.num_heads), tokens=int(r.num_tokens),
                     table_bytes=int(r.table_bytes), row_bytes=int(r.row_bytes or 0),
                     compute_us=float(r.compute_us or 0), compute_ms=float(r.compute_ms),
                     lookup_ms=float(r.lookup_ms), step_ms=float(r.step_ms), resident=device_resident(r),
                     host_gather=kind == "host", heads=int(r.num_heads), kind=kind, runs=len(same))
        out.append(base)
        # the resident step's other figures (record.resident_figures: its host-sync twin, the full
        # graph of a breakable step on either timer), each a point of its own graph mode and timer,
        # so that the HBM row a pinned option is held against is the one record.Peers holds it against
        if not base.key.timer:  # a record that names its timer
            continue
        figures: dict[tuple[str, str], list[float]] = {}
        for x in same:
            for f in resident_figures(x):
                figures.setdefault((f.graph, f.timer), []).append(f.ms)
        for (graph, timer), ms in figures.items():
            if (graph, timer) != (base.key.graph, base.key.timer):
                what = "/".join(x for x, own in ((graph, base.key.graph), (timer, base.key.timer)) if x != own)
                twins.append(replace(base, key=base.key._replace(graph=graph, timer=timer), host_twin=True,
                                     case_id=f"{base.case_id}#{what}", step_ms=float(statistics.median_low(ms)),
                                     runs=len(ms)))
    measured_keys = {p.key for p in out}
    return out + [t for t in twins if t.key not in measured_keys]


def _host_gather(r: dict[str, Any]) -> bool:
    """Rows moved by host cores / copy engines (the paths with no GPU gather kernel), not by a
    GPU kernel reading host memory."""
    return lookup_kind(r) == "host" or as_record(r).host_gather_ceiling_ms is not None


# ------------------------------------------------------------------ machine rates

@dataclass
class Rates:
    """What the model takes from the machine, each with where it came from."""

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
    sources: dict[str, str] = field(default_factory=dict)
    #: the per-row rates of the runs' per-case ceilings (None: no meta.json given)
    ceilings: CeilingRates | None = None
    #: the machine the runs measured (the rate terms are quoted for it)
    machine: Machine = field(default_factory=Machine)

    def thread_factor(self, cores: int) -> float:
        """The host gather's time at ``cores`` threads over its time at the measured thread count."""
        n0 = self.measured_threads
        if self.threads_fit:
            s, p, o = self.threads_fit
            return (s + p / cores + o * cores) / (s + p / n0 + o * n0)
        return n0 / cores  # assumption: linear in cores


def calibrate(records: Iterable[dict[str, Any]], metas: Iterable[dict[str, Any]]) -> Rates:
    """The machine rates from lookup records and meta.json ceilings."""
    records = [as_record(r) for r in records]
    metas = [as_meta(m) for m in metas]
    rates = Rates(ceilings=CeilingRates(metas), machine=measured_machine(metas))
    rates.sources["ceilings"] = (f"per-case random_row / host_gather ceilings of {len(metas)} run(s)' meta.json"
                                 if metas else "no meta.json: the rate terms are the links' bytes only")
    for m in metas:
        for v in m.ceilings.host_gather:
            if v.timed and v.row_bytes:
                rates.measured_threads = int(v.threads or rates.measured_threads)
                rps = v.rows / (v.ms * 1e-3)
                fhg = rates.floor_host_gather_rows_per_s
                fhg[int(v.row_bytes)] = max(fhg.get(int(v.row_bytes), 0.0), rps)
    if rates.floor_host_gather_rows_per_s:
        rates.sources["floor_host_gather"] = "the fastest host_gather ceiling (rows/s) of the runs' meta.json"
    h2d = [m.ceilings.h2d_gbps for m in metas]
    h2d = [v for v in h2d if v]
    if h2d:
        rates.h2d_gbps = statistics.median(h2d)
        rates.floor_h2d_gbps = max(h2d)
        rates.sources["h2d_gbps"] = f"median h2d_gbps of {len(h2d)} runs' ceilings (the floor: their fastest)"
    d2d = [m.ceilings.d2d_gbps for m in metas]
    d2d = [v for v in d2d if v]
    if d2d:
        rates.floor_d2d_gbps = max(d2d)
        rates.sources["floor_d2d_gbps"] = f"the fastest d2d_gbps of {len(d2d)} runs' ceilings"
    # all-reduce alpha-beta: reduce_ms = alpha + reduce_bytes * 2(n-1)/n / busbw
    xs, ys = [], []
    for r in records:
        b, t, n = r.reduce_bytes, r.reduce_ms, r.etp
        if r.status == "ok" and b and t and n and n > 1:
            xs.append(b * 2 * (n - 1) / n)
            ys.append(t)
    if len(set(xs)) >= 2:
        slope, alpha = np.polyfit(xs, ys, 1)
        if slope > 0:
            rates.reduce_alpha_ms, rates.reduce_busbw_gbps = max(0.0, float(alpha)), 1e-6 / float(slope)
            rates.reduce_points = len(xs)
            rates.sources["reduce"] = f"least squares on {len(xs)} ETP lookups' reduce_ms vs reduce_bytes"
    if rates.reduce_busbw_gbps is None:
        bw = [v for m in metas for v in m.ceilings.starting("allreduce_busbw")]
        bw = [v for v in bw if v]
        if bw:
            rates.reduce_busbw_gbps = statistics.median(bw)
            rates.sources["reduce"] = "busbw from the allreduce_busbw ceilings; no alpha measured (no ETP lookups)"
    # host-gather threads: t(n) = s + p/n + o n on lookups with gather_threads varied
    tg: dict[tuple, dict[int, float]] = {}
    for r in records:
        if r.status == "ok" and r.kind == "lookup" and r.host_gather_ceiling_ms and r.median_ms:
            n = int(r.gather_threads or 0) or rates.measured_threads
            tg.setdefault((r.impl, r.rows, r.table_bytes, r.ids_on), {})[n] = float(r.median_ms)
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


def rate_columns(kind: str, key: Sequence, *, rows: int, table_bytes: float, row_bytes: int, rates: Rates,
                 target: Machine | None = None, host_cores: int | None = None) -> list[float]:
    """The rate terms of a lookup of ``rows`` rows of ``row_bytes`` from a ``table_bytes`` table,
    in ms at the ceilings' rates (each term's efficiency is fitted): see :data:`RATE_TERMS`.
    ``target``: another machine (its figures over the measured ones scale each term);
    ``host_cores``: the host gather's threads (default the path's own, else as measured)."""
    m = rates.machine
    f = m.factors(target)
    ceil = rates.ceilings or CeilingRates([])
    k = tuple(key)
    ids = str(k[9]) if len(k) > 9 and k[9] else "uniform"
    alloc = str(k[10]) if len(k) > 10 and k[10] else "torch"
    h2d = m.h2d_gbps or rates.h2d_gbps
    out = []
    if kind in ("device", "cached"):
        s, _ = ceil.kernel_row_s("device", table_bytes, row_bytes, m.hbm_read_gbps or rates.floor_d2d_gbps, ids=ids)
        out.append(rows * s * 1e3 * f["device"])
    if kind in ("pinned", "cached"):
        s, _ = ceil.kernel_row_s("pinned", table_bytes, row_bytes, h2d, ids=ids, host_alloc=alloc,
                                 order="sorted" if reads_sorted(k) else "random")
        out.append(rows * s * 1e3 * f["pinned"])
    if kind == "host":
        gather, copy, _ = ceil.host_row_s(table_bytes, row_bytes, h2d, ids=ids)
        cores = host_cores or (int(k[7]) if len(k) > 7 and k[7] else None)
        threads = rates.thread_factor(cores) if cores else 1.0
        out += [rows * gather * 1e3 * f["gather"] * threads, rows * copy * 1e3 * f["copy"]]
    return out


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
    c3: float = 0.0  # ms per row byte (>= 0; fitted where the steps hold two row sizes or more)
    c4: float = 0.0  # ms per token (>= 0; fitted where the steps hold two head counts or more)
    #: (tokens, compute_us) -> the mean residual of the plane's steps there: the matmul chain's own
    #: time at a measured token count (a GEMM's time is not linear in its rows: tiles, waves)
    offsets: dict = field(default_factory=dict)


def _compute_plane(points: Sequence[Point]) -> tuple[float, float, float, float, float, dict]:
    """c0 + c1 compute_us + c2 rows (+ c3 rows row_bytes where the points hold 2+ row sizes)
    (+ c4 tokens where they hold 2+ head counts), then each measured (tokens, compute_us)'s mean
    residual."""
    by_bytes = len({p.row_bytes for p in points}) >= 2
    by_tokens = len({p.heads for p in points}) >= 2
    # one compute length: no slope on it is measured (0: the prediction says it is outside)
    us = [p.compute_us if len({q.compute_us for q in points}) >= 2 else 0.0 for p in points]
    # the chain's GEMMs run over the tokens: with the heads varied, its growth is per token (the rows'
    # term then only the bytes the PLE projection consumes); else tokens and rows are one column
    X = [[1.0, u, 0.0 if by_tokens else p.rows] + ([p.rows * p.row_bytes] if by_bytes else [])
         + ([float(p.tokens)] if by_tokens else []) for p, u in zip(points, us)]
    c = bounded_fit(X, [p.compute_ms for p in points], free=(0,))
    c3 = c[3] if by_bytes else 0.0
    c4 = c[-1] if by_tokens else 0.0
    res: dict[tuple, list[float]] = {}
    for p, x in zip(points, X):
        res.setdefault((p.tokens, p.compute_us), []).append(p.compute_ms - float(np.dot(c, x)))
    offsets = {k: statistics.fmean(v) for k, v in res.items()} if len(res) > 1 else {}
    return c[0], c[1], c[2], c3, c4, offsets


def compute_fit(points: Sequence[Point], key: PathKey) -> ComputeFit | None:
    """compute_ms = c0 + c1 compute_us + c2 rows (+ c3 rows row_bytes), slopes >= 0, over the steps
    of ``key``'s timer, graph mode and id placement; else its timer and graph mode; else its timer
    (never another timer's, nor a host-sync twin's, whose compute the events timed).  None: fewer
    than 4 such steps at 2+ compute lengths, or ``key`` the path of host-sync twins (it fits its
    own compute on its event-timed compute; its residual takes the host clock's extra)."""
    if any(p.host_twin and p.key == key for p in points):
        return None
    # one compute kind, one link condition (a concurrent copy slows the compute a host clock times)
    points = [p for p in points if not p.host_twin and p.key.compute == key.compute
              and p.key.link_shared == key.link_shared]
    levels = (("timer, graph, ids placement", lambda p: (p.key.timer, p.key.graph, p.key.ids_on)
               == (key.timer, key.graph, key.ids_on)),
              ("timer, graph", lambda p: (p.key.timer, p.key.graph) == (key.timer, key.graph)),
              ("timer", lambda p: p.key.timer == key.timer))
    for need in (2, 1):  # a level with two compute lengths or more first, else one
        for name, same in levels:
            ps = [p for p in points if same(p)]
            if len(ps) >= 4 and len({p.compute_us for p in ps}) >= need:
                c0, c1, c2, c3, c4, offsets = _compute_plane(ps)
                return ComputeFit(c0, c1, c2, len(ps), f"pooled over {len(ps)} steps of the same {name}", c3, c4,
                                  offsets)
    return None


def compute_fits(points: Sequence[Point]) -> dict[tuple, ComputeFit | None]:
    """:func:`compute_fit` for every (timer, graph, ids placement, compute kind, link condition) of
    ``points``."""
    out: dict[tuple, ComputeFit | None] = {}
    for p in points:
        k = _compute_group(p.key)
        if k not in out:
            out[k] = compute_fit(points, p.key)
    return out


@dataclass
class PathFit:
    key: tuple
    c0: float
    c1: float
    c2: float  # compute_ms per row (the consumer of the rows)
    l0: float  # the lookup's fixed ms (launches, polls, graph nodes)
    l1: float  # ms per row of fixed per-row work
    e0: float
    e1: float
    n: int
    tables: tuple[int, int]
    rows: tuple[int, int]
    computes: tuple[float, float]
    resident: bool
    host_gather: bool
    prefetch: bool
    row_bytes: int  # the row size asked when a prediction names none (the path's first measured one)
    #: (rows, table_bytes, lookup_ms, row_bytes) of every fitted step: the measured floor
    measured: tuple[tuple, ...] = ()
    compute_source: str = ""
    kind: str = ""  # lookup_kind ("" = from resident / host_gather)
    eff: tuple[float, ...] = ()  # the efficiency of each rate term (RATE_TERMS[kind])
    c3: float = 0.0  # compute_ms per row byte
    #: a prefetch that hides its lookup behind the compute (False: its steps fit a serial lookup better)
    hides: bool = True
    c4: float = 0.0  # compute_ms per token
    offsets: dict = field(default_factory=dict)  # ComputeFit.offsets
    row_sizes: tuple[int, ...] = ()  # the row sizes the path measured
    #: shapes (table GiB, row bytes, heads) the path measured
    shapes: tuple[tuple, ...] = ()

    def __post_init__(self) -> None:
        if not self.kind:
            self.kind = "device" if self.resident else ("host" if self.host_gather else "pinned")

    @property
    def cached(self) -> bool:
        """A hot-row cache in HBM serves part of the rows."""
        return bool(len(self.key) > 6 and self.key[6]) or (bool(self.key) and _warms_cache(self.key[0]))

    def lookup_ms(self, rates: Rates, *, rows: int, table_bytes: float, row_bytes: int,
                  target: Machine | None = None, host_cores: int | None = None) -> float:
        """The fitted lookup (no floor)."""
        cols = rate_columns(self.kind, self.key, rows=rows, table_bytes=table_bytes, row_bytes=row_bytes,
                            rates=rates, target=target, host_cores=host_cores) if self.eff else []
        return self.l0 + self.l1 * rows + sum(e * c for e, c in zip(self.eff, cols))


def fit_path(points: Sequence[Point], rates: Rates, compute: ComputeFit | None) -> PathFit:
    """Fit one path on its ``points`` (one key); ``compute``: the pooled compute fit (None: the
    path's own plane)."""
    p0 = points[0]
    key = p0.key
    cu = [p.compute_us for p in points]
    c3, c4, offsets = 0.0, 0.0, {}
    if compute is not None:
        c0, c1, c2, c3, csrc = compute.c0, compute.c1, compute.c2, compute.c3, compute.source
        c4, offsets = compute.c4, compute.offsets
    elif len(points) >= 4 and len({p.rows for p in points}) >= 2:  # not pooled: this path's own plane
        c0, c1, c2, c3, c4, offsets = _compute_plane(points)
        csrc = f"the path's own {len(points)} steps"
    else:  # its own line (one row count or one compute length)
        (c0, c1), c2 = _line(cu, [p.compute_ms for p in points], intercept_free=True), 0.0
        if len(set(cu)) < 2:
            c0, c2 = _line([p.rows for p in points], [p.compute_ms for p in points], intercept_free=True)
        csrc = f"the path's own {len(points)} steps"
    kind = p0.kind or ("device" if p0.resident else "host" if p0.host_gather else "pinned")
    cols = [rate_columns(kind, key, rows=p.rows, table_bytes=p.table_bytes, row_bytes=p.row_bytes, rates=rates)
            for p in points]
    # the per-row term only where two table or row sizes tell it from the rate terms
    per_row = len({(p.table_bytes, p.row_bytes) for p in points}) >= 2 or not any(any(c) for c in cols)
    X = [[1.0] + ([float(p.rows)] if per_row else []) + c for p, c in zip(points, cols)]
    coef = bounded_fit(X, [p.lookup_ms for p in points]) if len(points) >= 2 else \
        [points[0].lookup_ms] + [0.0] * (len(X[0]) - 1)
    l0, l1 = coef[0], (coef[1] if per_row else 0.0)
    eff = tuple(coef[2 if per_row else 1:])
    fit = PathFit(key, c0, c1, c2, l0, l1, 0.0, 0.0, len(points),
                  (min(p.table_bytes for p in points), max(p.table_bytes for p in points)),
                  (min(p.rows for p in points), max(p.rows for p in points)), (min(cu), max(cu)),
                  p0.resident, p0.host_gather, bool(key[2]), p0.row_bytes,
                  tuple(sorted((p.rows, p.table_bytes, p.lookup_ms, p.row_bytes) for p in points)), csrc,
                  kind=kind, eff=eff, c3=c3, c4=c4, offsets=offsets,
                  row_sizes=tuple(sorted({p.row_bytes for p in points})),
                  shapes=tuple(sorted({p.shape for p in points})))
    looks = [fit.lookup_ms(rates, rows=p.rows, table_bytes=p.table_bytes, row_bytes=p.row_bytes) for p in points]
    computes = [max(0.0, _compute(fit, p.compute_us, p.rows, p.row_bytes, p.tokens)) for p in points]

    def residual_fit() -> tuple[float, float, float]:
        resid = [p.step_ms - p.compute_ms - _base_exposed(fit, lk, c) for p, lk, c in zip(points, looks, computes)]
        e0, e1 = _line([p.rows for p in points], resid, intercept_free=True)
        return e0, e1, float(np.mean([(r - e0 - e1 * p.rows) ** 2 for p, r in zip(points, resid)]))

    fit.e0, fit.e1, err = residual_fit()
    if fit.prefetch and len(points) >= 3:
        # a prefetch that does not hide (its side-stream kernel competing with the compute for SMs)
        # is a serial lookup: where the path's own steps say so (a smaller residual), it is one
        fit.hides = False
        e0, e1, serial_err = residual_fit()
        if serial_err < err:
            fit.e0, fit.e1 = e0, e1
        else:
            fit.hides = True
    return fit


def _compute(fit: PathFit, compute_us: float, rows: int, row_bytes: int, tokens: int | None = None) -> float:
    """The fitted compute; at a measured (tokens, compute_us) plus its measured offset."""
    base = fit.c0 + fit.c1 * compute_us + fit.c2 * rows + fit.c3 * rows * row_bytes + fit.c4 * (tokens or 0)
    return base + compute_offset(fit.offsets, tokens, compute_us)


#: past the measured token counts: "hold" the nearest count's offset, or "zero" (the plane alone)
OFFSET_EDGE = "zero"


def compute_offset(offsets: dict, tokens: int | None, compute_us: float) -> float:
    """The compute's measured offset at ``tokens`` (:attr:`ComputeFit.offsets`): its own where
    measured, linearly interpolated between the measured token counts of that compute length (no
    jump at a count nobody measured), past them the nearest one's."""
    if tokens is None:
        return 0.0
    if (tokens, compute_us) in offsets:
        return offsets[(tokens, compute_us)]
    pts = sorted((t, v) for (t, cu), v in offsets.items() if cu == compute_us)
    if not pts:
        return 0.0
    if not pts[0][0] <= tokens <= pts[-1][0] and OFFSET_EDGE == "zero":
        return 0.0
    return float(np.interp(tokens, [t for t, _ in pts], [v for _, v in pts]))


def _base_exposed(fit: PathFit, lookup_ms: float, compute_ms: float) -> float:
    return max(0.0, lookup_ms - compute_ms) if fit.prefetch and fit.hides else lookup_ms


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


def physical_floor(fit: PathFit, rates: Rates, rows: int, host_cores: int | None = None,
                   row_bytes: int | None = None, target: Machine | None = None) -> tuple[float, str]:
    """(ms, in words): ``rows · row_bytes`` over the fastest measured ceiling that binds the path
    (0 where the runs carry none); on another machine (``target``) the bandwidths scaled by it."""
    rb = row_bytes or fit.row_bytes
    nbytes = rows * rb
    f = rates.machine.factors(target)
    other = rates.machine.differs(target)
    cands: list[tuple[float, str]] = []
    if fit.resident or fit.cached:
        if rates.floor_d2d_gbps:
            bw = rates.floor_d2d_gbps / (f["device"] if other and f["device"] < 1 else 1.0)
            cands.append((nbytes / (bw * 1e6), f"d2d {bw:.0f} GB/s"))
    else:
        if rates.floor_h2d_gbps:
            bw = rates.floor_h2d_gbps / (f["copy"] if other and f["copy"] < 1 else 1.0)
            cands.append((nbytes / (bw * 1e6), f"h2d {bw:.1f} GB/s"))
        if fit.host_gather and rates.floor_host_gather_rows_per_s:
            # rows/s: at this row size where measured, else the fastest at a row size no larger
            # (a larger row is never cheaper per row); none measured at <= rb: no floor from it
            fhg = rates.floor_host_gather_rows_per_s
            rps = fhg.get(rb) or max((v for k, v in fhg.items() if k <= rb), default=None)
            if rps:
                t, what = rows / rps * 1e3, f"host-gather ceiling {rps / 1e6:.0f} Mrow/s"
                if host_cores and host_cores > rates.measured_threads:  # more cores may gather faster
                    t *= min(1.0, rates.thread_factor(host_cores))
                    what += f" x the thread fit at {host_cores} cores"
                if other and f["gather"] < 1:
                    t *= f["gather"]
                    what += " x the given host-gather rate"
                cands.append((t, what))
    return max(cands, default=(0.0, ""))


def predict(fit: PathFit, rates: Rates, *, rows: int, table_bytes: int, compute_us: float, etp: int = 1,
            nodes: int = 1, link_gbps: float | None = None, link_latency_us: float = 0.0,
            host_cores: int | None = None, row_bytes: int | None = None,
            machine: Machine | None = None, tokens: int | None = None) -> Prediction:
    """The step of ``fit``'s path at ``rows`` rows of ``row_bytes`` (default the path's first
    measured row size) from a ``table_bytes`` table, ``compute_us`` of compute, an ETP group,
    ``host_cores`` gather threads, on ``machine`` (default the measured one)."""
    rb = int(row_bytes or fit.row_bytes)
    outside = []
    shard = table_bytes / etp
    if not fit.tables[0] / TABLE_SLACK <= shard <= fit.tables[1] * TABLE_SLACK:
        outside.append(f"table {shard / GIB:.1f} GiB per rank (measured {fit.tables[0] / GIB:.1f}–"
                       f"{fit.tables[1] / GIB:.1f} GiB)")
    if fit.row_sizes and rb not in fit.row_sizes:
        outside.append(f"{rb} B rows (measured {', '.join(map(str, fit.row_sizes))} B)")
    extrapolated = not fit.rows[0] <= rows <= fit.rows[1]
    if extrapolated:
        outside.append(f"{rows} rows (measured {fit.rows[0]}–{fit.rows[1]})")
    if not fit.computes[0] <= compute_us <= fit.computes[1]:
        outside.append(f"compute {compute_us:g} us (measured {fit.computes[0]:g}–{fit.computes[1]:g})")
    if fit.host_gather and host_cores:
        outside.append(f"{host_cores} host cores (measured {rates.measured_threads} threads)")
    other = rates.machine.differs(machine)
    if other:
        outside.append("another machine")
    red = reduce_ms(rates, etp, etp * rows * rb, nodes, link_gbps, link_latency_us) if etp > 1 else 0.0
    if etp > 1:
        outside.append(f"ETP {etp}" + (f" over {nodes} nodes" if nodes > 1 else ""))
    floors = []
    if fit.eff:
        fitted = fit.lookup_ms(rates, rows=rows, table_bytes=shard, row_bytes=rb, target=machine,
                               host_cores=host_cores)
    else:  # a fit with no rate term (hand-made): its per-row line, scaled by host cores
        per_row = fit.l1 * (rates.thread_factor(host_cores) if fit.host_gather and host_cores else 1.0)
        fitted = fit.l0 + per_row * rows
    phys, phys_what = physical_floor(fit, rates, rows, host_cores, rb, machine)
    seen = [m[2] for m in fit.measured if m[0] <= rows and m[1] <= shard * TABLE_SLACK
            and (len(m) < 4 or m[3] <= rb)]
    seen_floor = min(seen) if seen and not other and not (fit.host_gather and host_cores
                                                          and host_cores > rates.measured_threads) else 0.0
    local = max(fitted, phys, seen_floor)
    if local > fitted:
        floors.append(f"lookup at its physical floor ({rows} rows x {rb} B over the {phys_what})"
                      if phys >= seen_floor else
                      f"lookup at the smallest it measured at <= {rows} rows ({seen_floor:.3f} ms)")
    compute = _compute(fit, compute_us, rows, rb, tokens)
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
    shape: str = ""  # "<table GiB> GiB x <row bytes> B x <heads> heads"

    @property
    def rel_err(self) -> float:
        return abs(self.predicted_ms - self.measured_ms) / self.measured_ms


@dataclass
class ErrorStats:
    n: int
    median_pct: float | None
    worst_pct: float | None
    worst_case: str = ""
    what: str = "leave-one-out"  # | "extrapolation" | "held-out shape"
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
    shape_cases: list[LooCase] = field(default_factory=list)
    shape_by_path: dict[str, ErrorStats] = field(default_factory=dict)
    shape_overall: ErrorStats = field(default_factory=lambda: ErrorStats(0, None, None, what="held-out shape"))
    strict_cases: list[LooCase] = field(default_factory=list)  # the shape's ceilings left out too

    def error(self, key: tuple) -> ErrorStats:
        """The path's held-out-shape error; where not measured, its leave-one-out error; else the
        overall held-out-shape (or leave-one-out) error, so marked."""
        own = self.shape_by_path.get(path_id(key)) or self.loo_by_path.get(path_id(key))
        if own:
            return own
        overall = self.shape_overall if self.shape_overall.n else self.loo_overall
        return ErrorStats(**{**asdict(overall), "scope": "all paths"})

    def extrap_error(self, key: tuple) -> ErrorStats:
        """The path's extrapolation error; the overall one (so marked) where it was not measured."""
        own = self.extrap_by_path.get(path_id(key))
        return own or ErrorStats(**{**asdict(self.extrap_overall), "scope": "all paths"})

    def summary(self) -> dict[str, Any]:
        rates = {k: v for k, v in asdict(self.rates).items() if k not in ("ceilings", "machine")}
        return {"rates": rates, "machine": self.rates.machine.to_json(), "loo_overall": asdict(self.loo_overall),
                "extrap_overall": asdict(self.extrap_overall), "shape_overall": asdict(self.shape_overall),
                "loo_by_path": {k: asdict(v) for k, v in sorted(self.loo_by_path.items())},
                "extrap_by_path": {k: asdict(v) for k, v in sorted(self.extrap_by_path.items())},
                "shape_by_path": {k: asdict(v) for k, v in sorted(self.shape_by_path.items())},
                "paths_fitted": len(self.fits), "steps_fitted": len(self.points)}


def _groups(points: Sequence[Point]) -> dict[tuple, list[Point]]:
    g: dict[tuple, list[Point]] = {}
    for p in points:
        g.setdefault(p.key, []).append(p)
    return g


def fit(points: Sequence[Point], rates: Rates) -> dict[tuple, PathFit]:
    computes = compute_fits(points)
    return {k: fit_path(ps, rates, computes[_compute_group(k)]) for k, ps in _groups(points).items()}


def _compute_group(k: PathKey) -> tuple:
    return (k.timer, k.graph, k.ids_on, k.compute, k.link_shared)


def config_group(p: Point) -> tuple:
    """The unit :func:`leave_one_out` leaves out: one (path, table size, row shape, compute)
    configuration, all its token counts."""
    return (p.key, p.table_bytes, p.row_bytes, p.heads, p.compute_us)


def _twin(p: Point) -> tuple:
    """A configuration group but for the id distribution and the host allocation."""
    return (p.key._replace(ids="", host_alloc=""), p.table_bytes, p.row_bytes, p.heads, p.compute_us)


def shape_words(shape: tuple) -> str:
    t, rb, h = shape
    return f"{t:g} GiB x {rb} B x {h} heads"


def _case(p: Point, pred: Prediction) -> LooCase:
    return LooCase(p.case_id, path_id(p.key), p.step_ms, pred.step_ms, p.run_id, p.key.timer, p.key.graph,
                   shape_words(p.shape))


def _predict_point(f: PathFit, rates: Rates, p: Point, machine: Machine | None = None,
                   host_cores: int | None = None) -> Prediction:
    return predict(f, rates, rows=p.rows, table_bytes=p.table_bytes, compute_us=p.compute_us, row_bytes=p.row_bytes,
                   machine=machine, host_cores=host_cores, tokens=p.tokens)


def leave_one_out(points: Sequence[Point], rates: Rates) -> list[LooCase]:
    """Leave out one configuration group (:func:`config_group`: a path at one table size, row shape
    and compute, every token count) at a time: refit its path on the path's other groups and the
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
    """Leave out each path's largest measured token count at each shape (table x row bytes x heads;
    every compute at it): refit the path on its smaller token counts and the compute on every step
    of a smaller token count than its path's largest at its shape (no held-out step informs the
    fit), and predict the held-out steps -- 2x past the largest fitted where the suite doubles its
    token counts.  Paths measured at one token count are left out."""
    top: dict[tuple, int] = {}
    for p in points:
        top[(p.key, p.shape)] = max(top.get((p.key, p.shape), 0), p.tokens)
    held = {id(p) for p in points if p.tokens == top[(p.key, p.shape)]}
    rest_all = [p for p in points if id(p) not in held]
    out = []
    for k, ps in _groups(points).items():
        rest = [p for p in ps if id(p) not in held]
        if not rest:
            continue
        f = fit_path(rest, rates, compute_fit(rest_all, k))
        out += [_case(h, _predict_point(f, rates, h)) for h in ps if id(h) in held]
    return out


def shape_holdout(points: Sequence[Point], rates: Rates, *, metas: Sequence[dict[str, Any]] | None = None,
                  strict: bool = False) -> list[LooCase]:
    """Leave out one whole shape (:attr:`Point.shape`: table size x row bytes x heads) at a time:
    refit every path and the compute on the other shapes' steps, and predict the held-out steps of
    every path that was measured on another shape too.  ``strict`` (needs ``metas``): the held-out
    shape's per-case ceilings are left out as well (its rates interpolated from the other shapes')."""
    out = []
    for shape in sorted({p.shape for p in points}):
        rest = [p for p in points if p.shape != shape]
        held = [p for p in points if p.shape == shape]
        if not rest:
            continue
        r = rates
        if strict and metas is not None:
            tables = {(h.table_bytes, h.row_bytes) for h in held}
            r = replace(rates, ceilings=CeilingRates(metas, exclude=tables))
        fits = fit(rest, r)
        out += [_case(h, _predict_point(fits[h.key], r, h)) for h in held if h.key in fits]
    return out


def changed_configuration(p: Point, rates: Rates) -> tuple[PathKey, Machine, int | None, str] | None:
    """How ``p`` differs from the machine the runs measured, as the machine description says it:
    (the unchanged path it is predicted from, the machine changed to match, the host cores, the
    change in words); None for an unchanged configuration.  Fewer gather threads than measured:
    ``host_cores``; an SM limit: ``sms``; the link shared with a concurrent copy: half the
    ``h2d_gbps``."""
    k, m, cores, what = p.key, rates.machine, None, []
    if k.gather_threads and k.gather_threads < rates.measured_threads:
        cores = k.gather_threads
        m = m.given(f"gather_threads {cores}", host_cores=cores)
        k = k._replace(gather_threads=rates.measured_threads)
        what.append(f"{cores} gather threads")
    if k.sm_limit:
        m = m.given(f"sm_limit {k.sm_limit}", sms=k.sm_limit)
        what.append(f"{k.sm_limit} SMs")
        k = k._replace(sm_limit=0)
    if k.link_shared and m.h2d_gbps:
        m = m.given("h2d_background: a concurrent copy takes half the link", h2d_gbps=m.h2d_gbps / 2)
        what.append("link shared")
        k = k._replace(link_shared=False)
    return (k, m, cores, ", ".join(what)) if what else None


def machine_holdout(points: Sequence[Point], rates: Rates) -> list[LooCase]:
    """Each changed configuration (:func:`changed_configuration`) predicted from the unchanged
    configurations alone (every changed step left out of the fit) and the machine description
    changed to match; ``LooCase.shape`` says the change."""
    changed = [(p, changed_configuration(p, rates)) for p in points]
    rest = [p for p, c in changed if c is None]
    if not rest:
        return []
    fits = fit(rest, rates)
    out = []
    for p, c in changed:
        if c is None:
            continue
        base, target, cores, what = c
        f = fits.get(base) or (fits.get(base._replace(gather_threads=0)) if base.gather_threads else None)
        if f is None:
            continue
        case = _case(p, _predict_point(f, rates, p, machine=target, host_cores=cores))
        case.shape = what
        out.append(case)
    return out


def heldout_runs(points: Sequence[Point], rates: Rates, new: Sequence[Point],
                 machine: Machine | None = None) -> list[LooCase]:
    """The steps ``new`` (other runs: a shape measured after the model was fitted, or another
    machine's runs with ``machine`` its description) predicted from a model fitted on ``points``
    alone -- the paths both hold; ``LooCase.shape`` is the new step's."""
    fits = fit(points, rates)
    target = machine if machine is not None and rates.machine.differs(machine) else None
    return [_case(p, _predict_point(fits[p.key], rates, p, machine=target)) for p in new if p.key in fits]


def machine_markdown(cases: Sequence[LooCase]) -> str:
    """The changed-machine errors as markdown: per change, per timer."""
    lines = ["| changed configuration | timer | steps | median | worst |", "| --- | --- | --- | --- | --- |"]
    for what in sorted({c.shape for c in cases}):
        for timer in sorted({c.timer for c in cases if c.shape == what}):
            mine = [c for c in cases if (c.shape, c.timer) == (what, timer)]
            lines.append(f"| {what} | {timer} | {error_cells(mine)} |")
    lines.append(f"| **all** | | {error_cells(cases)} |")
    return "\n".join(lines)


def _by_path(cases: Sequence[LooCase], what: str) -> dict[str, ErrorStats]:
    by: dict[str, list[LooCase]] = {}
    for c in cases:
        by.setdefault(c.path, []).append(c)
    return {k: _stats(v, what) for k, v in by.items()}


def build_model(records: Sequence[dict[str, Any]], metas: Sequence[dict[str, Any]], *, loo: bool = True,
                strict: bool = False, config_loo: bool = True,
                calibration: tuple[Sequence[dict[str, Any]], Sequence[dict[str, Any]]] = ((), ())) -> Model:
    """Calibrate and fit on ``records`` (each with ``_run_id``), every row shape together.
    ``loo``: measure the held-out-shape, the extrapolation and the leave-one-out errors too;
    ``strict``: and the held-out-shape error with the shape's ceilings left out; ``config_loo``:
    the leave-one-out by configuration too (the slowest); ``calibration``: (records, metas) of other
    runs on the same machine whose lookups and ceilings calibrate the machine rates (the thread fit,
    the random-row and host-gather ceilings) but whose steps are not fitted."""
    extra_records = [r for r in calibration[0] if r.get("kind") != "step"]
    metas = list(metas) + list(calibration[1])
    rates = calibrate(list(records) + extra_records, metas)
    points = step_points(records)
    m = Model(rates, fit(points, rates), points)
    if loo:
        m.shape_cases = shape_holdout(points, rates)
        m.shape_by_path = _by_path(m.shape_cases, "held-out shape")
        m.shape_overall = _stats(m.shape_cases, "held-out shape", "all paths")
        if strict:
            m.strict_cases = shape_holdout(points, rates, metas=metas, strict=True)
        m.loo_cases = leave_one_out(points, rates) if config_loo else []
        m.loo_by_path = _by_path(m.loo_cases, "leave-one-out")
        m.loo_overall = _stats(m.loo_cases, "leave-one-out", "all paths")
        m.extrap_cases = extrapolation_holdout(points, rates)
        m.extrap_by_path = _by_path(m.extrap_cases, "extrapolation")
        m.extrap_overall = _stats(m.extrap_cases, "extrapolation", "all paths")
    return m


def error_cells(cases: Sequence[LooCase]) -> str:
    """One markdown row's cells for ``cases``: steps | median % | worst %."""
    st = _stats(cases)
    return f"{st.n} | {st.median_pct:.1f} % | {st.worst_pct:.0f} %" if st.n else "0 | – | –"


def error_markdown(m: Model) -> str:
    """The model's errors as markdown: one row per way of measuring it (held-out shape, held-out
    shape with its ceilings left out, extrapolation, leave-one-out), then the held-out-shape and
    extrapolation errors per timer and per held-out shape."""
    lines = ["| error | steps | median | worst |", "| --- | --- | --- | --- |"]
    for name, cases in (("**held-out shape** (ceilings of the run kept)", m.shape_cases),
                        ("held-out shape, its ceilings left out too", m.strict_cases),
                        ("extrapolation (largest token count held out)", m.extrap_cases),
                        ("leave-one-out by configuration", m.loo_cases)):
        if cases or "strict" not in name:
            lines.append(f"| {name} | {error_cells(cases)} |")
    lines += ["", "| held-out shape / timer | shape n | median | worst | extrapolation n | median | worst |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for timer in sorted({c.timer for c in m.shape_cases + m.extrap_cases}):
        lines.append(f"| timer {timer or '?'} | {error_cells([c for c in m.shape_cases if c.timer == timer])} | "
                     f"{error_cells([c for c in m.extrap_cases if c.timer == timer])} |")
    for shape in sorted({c.shape for c in m.shape_cases}):
        lines.append(f"| {shape} | {error_cells([c for c in m.shape_cases if c.shape == shape])} | "
                     f"{error_cells([c for c in m.extrap_cases if c.shape == shape])} |")
    return "\n".join(lines)


def load_runs(run_dirs: Sequence[str | Path]) -> tuple[list[dict[str, Any]], list[RunMeta]]:
    """Every record (tagged with ``_run_id``) and every meta.json (typed) of the run folders."""
    records: list[dict[str, Any]] = []
    metas: list[RunMeta] = []
    for d in run_dirs:
        run_id = Path(d).name
        metas.append(RunMeta.load(d))
        for r in load_records(d):
            r["_run_id"] = run_id
            records.append(r)
    return records, metas
