"""The offload verdict: one rule, read by the report's banner and by ``advise``.

Per token count, the fastest **stable** pinned decode step by absolute step time, held against
the resident step that ``offload_overhead`` names (:class:`ple_bench.record.Peers`: ids on the
device, the same workload, its fastest graph mode, the pinned step's own timer), within **one**
table size, **one** id distribution and **one** compute length:

* stable: the step's coefficient of variation is at most :data:`STABLE_CV`, it is not flagged
  ``unstable``, and neither is its baseline.  The CV is read from the interquartile range
  (:func:`spread`: IQR / 1.349 / median, the CV of a normal law with that IQR), so that the
  few pre-empted samples of a host-timed step -- which lift the plain CV of a CPU-gather step
  to 0.3-0.9 while its median's noise stays under 1 % -- do not disqualify its median;
* the scope when nothing is asked: the largest table that has such steps, the id distribution
  with the most of them there (ties: by name), and each compute length measured, the longest
  first;
* "as fast as HBM": an overhead of at most :data:`EQUAL_PCT`; "faster than HBM": at least
  :data:`EQUAL_PCT` below it at every token count of the answer.

It reads stored records only, so two runs that measured the same cases give the same verdict
for them, whatever else their suites held.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from ..record import device_resident, num
from ..serving.slo import EQUAL_PCT  # one "as fast" threshold, for the lookup and the serving verdict
from .data import fmt_bytes

#: a step whose samples vary more than this (:func:`spread`) is not used for a verdict
STABLE_CV = 0.10
_IQR_PER_SIGMA = 1.349
#: an overhead up to EQUAL_PCT (in %) counts as "as fast as the resident table"


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
        return float(num(self.record.get("step_ms")))

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
    iqr, median = num(rec.get("iqr_ms")), num(rec.get("median_ms"))
    if iqr is not None and median:
        return iqr / _IQR_PER_SIGMA / median
    return num(rec.get("cv"))


def stable(rec: Mapping[str, Any]) -> bool:
    cv = spread(rec)
    return not rec.get("unstable") and (cv is None or cv <= STABLE_CV)


def candidates(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Pinned ok steps with a baseline figure, stable, whose baseline is stable too."""
    records = list(records)
    ids = _by_id(records)
    out = []
    for r in records:
        if (r.get("kind") != "step" or r.get("status") != "ok" or device_resident(r)
                or num(r.get("offload_baseline_ms")) is None or num(r.get("step_ms")) is None):
            continue
        base = ids.get(str(r.get("offload_baseline")))
        if stable(r) and (base is None or stable(base)):
            out.append(r)
    return out


def unstable_candidates(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Pinned steps with a baseline left out of the verdict for their noise (named on the page)."""
    kept = {id(r) for r in candidates(records)}
    return [r for r in records if r.get("kind") == "step" and r.get("status") == "ok" and not device_resident(r)
            and num(r.get("offload_baseline_ms")) is not None and id(r) not in kept]


def compute_of(r: Mapping[str, Any]) -> Any:
    """The compute a step hides its lookup behind: ``compute_us`` of the matmul chain, or
    ``("decoder", shape, layers, context)`` for decoder layers (their time is measured, not set)."""
    if str(r.get("compute") or "matmul") == "decoder":
        return ("decoder", str(r.get("decoder_shape")), int(num(r.get("decoder_layers")) or 0),
                int(num(r.get("context_len")) or 0))
    return float(num(r.get("compute_us")) or 0.0)


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
        sizes = [int(num(r.get("table_bytes")) or 0) for r in cands]
        if not sizes:
            return None
        table_bytes = max(sizes)
    at = [r for r in cands if int(num(r.get("table_bytes")) or 0) == table_bytes]
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
        if (int(num(r.get("table_bytes")) or 0) != where.table_bytes or str(r.get("ids") or "uniform") != where.ids
                or compute_of(r) != compute_us):
            continue
        t = int(num(r.get("num_tokens")) or 0)
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
    return f"{name} (ids on the {r.get('ids_on') or 'device'}, {r.get('graph') or 'eager'}, {prefetch})"


def pick_text(p: Pick) -> str:
    return (f"{p.tokens} tokens: {path_words(p.record)} {p.step_ms:.4f} ms vs HBM {p.baseline_ms:.4f} ms "
            f"({p.baseline_graph} graph, {p.timer}), {p.overhead_pct:+.1f} %")


def holds_from(cands: Sequence[Mapping[str, Any]], where: Scope) -> float | None:
    """The shortest measured compute from which, at every longer one measured too, the best
    pinned step is as fast as HBM at every token count (None: at no compute measured)."""
    held = None
    for c in where.compute_us:  # longest first
        chosen = picks(cands, where, c)
        if chosen and all(p.as_fast for p in chosen.values()):
            held = c
        else:
            break
    return held


@dataclass(frozen=True)
class Verdict:
    """The answer in parts, for the report's banner (a sentence and a compact table) and its text."""

    head: str  # the one-sentence answer
    picks: tuple[Pick, ...]  # per token count at the longest compute, fewest tokens first
    others: tuple[str, ...]  # "<compute>: <tokens>: <cost>, ..." at the other compute lengths
    tail: str  # the compute it holds from

    @property
    def as_fast(self) -> bool:
        """Pinned host memory is as fast as HBM at every token count of the answer."""
        return all(p.as_fast for p in self.picks)

    @property
    def text(self) -> str:
        body = " Best pinned step per token count: " + "; ".join(pick_text(p) for p in self.picks) + "."
        if self.others:
            body += " At other compute lengths: " + "; ".join(self.others) + "."
        return self.head + body + " " + self.tail

    def rows(self) -> list[dict[str, str]]:
        """One row per token count: the pinned step against its HBM row, printed side by side."""
        return [{"tokens": str(p.tokens), "path": path_words(p.record), "step_ms": f"{p.step_ms:.4f}",
                 "hbm_ms": f"{p.baseline_ms:.4f}", "hbm_how": f"{p.baseline_graph} graph, {p.timer}",
                 "cost": f"{p.overhead_pct:+.1f} %", "as_fast": "yes" if p.as_fast else "no"}
                for p in self.picks]


def verdict(records: Iterable[Mapping[str, Any]]) -> Verdict | None:
    """The answer (None when the run has no stable pinned step with a baseline; see
    :func:`no_verdict_reason`)."""
    cands = candidates(records)
    where = scope(cands)
    if where is None:
        return None
    c0 = where.compute_us[0]
    chosen = picks(cands, where, c0)
    yes = all(p.as_fast for p in chosen.values())
    held = holds_from(cands, where)
    worst = max(chosen.values(), key=lambda p: p.overhead_pct)
    best = min(chosen.values(), key=lambda p: p.overhead_pct)
    if worst.overhead_pct <= -EQUAL_PCT:  # faster at every token count, by more than the equality band
        claim = (f"pinned host memory is faster than HBM (by {-worst.overhead_pct:.1f} % at {worst.tokens} "
                 f"tokens to {-best.overhead_pct:.1f} % at {best.tokens})")
    else:
        claim = (("pinned host memory is as fast as HBM" if yes else "HBM is faster")
                 + f" (within {EQUAL_PCT:.0f} %: {'yes' if yes else 'no'}, worst {worst.overhead_pct:+.1f} % at "
                 f"{worst.tokens} tokens)")
    head = (f"{fmt_bytes(where.table_bytes)} table, {where.ids} ids, {compute_label(c0)}: {claim}; "
            f"pinning frees {fmt_bytes(where.table_bytes)} of HBM.")
    others = []
    for c in where.compute_us[1:]:
        at = picks(cands, where, c)
        if at:
            others.append(f"{compute_label(c)}: " + ", ".join(f"{p.tokens}: {p.overhead_pct:+.1f} %" for p in at.values()))
    tail = (f"Holds from {compute_label(held)}." if held is not None else
            f"Not within {EQUAL_PCT:.0f} % at any compute length measured.")
    configs = {path_words(r) for r in cands if int(num(r.get("table_bytes")) or 0) == where.table_bytes
               and str(r.get("ids") or "uniform") == where.ids and compute_of(r) == c0}
    if len(configs) == 1:  # e.g. the default suite: one pinned step on its largest table
        tail += (f" Only one pinned configuration was measured here ({configs.pop()}): the paths suite "
                 "measures every path (python -m ple_bench run --suite paths).")
    return Verdict(head, tuple(chosen.values()), tuple(others), tail)


def no_verdict_reason(records: Iterable[Mapping[str, Any]]) -> str | None:
    """Why there is no verdict when pinned steps with a baseline exist but were all too noisy."""
    left = unstable_candidates(list(records))
    if left:
        return (f"No verdict: the {len(left)} pinned steps with a resident baseline were all too noisy "
                f"(IQR-based CV above {STABLE_CV:.0%} or unstable, theirs or their baseline's).")
    return None


def banner(records: Iterable[Mapping[str, Any]]) -> str | None:
    """The report's answer as one text (None when the run has no pinned step with a baseline)."""
    records = list(records)
    v = verdict(records)
    return v.text if v is not None else no_verdict_reason(records)


__all__ = ["STABLE_CV", "EQUAL_PCT", "spread", "stable", "Pick", "Scope", "candidates", "unstable_candidates", "scope", "picks",
           "path_words", "pick_text", "holds_from", "banner", "Verdict", "verdict", "no_verdict_reason", "compute_of", "compute_label"]
