"""The offload verdict: the one rule, printed by every screen (the report's banner, summary.md,
``verdict.json``, advise's measured headline and ``--json``, compare's summary).

Its parts, also read by the plots (:func:`candidates`, :func:`scope`, :func:`picks`):

* stable: the step's coefficient of variation is at most :data:`STABLE_CV`, it is not flagged
  ``unstable``, and neither is its baseline.  The CV is read from the interquartile range
  (:func:`spread`: IQR / 1.349 / median, the CV of a normal law with that IQR), so that the
  few pre-empted samples of a host-timed step -- which lift the plain CV of a CPU-gather step
  to 0.3-0.9 while its median's noise stays under 1 % -- do not disqualify its median;
* a pinned step is held against the resident step that ``offload_overhead`` names
  (:class:`ple_bench.record.Peers`: ids on the device, the same workload, its fastest graph
  mode, the pinned step's own timer);
* :func:`scope` (the plots' default): the largest table that has stable steps, the id
  distribution with the most of them there, each compute length measured, the longest first.

It reads stored records only, so two runs that measured the same cases give the same verdict
for them, whatever else their suites held.

**The one verdict** (:func:`verdicts`): what every screen prints -- the report's banner,
summary.md, ``verdict.json`` beside the records, advise's measured headline and ``--json``,
compare's summary.  One :class:`Entry` per (table_bytes, compute, ids, num_tokens) where a pinned
decode step was measured:

* the best pinned option: of the stable pinned steps with a resident baseline (:func:`candidates`),
  the lowest ratio ``step_ms / offload_baseline_ms`` -- each held against the resident figure on
  its OWN timer (:class:`ple_bench.record.Peers`), so steps of different timers are never ranked
  by their absolute times;
* its 95 % interval: a seeded bootstrap (:data:`BOOTSTRAP_RESAMPLES` resamples, the seed from the
  two case ids: the same records give the same interval in every run folder) of the ratio of the
  two medians, from the kept raw samples (``samples_ms`` through :func:`ple_bench.results.kept_samples`;
  the baseline's samples of the figure it offers: its step, host-sync, full-graph samples);
* the verdict decided on the interval with the band :data:`EQUAL_PCT`: ``faster`` only where all
  of it lies below 1 - band; ``as fast`` where all of it lies at or below 1 + band (it may reach
  below 1 - band: not all of it does, so "faster" is not claimed); else ``slower``.  Records
  without samples (older runs) are decided on the point ratio, their interval left empty;
* ``no verdict`` (with the reason) where pinned steps were measured but no stable pair exists.

A functional (CPU) run has no performance verdict: :func:`verdicts` returns none and every screen
prints :data:`FUNCTIONAL_TEXT`; its ``verdict.json`` is ``{"functional": true, "verdicts": []}``.
"""

from __future__ import annotations

import json
import math
import os
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .record import as_record, device_resident
from .results import kept_samples
from .uncertainty import components, observations, ratio_interval as process_ratio_interval, ratio_observations
from .units import format_bytes

#: a step whose samples vary more than this (:func:`spread`) is not used for a verdict
STABLE_CV = 0.10
_IQR_PER_SIGMA = 1.349
#: an overhead up to EQUAL_PCT (in %) counts as "as fast as the resident table"; the serving verdict's
#: "equal" band too (ple_bench.serving.slo reads it here)
EQUAL_PCT = 5.0


@dataclass(frozen=True)
class Pick:
    """The pinned step chosen at one token count and the resident figure it is held against."""

    tokens: int
    record: Mapping[str, Any]
    baseline_ms: float
    baseline_case_id: str
    baseline_graph: str
    timer: str

    @property
    def step_ms(self) -> float:
        return float(as_record(self.record).step_ms)

    @property
    def overhead_pct(self) -> float:
        return 100.0 * (self.step_ms / self.baseline_ms - 1.0)

    @property
    def as_fast(self) -> bool:
        return self.overhead_pct <= EQUAL_PCT


def _by_id(records: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    return {str(r.get("case_id")): r for r in records}


def spread(rec: Mapping[str, Any]) -> float | None:
    """The CV a measurement's median is judged by: IQR / 1.349 / median (robust to the rare
    pre-empted sample), else the stored CV where a record has no IQR."""
    iqr, median = as_record(rec).iqr_ms, as_record(rec).median_ms
    if iqr is not None and median:
        return iqr / _IQR_PER_SIGMA / median
    return as_record(rec).cv


def stable(rec: Mapping[str, Any]) -> bool:
    cv = spread(rec)
    return not rec.get("unstable") and (cv is None or cv <= STABLE_CV)


def candidates(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Pinned ok steps with a baseline figure, stable, whose baseline is stable too."""
    records = [as_record(r) for r in records]
    ids = _by_id(records)
    out = []
    for r in records:
        if (r.get("kind") != "step" or r.get("status") != "ok" or device_resident(r)
                or as_record(r).offload_baseline_ms is None or as_record(r).step_ms is None):
            continue
        base = ids.get(str(r.get("offload_baseline")))
        if stable(r) and (base is None or stable(base)):
            out.append(r)
    return out


def unstable_candidates(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Pinned steps with a baseline left out of the verdict for their noise (named on the page)."""
    records = [as_record(r) for r in records]
    kept = {r.case_id for r in candidates(records)}
    return [r for r in records if r.kind == "step" and r.status == "ok" and not device_resident(r)
            and r.offload_baseline_ms is not None and r.case_id not in kept]


def compute_of(r: Mapping[str, Any]) -> Any:
    """The compute a step hides its lookup behind: ``compute_us`` of the matmul chain, or
    ``("decoder", shape, layers, context)`` for decoder layers (their time is measured, not set)."""
    if str(r.get("compute") or "matmul") == "decoder":
        return ("decoder", str(r.get("decoder_shape")), int(as_record(r).decoder_layers or 0),
                int(as_record(r).context_len or 0))
    return float(as_record(r).compute_us or 0.0)


def compute_label(c: Any) -> str:
    if isinstance(c, tuple):
        return f"{c[2]} {c[1]} decoder layers over a {c[3]}-token KV cache"
    return f"{c:g} us of compute"


def _longest_first(c: Any) -> tuple:
    return (1, c[2] * c[3], c) if isinstance(c, tuple) else (0, c, ())


@dataclass(frozen=True)
class Scope:
    table_bytes: int
    ids: str
    compute_us: tuple[Any, ...]  # compute_of values, longest first


def scope(cands: Sequence[Mapping[str, Any]], *, table_bytes: int | None = None, ids: str | None = None) -> Scope | None:
    """The table, id distribution and compute lengths a verdict covers (see the module doc)."""
    if table_bytes is None:
        sizes = [int(as_record(r).table_bytes or 0) for r in cands]
        if not sizes:
            return None
        table_bytes = max(sizes)
    at = [r for r in cands if int(as_record(r).table_bytes or 0) == table_bytes]
    if ids is None:
        counts = Counter(str(r.get("ids") or "uniform") for r in at)
        if not counts:
            return None
        ids = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
    at = [r for r in at if str(r.get("ids") or "uniform") == ids]
    computes = tuple(sorted({compute_of(r) for r in at}, key=_longest_first, reverse=True))
    return Scope(table_bytes, ids, computes) if at else None


def picks(cands: Sequence[Mapping[str, Any]], where: Scope, compute_us: Any) -> dict[int, Pick]:
    """tokens -> the fastest candidate (absolute step time) in ``where`` at ``compute_us``
    (a :func:`compute_of` value)."""
    best: dict[int, Mapping[str, Any]] = {}
    for r in cands:
        if (int(as_record(r).table_bytes or 0) != where.table_bytes or str(r.get("ids") or "uniform") != where.ids
                or compute_of(r) != compute_us):
            continue
        t = int(as_record(r).num_tokens or 0)
        if t not in best or float(r["step_ms"]) < float(best[t]["step_ms"]):
            best[t] = r
    return {t: Pick(t, r, float(r["offload_baseline_ms"]), str(r.get("offload_baseline")),
                    str(r.get("offload_baseline_graph")), str(r.get("offload_baseline_timer")))
            for t, r in sorted(best.items())}


def path_words(r: Mapping[str, Any]) -> str:
    """A pinned step's configuration in words: path, ids placement, graph mode, prefetch."""
    impl = str(r.get("impl"))
    kernel = r.get("kernel") or ""
    name = f"{impl} · {kernel}" if kernel else impl
    prefetch = "prefetched" if r.get("prefetch") else "serial"
    extra = r.get("extra")
    options = "".join(f", {k}={v}" for k, v in sorted(extra.items())) if isinstance(extra, dict) else ""
    return f"{name} (ids on the {r.get('ids_on') or 'device'}, {r.get('graph') or 'eager'}, {prefetch}{options})"


# ------------------------------------------------------------------ the one verdict

FASTER, AS_FAST, UNDECIDED, SLOWER, NO_VERDICT = "faster", "as fast", "undecided", "slower", "no verdict"
VERDICTS = (FASTER, AS_FAST, UNDECIDED, SLOWER, NO_VERDICT)
#: the primary path, named before anything is measured: the host placement's posted host gather
#: (the graph polls a flag per piece of rows; one piece), held against the HBM placement's
#: one-kernel gather.  Where a group measured it, the verdict is its; the other paths are shown
#: beside it with their own intervals and are never chosen as the minimum of many.
PRIMARY_IMPL = "pinned_host_flag"
PRIMARY_TEXT = "the posted host gather (pinned_host_flag, one piece)"
FUNCTIONAL_TEXT = "functional run: no performance verdict"
VERDICT_FILE = "verdict.json"
#: bootstrap resamples of each median (the interval's percentiles: 2.5 and 97.5)
BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95
#: the resident figure a baseline offers -> the raw samples it is the median of
_FIGURE_SAMPLES = (("step_ms", "samples_ms"), ("step_host_sync_ms", "step_host_sync_samples_ms"),
                   ("full_step_ms", "full_step_samples_ms"),
                   ("full_step_host_sync_ms", "full_step_host_sync_samples_ms"))


@dataclass(frozen=True)
class Entry:
    """The verdict at one (table, compute, ids, token count): see the module doc."""

    table_bytes: int
    compute: Any  # compute_of(): microseconds of the matmul chain, or ("decoder", shape, layers, context)
    ids: str
    num_tokens: int
    verdict: str
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    pinned_case_id: str | None = None
    resident_case_id: str | None = None
    reason: str | None = None  # why "no verdict"
    pinned: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    resident_ms: float | None = None
    resident_graph: str | None = None
    timer: str | None = None
    #: the worker processes the interval spans (1: a run's one worker, within which the interval holds)
    processes: int = 1
    #: the level the interval resamples at its top: "processes", "rounds" or "samples"
    level: str = "samples"
    #: the verdict's path is the primary one (:data:`PRIMARY_IMPL`); else the fastest of ``selected_from``
    primary: bool = False
    selected_from: int = 1
    #: how the path was chosen where it is not the primary (e.g. on half the processes)
    selection: str = ""
    #: the other stable pinned paths, each with its own ratio and interval (never chosen as the minimum)
    alternatives: tuple = field(default=(), compare=False)

    @property
    def pinned_ms(self) -> float | None:
        return as_record(self.pinned).step_ms if self.pinned is not None else None

    @property
    def path(self) -> str:
        return path_words(self.pinned) if self.pinned is not None else ""

    @property
    def ratio_text(self) -> str:
        """``0.98 (95 % CI 0.97-1.00)``; the point alone where the records have no samples."""
        if self.ratio is None:
            return ""
        if self.ci_low is None or self.ci_high is None:
            return f"{self.ratio:.3f} (no samples: no interval)"
        return f"{self.ratio:.3f} (95 % CI {self.ci_low:.3f}-{self.ci_high:.3f}, {self.span_text})"

    @property
    def span_text(self) -> str:
        """What the interval spans: ``4 processes``, or ``one process`` (it then says nothing of a rerun)."""
        if self.level == "processes":
            return f"{self.processes} processes"
        return "one process: a rerun may differ more"

    def to_json(self) -> dict[str, Any]:
        compute = (self.compute if not isinstance(self.compute, tuple)
                   else f"decoder:{self.compute[1]}:{self.compute[2]}x{self.compute[3]}")
        out = {"table_bytes": self.table_bytes, "compute": compute, "ids": self.ids, "num_tokens": self.num_tokens,
               "verdict": self.verdict, "ratio": self.ratio, "ci_low": self.ci_low, "ci_high": self.ci_high,
               "pinned_case_id": self.pinned_case_id, "resident_case_id": self.resident_case_id}
        out.update(processes=self.processes, interval_level=self.level, primary_path=self.primary,
                   selected_from=self.selected_from)
        if self.selection:
            out["selection"] = self.selection
        if self.alternatives:
            out["alternatives"] = [dict(a) for a in self.alternatives]
        if self.reason:
            out["reason"] = self.reason
        if self.timer:
            out["timer"] = self.timer
        return out


def is_functional(records: Iterable[Mapping[str, Any]]) -> bool:
    """Every record that says its mode says functional (a CPU run: its times are the CPU's)."""
    modes = {str(r.get("mode")) for r in records if r.get("mode")}
    return bool(modes) and modes <= {"functional"}


def decide(ci_low: float, ci_high: float, band_pct: float = EQUAL_PCT) -> str:
    """The verdict of a ratio interval (pinned / resident): see the module doc."""
    band = band_pct / 100.0
    if ci_high < 1.0 - band:
        return FASTER
    if ci_high <= 1.0 + band:
        return AS_FAST
    if ci_low > 1.0 + band:
        return SLOWER
    return UNDECIDED  # the interval straddles 1 + band: neither "as fast" nor "slower" is shown


def _samples(rec: Mapping[str, Any], key: str) -> list[float]:
    raw = rec.get(key)
    if not isinstance(raw, (list, tuple)):
        return []
    flags = rec.get("samples_throttled") if key == "samples_ms" else None
    vals = kept_samples([float(v) for v in raw if isinstance(v, (int, float))], flags if isinstance(flags, list) else None)
    return [v for v in vals if math.isfinite(v) and v > 0]


def resident_samples(base: Mapping[str, Any], ms: float) -> list[float]:
    """The kept raw samples of the resident figure ``ms`` that ``base`` offers (its step, its
    host-sync twin, its full graph on either timer): the list whose figure is ``ms``."""
    for ms_key, samples_key in _FIGURE_SAMPLES:
        v = as_record(base).get(ms_key)
        if v is not None and math.isclose(v, ms, rel_tol=1e-9, abs_tol=1e-12):
            got = _samples(base, samples_key)
            if not got and samples_key == "samples_ms":
                got = _samples(base, "step_samples_ms")
            return got
    return []


def _bootstrap_medians(values: Sequence[float], rng: np.random.Generator, resamples: int) -> np.ndarray:
    """``resamples`` medians of bootstrap resamples of ``values``, drawn exactly without
    building the resamples: a resample's k-th smallest value is ``sorted[floor(n * U)]`` with U the
    k-th of n uniforms, which is Beta(k, n - k + 1); the median of an even count is the mean of
    its two middle order statistics, the upper one drawn given the lower."""
    x = np.sort(np.asarray(values, dtype=float))
    n = x.size
    if n == 1:
        return np.full(resamples, x[0])
    k = (n + 1) // 2
    u = rng.beta(k, n - k + 1, size=resamples)
    lo = np.minimum((u * n).astype(int), n - 1)
    if n % 2:
        return x[lo]
    # the (k+1)-th given the k-th at u: u + (1 - u) * (the smallest of n - k uniforms)
    u2 = u + (1 - u) * rng.beta(1, n - k, size=resamples)
    hi = np.minimum((u2 * n).astype(int), n - 1)
    return (x[lo] + x[hi]) / 2


def ratio_interval(pinned: Sequence[float], resident: Sequence[float], seed_text: str,
                   resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float]:
    """The 95 % percentile-bootstrap interval of median(pinned) / median(resident): each sample
    set resampled with replacement ``resamples`` times (:func:`_bootstrap_medians`), the generator
    seeded from ``seed_text`` (deterministic)."""
    rng = np.random.default_rng(zlib.crc32(seed_text.encode()))
    ratios = _bootstrap_medians(pinned, rng, resamples) / _bootstrap_medians(resident, rng, resamples)
    tail = (1.0 - CONFIDENCE) / 2 * 100
    lo, hi = np.percentile(ratios, [tail, 100 - tail])
    return float(lo), float(hi)


def baseline_figure(base: Mapping[str, Any], ms: float, timer: str | None = None,
                     graph: str | None = None) -> str | None:
    """The field of ``base`` whose figure is ``ms`` (its step, host-sync twin or full graph), of the
    timer and graph mode the pinned step names where two figures read alike."""
    own_timer, own_graph = str(base.get("timer")), str(base.get("graph") or "eager")
    kinds = {"step_ms": (own_graph, own_timer), "step_host_sync_ms": (own_graph, "host_sync"),
             "full_step_ms": ("full", own_timer), "full_step_host_sync_ms": ("full", "host_sync")}
    found = []
    for ms_key, _samples_key in _FIGURE_SAMPLES:
        v = as_record(base).get(ms_key)
        if v is not None and math.isclose(v, ms, rel_tol=1e-9, abs_tol=1e-12):
            found.append(ms_key)
    for key in found:
        g, t = kinds[key]
        if (timer is None or t == timer) and (graph is None or g == graph):
            return key
    return found[0] if found else None


@dataclass(frozen=True)
class RatioInterval:
    low: float | None
    high: float | None
    processes: int = 1
    level: str = "samples"
    ratio: float | None = None  # the point the interval is about (None: the records' step_ms / offload_baseline_ms)


def ratio_detail(pinned: Mapping[str, Any], base: Mapping[str, Any] | None,
                 processes: Sequence[int] | None = None) -> RatioInterval:
    """The 95 % interval of a pinned step's ratio to the resident figure it names: over the
    processes both were measured in where both are repeated cases (:mod:`ple_bench.uncertainty`;
    ``processes``: only those), else from the two records' kept samples (one process)."""
    ms = as_record(pinned).offload_baseline_ms
    if base is not None and ms is not None:
        key = baseline_figure(base, float(ms), pinned.get("offload_baseline_timer"),
                               pinned.get("offload_baseline_graph"))
        reps_a, reps_b = pinned.get("replicates"), base.get("replicates")
        if key and isinstance(reps_a, list) and isinstance(reps_b, list) and reps_a and reps_b:
            a, b = observations(reps_a, "step_ms"), observations(reps_b, key)
            if processes is not None:
                a = [o for o in a if o.process in processes]
                b = [o for o in b if o.process in processes]
            got = process_ratio_interval(a, b, seed_text=f"{pinned.get('case_id')}|{base.get('case_id')}")
            if got is not None:
                return RatioInterval(got.low, got.high, got.processes, got.level,
                                     got.point if processes is not None else None)
    lo, hi = interval_of(pinned, base)
    return RatioInterval(lo, hi)


def ratio_rounds(e: "Entry", by_id: Mapping[str, Mapping[str, Any]]) -> list:
    """The per-round ratios (:class:`ple_bench.uncertainty.Obs`) behind a verdict of repeated cases:
    each round's pinned step over its resident figure; [] where the entry is not over processes."""
    base = by_id.get(str(e.resident_case_id)) if e.resident_case_id else None
    if e.pinned is None or base is None or e.resident_ms is None:
        return []
    figure = baseline_figure(base, e.resident_ms, e.timer, e.resident_graph)
    reps_a, reps_b = e.pinned.get("replicates"), base.get("replicates")
    if not figure or not isinstance(reps_a, list) or not isinstance(reps_b, list):
        return []
    return ratio_observations(observations(reps_a, "step_ms"), observations(reps_b, figure))


def ratio_components(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """pinned case id -> the variance components (:func:`ple_bench.uncertainty.components`) of each
    verdict's ratio that was measured over processes: what a machine profile keeps."""
    records = list(records)
    by_id = _by_id(records)
    out = {}
    for e in verdicts(records):
        comp = components(ratio_rounds(e, by_id))
        if comp is not None and e.pinned_case_id:
            out[e.pinned_case_id] = comp
    return out


def interval_of(pinned: Mapping[str, Any], base: Mapping[str, Any] | None) -> tuple[float | None, float | None]:
    """The 95 % interval of a pinned step's ratio to the resident figure it names
    (``offload_baseline_ms`` of ``base``), from both records' kept samples (within one process);
    (None, None) where either has none.  The point ratio always lies inside it."""
    ms, step = as_record(pinned).offload_baseline_ms, as_record(pinned).step_ms
    if base is None or ms is None or step is None:
        return None, None
    a = _samples(pinned, "samples_ms") or _samples(pinned, "step_samples_ms")
    b = resident_samples(base, float(ms))
    if not a or not b:
        return None, None
    lo, hi = ratio_interval(a, b, f"{pinned.get('case_id')}|{base.get('case_id')}")
    ratio = float(step) / float(ms)
    return min(lo, ratio), max(hi, ratio)


def newest_verdicts(records: Iterable[Mapping[str, Any]], run_key: str = "_run_id") -> list[Entry]:
    """:func:`verdicts` of records from several runs: each run judged on its own records (a
    baseline is its own run's), and per key the entry of the newest run (run ids sort by date)."""
    by_run: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        by_run.setdefault(str(r.get(run_key) or ""), []).append(r)
    chosen: dict[tuple, Entry] = {}
    for run_id in sorted(by_run):
        for e in verdicts(by_run[run_id]):
            chosen[(e.table_bytes, e.compute, e.ids, e.num_tokens)] = e
    return sorted(chosen.values(), key=_entry_order)


def key_of(r: Mapping[str, Any]) -> tuple[int, Any, str, int]:
    """(table_bytes, compute, ids, num_tokens): what one verdict is about."""
    return (int(as_record(r).table_bytes or 0), compute_of(r), str(r.get("ids") or "uniform"),
            int(as_record(r).num_tokens or 0))


def _entry_order(e: Entry) -> tuple:
    return (-e.table_bytes, tuple(-x if isinstance(x, (int, float)) else 0 for x in _longest_first(e.compute)[:2]),
            e.ids, e.num_tokens)


def _judge(key: tuple, pinned: list[Mapping[str, Any]], ids: Mapping[str, Mapping[str, Any]]) -> Entry:
    table, compute, dist, tokens = key
    with_base = [r for r in pinned if as_record(r).offload_baseline_ms is not None and as_record(r).step_ms is not None]
    if not with_base:
        notes = sorted({str(r.get("offload_baseline_note")) for r in pinned if r.get("offload_baseline_note")})
        why = "no resident step (ids on the device, same workload) was measured here"
        return Entry(table, compute, dist, tokens, NO_VERDICT, reason=why + (f" ({notes[0]})" if notes else ""))
    stable_ones = [r for r in with_base if stable(r) and (ids.get(str(r.get("offload_baseline"))) is None
                                                         or stable(ids[str(r.get("offload_baseline"))]))]
    if not stable_ones:
        return Entry(table, compute, dist, tokens, NO_VERDICT,
                     reason=f"the {len(with_base)} pinned steps with a resident baseline were all too noisy "
                            f"(IQR-based CV above {STABLE_CV:.0%} or unstable, theirs or their baseline's)")
    ratio_of = lambda r: float(r["step_ms"]) / float(r["offload_baseline_ms"])  # noqa: E731
    primaries = [r for r in stable_ones if r.get("impl") == PRIMARY_IMPL and not r.get("extra")]
    selection = ""
    if primaries:
        best = sorted(primaries, key=lambda r: (r.get("graph") != "full", -int(as_record(r).processes or 1),
                                                 str(r.get("case_id"))))[0]
        detail = ratio_detail(best, ids.get(str(best.get("offload_baseline"))))
    else:
        best, detail, selection = _select(stable_ones, ids, ratio_of)
    ratio = detail.ratio if detail.ratio is not None else ratio_of(best)
    base_id = str(best.get("offload_baseline"))
    lo, hi = detail.low, detail.high
    verdict_ = decide(lo, hi) if lo is not None and hi is not None else decide(ratio, ratio)
    alternatives = []
    for r in sorted(stable_ones, key=lambda r: str(r.get("case_id"))):
        if r is best:
            continue
        d = ratio_detail(r, ids.get(str(r.get("offload_baseline"))))
        alternatives.append({"path": path_words(r), "pinned_case_id": str(r.get("case_id")), "ratio": ratio_of(r),
                             "ci_low": d.low, "ci_high": d.high, "processes": d.processes,
                             "interval_level": d.level})
    return Entry(table, compute, dist, tokens, verdict_, ratio, lo, hi, str(best.get("case_id")), base_id,
                 pinned=best, resident_ms=float(best["offload_baseline_ms"]),
                 resident_graph=str(best.get("offload_baseline_graph")), timer=str(best.get("offload_baseline_timer")),
                 processes=detail.processes, level=detail.level, primary=bool(primaries),
                 selected_from=1 if primaries else len(stable_ones), selection=selection,
                 alternatives=tuple(alternatives))


def _process_ids(rec: Mapping[str, Any]) -> set[int]:
    reps = rec.get("replicates")
    return {int(e.get("process", 0)) for e in reps} if isinstance(reps, list) else set()


def _select(cands: list[Mapping[str, Any]], ids: Mapping[str, Mapping[str, Any]], ratio_of) -> tuple[Any, Any, str]:
    """Where no primary path was measured: the fastest of ``cands``.  Chosen as the minimum of many,
    its own interval would be too kind (the winner's curse); where every candidate and its baseline
    were measured in the same two or more processes, the path is chosen on the even-numbered
    processes and its ratio and interval are read from the odd-numbered ones alone."""
    procs = None
    for r in cands:
        base = ids.get(str(r.get("offload_baseline")))
        got = _process_ids(r) & (_process_ids(base) if base is not None else set())
        procs = got if procs is None else procs & got
    if len(cands) > 1 and procs and len(procs) >= 2:
        ordered = sorted(procs)
        pick_on, judge_on = ordered[0::2], ordered[1::2]

        def half_ratio(r):
            d = ratio_detail(r, ids.get(str(r.get("offload_baseline"))), processes=pick_on)
            return (d.ratio if d.ratio is not None else ratio_of(r), str(r.get("case_id")))

        best = min(cands, key=half_ratio)
        detail = ratio_detail(best, ids.get(str(best.get("offload_baseline"))), processes=judge_on)
        note = (f"the fastest of {len(cands)} paths on processes {', '.join(str(p + 1) for p in pick_on)}; "
                f"its ratio and interval from processes {', '.join(str(p + 1) for p in judge_on)} alone")
        return best, detail, note
    best = min(cands, key=lambda r: (ratio_of(r), str(r.get("case_id"))))
    note = (f"the fastest of {len(cands)} paths, its interval not corrected for the choice" if len(cands) > 1 else "")
    return best, ratio_detail(best, ids.get(str(best.get("offload_baseline")))), note


def verdicts(records: Iterable[Mapping[str, Any]]) -> list[Entry]:
    """The one verdict per (table, compute, ids, token count): see the module doc.  None for a
    functional run; largest table first, longest compute first, then ids and token counts."""
    records = [as_record(r) for r in records]
    if is_functional(records):
        return []
    ids = _by_id(records)
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for r in records:
        if r.get("kind") == "step" and r.get("status") == "ok" and not device_resident(r):
            groups.setdefault(key_of(r), []).append(r)
    return sorted((_judge(k, rs, ids) for k, rs in groups.items()), key=_entry_order)


def scope_label(table_bytes: int, compute: Any, ids: str) -> str:
    return f"{format_bytes(table_bytes)} table, {ids} ids, {compute_label(compute)}"


def entry_text(e: Entry) -> str:
    """One line: ``256 tokens: as fast -- <path> 0.2100 ms vs HBM 0.2120 ms (<graph> graph, <timer>), ratio ...``."""
    if e.verdict == NO_VERDICT:
        return f"{e.num_tokens} tokens: no verdict ({e.reason})"
    chosen = "the primary path" if e.primary else (e.selection or "the only stable path")
    return (f"{e.num_tokens} tokens: {e.verdict} -- {e.path} {e.pinned_ms:.4f} ms vs HBM {e.resident_ms:.4f} ms "
            f"({e.resident_graph} graph, {e.timer}), ratio {e.ratio_text}; {chosen}")


def alternative_text(a: Mapping[str, Any]) -> str:
    """One other path of an entry, with its own interval."""
    if a.get("ci_low") is None:
        return f"{a['path']}: {a['ratio']:.3f}"
    span = f"{a['processes']} processes" if a.get("interval_level") == "processes" else "one process"
    return f"{a['path']}: {a['ratio']:.3f} (95 % CI {a['ci_low']:.3f}-{a['ci_high']:.3f}, {span})"


def first_scope(entries: Sequence[Entry]) -> list[Entry]:
    """The entries the headline speaks of: the largest table, its longest compute, and there the
    id distribution with the most verdicts (ties: uniform, then by name)."""
    if not entries:
        return []
    first = entries[0]
    at = [e for e in entries if (e.table_bytes, e.compute) == (first.table_bytes, first.compute)]
    counts = Counter(e.ids for e in at if e.verdict != NO_VERDICT) or Counter(e.ids for e in at)
    dist = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0] != "uniform", kv[0]))[0][0]
    return [e for e in at if e.ids == dist]


def headline(entries: Sequence[Entry], functional: bool = False) -> str:
    """The one-sentence answer every screen opens with: per token count, the verdict at the
    first scope (largest table, longest compute, the ids with the most verdicts there)."""
    if functional:
        return FUNCTIONAL_TEXT
    if not entries:
        return ("no verdict: no decode step of a pinned table was measured (run the paths suite: "
                "python -m ple_bench run --suite paths)")
    at = first_scope(entries)
    first, dist = at[0], at[0].ids
    parts = [f"{e.num_tokens} tokens {e.verdict}" + (f" ({e.ratio:.2f}" + (
        f", {e.ci_low:.2f}-{e.ci_high:.2f})" if e.ci_low is not None else ")") if e.ratio is not None else "")
        for e in at]
    spans = sorted({e.processes if e.level == "processes" else 1 for e in at if e.ratio is not None})
    span = (f"over {spans[0]} processes" if spans and spans[0] > 1 and len(spans) == 1
            else "within one process" if spans == [1] else "over 1-{} processes".format(spans[-1]) if spans else "")
    path = "the posted host gather" if all(e.primary for e in at if e.verdict != NO_VERDICT) else "the best pinned path"
    return (f"{scope_label(first.table_bytes, first.compute, dist)}: {path} / HBM step time (95 % interval "
            f"{span}): " + "; ".join(parts) + ".")


def verdict_lines(entries: Sequence[Entry], functional: bool = False) -> list[str]:
    """The headline, then per scope one line per token count (the text every screen prints)."""
    lines = [headline(entries, functional)]
    scope_key = None
    for e in entries:
        k = (e.table_bytes, e.compute, e.ids)
        if k != scope_key:
            scope_key = k
            lines.append(f"{scope_label(*k)}:")
        lines.append("  " + entry_text(e))
        for a in e.alternatives:
            lines.append("      also: " + alternative_text(a))
    return lines


def verdict_document(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``verdict.json``'s content: ``{"verdicts": [...]}`` (and ``"functional": true`` for a CPU run)."""
    records = list(records)
    if is_functional(records):
        return {"functional": True, "verdict": FUNCTIONAL_TEXT, "verdicts": []}
    return {"verdicts": [e.to_json() for e in verdicts(records)]}


def write_verdict_json(run_dir: str | Path, records: Iterable[Mapping[str, Any]]) -> Path:
    """Write ``<run_dir>/verdict.json`` (atomically) from ``records``; returns its path."""
    path = Path(run_dir) / VERDICT_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(verdict_document(records), indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


__all__ = ["VERDICTS", "FASTER", "AS_FAST", "SLOWER", "NO_VERDICT", "FUNCTIONAL_TEXT", "VERDICT_FILE", "Entry",
           "verdicts", "newest_verdicts", "interval_of", "ratio_detail", "baseline_figure", "ratio_rounds", "ratio_components", "RatioInterval", "UNDECIDED", "PRIMARY_IMPL",
           "PRIMARY_TEXT", "alternative_text", "decide", "ratio_interval", "resident_samples", "is_functional", "headline",
           "verdict_lines", "entry_text", "scope_label", "first_scope", "verdict_document", "write_verdict_json", "key_of",
           "STABLE_CV", "EQUAL_PCT", "spread", "stable", "Pick", "Scope", "candidates", "unstable_candidates", "scope", "picks",
           "path_words", "compute_of", "compute_label"]
