"""The what-if model: a decode step's cost for configurations the runs did not measure
(bigger tables, ETP groups, ETP across nodes, more host cores), calibrated on what runs measured
and checked by leave-one-out prediction of every measured step.

Reads stored records and meta.json ceilings only (never measures).  The model, per lookup path
(impl · kernel, prefetch, ids on host/device, graph mode, SM limit, hot-row cache size):

* **compute** ``C = c0 + c1 · compute_us + c2 · rows`` -- least squares on ``compute_ms`` (the
  step without its lookup) over every path of the same graph mode and id placement: the compute
  does not depend on the lookup path.
* **lookup alone** ``L = l0 + l1 · rows · (table / 32 GiB)^δ`` -- least squares on ``lookup_ms``.
  ``δ`` is how the row rate falls with the table (TLB / page-walk reach): fitted from the runs'
  lookup records of pinned kernel paths at several table sizes (≥ 4 GiB), and from the
  ``host_gather`` ceilings (meta.json) for host-gather paths; device-resident tables: 0 (flat in
  the runs).  A host-gather path's per-row part scales with host cores by the thread fit
  ``s + p/n + o·n`` of records with ``gather_threads`` varied, and never below one row over the
  measured host→device bandwidth (``h2d_gbps``).
* **exposed** -- serial (prefetch off): ``L``; prefetch on: ``max(0, L − C)`` (what the compute
  cannot hide); plus the path's own measured residual ``e0 + e1 · rows`` (launch, sync, the side
  stream's competition for SMs).
* **ETP n** (tp 1: n replicas share one table split in n): each rank reads a shard of
  ``table / n`` (the same expected rows per rank: the ids of all n replicas, of which 1/n hit the
  shard -- an assumption), plus the all-reduce of ``n · rows · row_bytes`` bytes,
  ``alpha + bytes · 2(n−1)/n / busbw`` with alpha and busbw fitted on the runs' ETP lookup records
  (``reduce_ms`` vs ``reduce_bytes``).  Across ``nodes`` with an inter-node link
  (``link_gbps`` GB/s per GPU, ``link_latency_us``): busbw ``min(busbw, link_gbps)`` and alpha
  plus ``2 (nodes − 1) · link_latency`` (a ring's inter-node steps -- an assumption).  The reduce
  is part of the lookup, so a prefetch hides it like the rest.

Step = C + exposed (+ nothing else).  Its error is measured: :func:`leave_one_out` refits each
path without one measured step and predicts it; median and worst relative error per path and
overall travel with every prediction.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from ..record import device_resident, num
from .data import KERNEL_FREE_IMPLS

GIB = 1 << 30
REF_TABLE = 32 * GIB  # the table size the per-row term is quoted at
#: δ when the runs have no table-size sweep: 32 → 28 Mrow/s from 32 to 100 GiB (docs/host-allocation.md)
DEFAULT_DELTA = math.log(32 / 28) / math.log(100 / 32)


def _s(v: Any) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def path_key(r: dict[str, Any]) -> tuple:
    """What makes two step records the same path (everything but tokens, table and compute)."""
    return (str(r.get("impl")), _s(r.get("kernel")), bool(r.get("prefetch")),
            _s(r.get("ids_on")) or "device", _s(r.get("graph")) or "eager",
            int(num(r.get("sm_limit")) or 0), int(num(r.get("cache_rows")) or 0),
            int(num(r.get("gather_threads")) or 0))


def path_label(key: tuple) -> str:
    impl, kernel, _pf, _ids, _graph, sm, cache, threads = key
    name = impl if not kernel else f"{impl} · {kernel}"
    if sm:
        name += f" · {sm} SMs"
    if cache:
        name += f" · cache {cache} rows"
    if threads:
        name += f" · {threads} threads"
    return name


@dataclass
class Point:
    """One measured decode step, as the model reads it."""

    key: tuple
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


def step_points(records: Iterable[dict[str, Any]]) -> list[Point]:
    """The model's points: ok GPU decode steps of one rank with step, compute and lookup times; the
    newest run's measurement of each case (run ids sort by date)."""
    newest: dict[str, dict[str, Any]] = {}
    for r in sorted(records, key=lambda r: str(r.get("_run_id", ""))):
        if (r.get("status") != "ok" or r.get("kind") != "step" or r.get("mode", "gpu") == "functional"
                or int(num(r.get("world_size")) or 1) != 1):
            continue
        if None in (num(r.get("step_ms")), num(r.get("compute_ms")), num(r.get("lookup_ms")),
                    num(r.get("table_bytes")), num(r.get("num_tokens")), num(r.get("num_heads"))):
            continue
        newest[str(r.get("case_id"))] = r
    out = []
    for r in newest.values():
        out.append(Point(key=path_key(r), case_id=str(r.get("case_id")), run_id=str(r.get("_run_id", "")),
                         rows=int(num(r.get("rows")) or num(r["num_tokens"]) * num(r["num_heads"])),
                         tokens=int(num(r["num_tokens"])), table_bytes=int(num(r["table_bytes"])),
                         row_bytes=int(num(r.get("row_bytes")) or 0), compute_us=float(num(r.get("compute_us")) or 0),
                         compute_ms=float(r["compute_ms"]), lookup_ms=float(r["lookup_ms"]),
                         step_ms=float(r["step_ms"]), resident=device_resident(r),
                         host_gather=_host_gather(r)))
    return out


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
    slopes = [_slope(list(g), list(g.values())) for g in groups.values() if len(g) >= 2]
    if slopes:
        rates.delta_kernel = max(0.0, statistics.median(slopes))
        rates.sources["delta_kernel"] = f"median of {len(slopes)} table-size sweeps of pinned lookups (>= 4 GiB)"
    else:
        rates.sources["delta_kernel"] = "assumed: 32 -> 28 Mrow/s from 32 to 100 GiB (docs/host-allocation.md)"
    # host gather vs table size, and the thread count it was measured at (meta ceilings)
    hg: dict[tuple, dict[int, float]] = {}
    for m in metas:
        for v in ((m.get("ceilings") or {}).get("host_gather") or {}).values():
            if isinstance(v, dict) and num(v.get("ms")) and num(v.get("table_bytes")):
                hg.setdefault((v.get("rows"), v.get("row_bytes"), v.get("threads")), {})[int(v["table_bytes"])] = \
                    float(v["ms"])
                rates.measured_threads = int(num(v.get("threads")) or rates.measured_threads)
    slopes = [_slope(list(g), list(g.values())) for g in hg.values() if len(g) >= 2]
    if slopes:
        rates.delta_host = max(0.0, statistics.median(slopes))
        rates.sources["delta_host"] = f"median of {len(slopes)} table-size pairs of the host_gather ceiling"
    else:
        rates.sources["delta_host"] = "assumed as for pinned kernels (no host_gather ceiling at two table sizes)"
    h2d = [num((m.get("ceilings") or {}).get("h2d_gbps")) for m in metas]
    h2d = [v for v in h2d if v]
    if h2d:
        rates.h2d_gbps = statistics.median(h2d)
        rates.sources["h2d_gbps"] = f"median h2d_gbps of {len(h2d)} runs' ceilings"
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


def _delta(p: Point | PathFit, rates: Rates) -> float:
    return 0.0 if p.resident else (rates.delta_host if p.host_gather else rates.delta_kernel)


def _eff_rows(rows: float, table: float, delta: float) -> float:
    return rows * (table / REF_TABLE) ** delta


def _line(xs: Sequence[float], ys: Sequence[float], through_origin_if_negative: bool = False) -> tuple[float, float]:
    """Least-squares a + b x; one distinct x: a = mean, b = 0 (or through the origin)."""
    if len(set(xs)) < 2:
        m = statistics.fmean(ys)
        return (0.0, m / xs[0]) if through_origin_if_negative and xs[0] else (m, 0.0)
    b, a = np.polyfit(xs, ys, 1)
    if through_origin_if_negative and a < 0:  # a lookup cannot take negative time at zero rows
        b, a = float(np.dot(xs, ys) / np.dot(xs, xs)), 0.0
    return float(a), float(b)


def compute_fits(points: Sequence[Point]) -> dict[tuple, tuple[float, float, float]]:
    """compute_ms = c0 + c1 compute_us + c2 rows, least squares over every path of one graph mode
    and id placement (the step without its lookup does not depend on the lookup path); keys
    (graph, ids_on), (graph,) and () for the fallbacks."""
    out: dict[tuple, tuple[float, float, float]] = {}
    keys = {(p.key[4], p.key[3]) for p in points} | {(p.key[4],) for p in points} | {()}
    for k in keys:
        ps = [p for p in points if (p.key[4], p.key[3])[:len(k)] == k]
        if len(ps) < 4 or len({p.compute_us for p in ps}) < 2:
            continue
        X = np.array([[1.0, p.compute_us, p.rows] for p in ps])
        sol, *_ = np.linalg.lstsq(X, np.array([p.compute_ms for p in ps]), rcond=None)
        out[k] = (float(sol[0]), float(sol[1]), float(sol[2]))
    return out


def fit_path(points: Sequence[Point], rates: Rates, computes: dict[tuple, tuple[float, float, float]]) -> PathFit:
    p0 = points[0]
    key = p0.key
    cu = [p.compute_us for p in points]
    pooled = computes.get((key[4], key[3])) or computes.get((key[4],)) or computes.get(())
    if pooled:
        c0, c1, c2 = pooled
    else:  # too few steps to pool: this path's own line
        (c0, c1), c2 = _line(cu, [p.compute_ms for p in points]), 0.0
    delta = _delta(p0, rates)
    eff = [_eff_rows(p.rows, p.table_bytes, delta) for p in points]
    l0, l1 = _line(eff, [p.lookup_ms for p in points], through_origin_if_negative=True)
    fit = PathFit(key, c0, c1, c2, l0, l1, 0.0, 0.0, len(points),
                  (min(p.table_bytes for p in points), max(p.table_bytes for p in points)),
                  (min(p.rows for p in points), max(p.rows for p in points)), (min(cu), max(cu)),
                  p0.resident, p0.host_gather, bool(key[2]), p0.row_bytes)
    resid = [p.step_ms - p.compute_ms - _base_exposed(fit, l0 + l1 * e, c0 + c1 * p.compute_us + c2 * p.rows)
             for p, e in zip(points, eff)]
    fit.e0, fit.e1 = _line([p.rows for p in points], resid)
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


def predict(fit: PathFit, rates: Rates, *, rows: int, table_bytes: int, compute_us: float, etp: int = 1,
            nodes: int = 1, link_gbps: float | None = None, link_latency_us: float = 0.0,
            host_cores: int | None = None) -> Prediction:
    outside = []
    shard = table_bytes / etp
    if not fit.tables[0] / 1.05 <= shard <= fit.tables[1] * 1.05:
        outside.append(f"table {shard / GIB:.1f} GiB per rank (measured {fit.tables[0] / GIB:.1f}–"
                       f"{fit.tables[1] / GIB:.1f} GiB)")
    if not fit.rows[0] <= rows <= fit.rows[1]:
        outside.append(f"{rows} rows (measured {fit.rows[0]}–{fit.rows[1]})")
    if not fit.computes[0] <= compute_us <= fit.computes[1]:
        outside.append(f"compute {compute_us:g} us (measured {fit.computes[0]:g}–{fit.computes[1]:g})")
    per_row = fit.l1 * (shard / REF_TABLE) ** _delta(fit, rates)
    if fit.host_gather and host_cores:
        per_row *= rates.thread_factor(host_cores)
        if rates.h2d_gbps and fit.row_bytes:
            per_row = max(per_row, fit.row_bytes / (rates.h2d_gbps * 1e6))  # one row over PCIe: the floor
        outside.append(f"{host_cores} host cores (measured {rates.measured_threads} threads)")
    red = reduce_ms(rates, etp, etp * rows * fit.row_bytes, nodes, link_gbps, link_latency_us) if etp > 1 else 0.0
    if etp > 1:
        outside.append(f"ETP {etp}" + (f" over {nodes} nodes" if nodes > 1 else ""))
    local = fit.l0 + per_row * rows
    compute = fit.c0 + fit.c1 * compute_us + fit.c2 * rows
    # the ETP all-reduce runs in finalize, on the main stream after the compute: a prefetch cannot
    # hide it, so it adds to the exposed time of every path (the resident one included)
    exposed = _base_exposed(fit, local, compute) + fit.e0 + fit.e1 * rows + red
    return Prediction(compute + exposed, compute, local + red, exposed, red, outside)


# ------------------------------------------------------------------ the model and its error

@dataclass
class LooCase:
    case_id: str
    path: str
    measured_ms: float
    predicted_ms: float

    @property
    def rel_err(self) -> float:
        return abs(self.predicted_ms - self.measured_ms) / self.measured_ms


@dataclass
class ErrorStats:
    n: int
    median_pct: float | None
    worst_pct: float | None
    worst_case: str = ""

    def text(self) -> str:
        if not self.n:
            return "error not measured (fewer than two measured steps of this path)"
        return f"leave-one-out error median {self.median_pct:.0f} %, worst {self.worst_pct:.0f} % ({self.n} cases)"


def _stats(cases: Sequence[LooCase]) -> ErrorStats:
    if not cases:
        return ErrorStats(0, None, None)
    errs = [c.rel_err for c in cases]
    worst = max(cases, key=lambda c: c.rel_err)
    return ErrorStats(len(cases), 100 * statistics.median(errs), 100 * max(errs), worst.case_id)


@dataclass
class Model:
    rates: Rates
    fits: dict[tuple, PathFit]
    points: list[Point]
    loo_cases: list[LooCase] = field(default_factory=list)
    loo_by_path: dict[str, ErrorStats] = field(default_factory=dict)
    loo_overall: ErrorStats = field(default_factory=lambda: ErrorStats(0, None, None))

    def error(self, key: tuple) -> ErrorStats:
        return self.loo_by_path.get(path_id(key), self.loo_overall)

    def summary(self) -> dict[str, Any]:
        return {"rates": asdict(self.rates), "loo_overall": asdict(self.loo_overall),
                "loo_by_path": {k: asdict(v) for k, v in sorted(self.loo_by_path.items())},
                "paths_fitted": len(self.fits), "steps_fitted": len(self.points)}


def path_id(key: tuple) -> str:
    impl, _k, pf, ids, graph, *_ = key
    return f"{path_label(key)} | prefetch {'on' if pf else 'off'} | ids {ids} | {graph}"


def _groups(points: Sequence[Point]) -> dict[tuple, list[Point]]:
    g: dict[tuple, list[Point]] = {}
    for p in points:
        g.setdefault(p.key, []).append(p)
    return g


def fit(points: Sequence[Point], rates: Rates) -> dict[tuple, PathFit]:
    computes = compute_fits(points)
    return {k: fit_path(ps, rates, computes) for k, ps in _groups(points).items()}


def leave_one_out(points: Sequence[Point], rates: Rates) -> list[LooCase]:
    """Refit each path without one of its measured steps and predict that step (paths measured
    once cannot be checked and are left out)."""
    out = []
    groups = _groups(points)
    for k, ps in groups.items():
        if len(ps) < 2:
            continue
        for i, held in enumerate(ps):
            rest = [p for j, p in enumerate(ps) if j != i]
            computes = compute_fits([p for p in points if p is not held])
            f = fit_path(rest, rates, computes)
            pred = predict(f, rates, rows=held.rows, table_bytes=held.table_bytes, compute_us=held.compute_us)
            out.append(LooCase(held.case_id, path_id(k), held.step_ms, pred.step_ms))
    return out


def build_model(records: Sequence[dict[str, Any]], metas: Sequence[dict[str, Any]], *,
                row_bytes: int | None = None, loo: bool = True) -> Model:
    """Calibrate and fit on ``records`` (each with ``_run_id``); ``row_bytes`` keeps only steps of
    that row size.  ``loo``: measure the leave-one-out error too."""
    rates = calibrate(records, metas)
    points = [p for p in step_points(records) if row_bytes is None or p.row_bytes == row_bytes]
    m = Model(rates, fit(points, rates), points)
    if loo:
        m.loo_cases = leave_one_out(points, rates)
        by: dict[str, list[LooCase]] = {}
        for c in m.loo_cases:
            by.setdefault(c.path, []).append(c)
        m.loo_by_path = {k: _stats(v) for k, v in by.items()}
        m.loo_overall = _stats(m.loo_cases)
    return m


def load_runs(run_dirs: Sequence[str | Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every record (tagged with ``_run_id``) and every meta.json of the run folders."""
    from ..results import load_meta, load_records

    records, metas = [], []
    for d in run_dirs:
        run_id = Path(d).name
        metas.append(load_meta(d))
        for r in load_records(d):
            r["_run_id"] = run_id
            records.append(r)
    return records, metas

