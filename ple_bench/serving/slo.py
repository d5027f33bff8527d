"""The serving answer: tokens/s and TPOT per placement, at the batch each placement holds and at a
TPOT target -- the one serving verdict, read by the report, summary.md and ``advise --model``.

From ``kind = "serve"`` records (or from predicted points ``advise`` builds the same way), per
scenario -- model, context length, KV dtype, table size -- and per placement (``host``: the table in
pinned host memory; ``hbm``: the table resident):

* the points (``serve_batch``, ``step_ms``, ``tokens_per_s``, ``tpot_ms``), each labelled by where it
  comes from: ``measured``, ``predicted`` (a record's ``kv_source = "predicted"``, or advise's step
  model) or ``interpolated``;
* at the placement's largest batch: the point of the largest ``serve_batch`` (its ``max_batch``, the
  capacity rule's);
* at a TPOT target: the largest batch whose TPOT is at most the target -- a measured point, or one
  interpolated linearly in batch between the last point under the target and the next one over it
  (the batch rounded down, the step read off the same line), labelled ``interpolated``; none when
  even the smallest point is over the target.

:func:`answer_for` decides, for both placements, and :func:`serving_verdict` applies it to every
scenario of a set of records: the host/HBM ratio of tokens/s at the largest batch and at the
target, "equal" when the ratio is within :data:`EQUAL_PCT`, and the answer sentence.  A CPU
functional run has no serving verdict (its numbers check the code paths only).  Reads records only;
never measures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from ..record import num
from ..units import format_bytes

#: a host/HBM ratio within this (in %) of 1 counts as "equal": the lookup verdict's band
#: (:data:`ple_bench.verdict.EQUAL_PCT`), one threshold for both answers
from ..verdict import EQUAL_PCT  # noqa: E402
#: the TPOT target a report shows when none is asked (ms per output token)
DEFAULT_TPOT_MS = 30.0
PLACEMENTS = ("host", "hbm")
PLACEMENT_NAMES = {"host": "host", "hbm": "HBM"}


@dataclass(frozen=True)
class ServePoint:
    """One batch of one placement: a decode step of ``serve_batch`` sequences."""

    serve_batch: int
    step_ms: float
    source: str = "measured"  # measured | predicted | interpolated
    case_id: str = ""
    batch_fraction: float | None = None
    stored_tokens_per_s: float | None = None  # a record's ``tokens_per_s``, as stored
    #: a repeated case's 95 % interval of tokens/s over its processes (``tokens_per_s_ci_low/high``)
    tokens_per_s_ci: tuple[float, float] | None = None
    processes: int = 1

    @property
    def tokens_per_s(self) -> float:
        """The record's ``tokens_per_s``; for a point no record holds (interpolated, predicted) the
        same definition: one token per sequence per step."""
        if self.stored_tokens_per_s is not None:
            return self.stored_tokens_per_s
        return self.serve_batch / (self.step_ms / 1e3)

    @property
    def tpot_ms(self) -> float:
        return self.step_ms


@dataclass(frozen=True)
class Scenario:
    """What a serving answer holds for."""

    model: str
    context_len: int
    kv_dtype: str
    table_bytes: int | None = None

    @property
    def label(self) -> str:
        table = "" if not self.table_bytes else f", {format_bytes(self.table_bytes)} table"
        return f"{self.model}, {context_words(self.context_len)} context, {self.kv_dtype} KV{table}"


@dataclass(frozen=True)
class Placement:
    """One placement's curve: its points by batch, the batch it holds, and why none (skipped)."""

    placement: str
    points: tuple[ServePoint, ...]
    max_batch: int | None = None
    reason: str = ""  # why the placement has no point (a skipped case's reason, the capacity rule's)

    @property
    def name(self) -> str:
        return PLACEMENT_NAMES.get(self.placement, self.placement)

    @property
    def at_max(self) -> ServePoint | None:
        """The point of the largest batch."""
        return max(self.points, key=lambda p: p.serve_batch) if self.points else None

    def under(self, tpot_ms: float) -> ServePoint | None:
        """The largest batch whose TPOT is at most ``tpot_ms`` (see the module's doc); None when
        every point is over it."""
        pts = sorted(self.points, key=lambda p: p.serve_batch)
        ok = [p for p in pts if p.tpot_ms <= tpot_ms]
        if not ok:
            return None
        best = max(ok, key=lambda p: p.serve_batch)
        nxt = next((p for p in pts if p.serve_batch > best.serve_batch), None)
        if nxt is None or nxt.step_ms <= best.step_ms:
            return best
        frac = (tpot_ms - best.step_ms) / (nxt.step_ms - best.step_ms)
        batch = math.floor(best.serve_batch + frac * (nxt.serve_batch - best.serve_batch))
        if batch <= best.serve_batch:
            return best
        step = best.step_ms + (batch - best.serve_batch) / (nxt.serve_batch - best.serve_batch) * (
            nxt.step_ms - best.step_ms)
        source = "interpolated" if best.source == nxt.source == "measured" else "predicted"
        return ServePoint(batch, step, source)


@dataclass(frozen=True)
class Comparison:
    """host against HBM at one operating point (the largest batch, or the TPOT target)."""

    host: ServePoint | None
    hbm: ServePoint | None

    @property
    def ratio(self) -> float | None:
        """host tokens/s ÷ HBM tokens/s (None where either has no point)."""
        if self.host is None or self.hbm is None:
            return None
        return self.host.tokens_per_s / self.hbm.tokens_per_s

    @property
    def winner(self) -> str | None:
        """``host``, ``hbm`` or ``equal`` by :data:`EQUAL_PCT`; the one with a point when only one has."""
        if self.host is None and self.hbm is None:
            return None
        if self.host is None or self.hbm is None:
            return "host" if self.hbm is None else "hbm"
        r = self.ratio
        if abs(r - 1.0) * 100.0 <= EQUAL_PCT:
            return "equal"
        return "host" if r > 1.0 else "hbm"


@dataclass
class ServingAnswer:
    """The answer for one scenario (:func:`answer_for`)."""

    scenario: Scenario
    host: Placement
    hbm: Placement
    tpot_ms: float
    functional: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def at_max(self) -> Comparison:
        return Comparison(self.host.at_max, self.hbm.at_max)

    @property
    def at_target(self) -> Comparison:
        return Comparison(self.host.under(self.tpot_ms), self.hbm.under(self.tpot_ms))

    @property
    def verdict(self) -> str | None:
        """At the largest batch: ``host`` | ``hbm`` | ``equal`` (None for a functional run)."""
        return None if self.functional else self.at_max.winner

    @property
    def verdict_at_target(self) -> str | None:
        return None if self.functional else self.at_target.winner

    def sentence(self) -> str:
        """The answer in one line: each placement at its largest batch, the HBM figures beside the
        host's, the ratio, then the same under the TPOT target."""
        ctx = context_words(self.scenario.context_len)
        m = self.at_max
        parts = [_placement_words(self.host, m.host, ctx, first=True),
                 _placement_words(self.hbm, m.hbm, ctx, first=False)]
        head = f"{self.scenario.label}: " + "; ".join(parts)
        if not self.host.points and not self.hbm.points:
            return head + " → no step measured (advise --model predicts one)"
        if self.functional:
            return head + " -- CPU functional run: no serving verdict (these numbers check the code paths only)"
        head += " → " + _verdict_words(m)
        t = self.at_target
        target = _ms(self.tpot_ms)
        if t.host == m.host and t.hbm == m.hbm:  # said once: the target takes nothing away
            tail = f"the {target} ms TPOT target does not bind (each placement runs its largest batch under it)"
        elif t.host is None and t.hbm is None:
            tail = f"under {target} ms TPOT neither placement runs a batch (the smallest points are over it)"
        elif t.host is not None and t.hbm is not None and t.host.serve_batch == t.hbm.serve_batch:
            tail = (f"under {target} ms TPOT both run the same batch ({t.host.serve_batch}) → "
                    + _verdict_words(t, short=True))
        else:
            tail = (f"under {target} ms TPOT: {_target_words(self.host, t.host)}; {_target_words(self.hbm, t.hbm)}"
                    f" → {_verdict_words(t)}")
        return f"{head}; {tail}"

    def table(self) -> list[tuple[str, str, str, str]]:
        """(figure, host, HBM, host/HBM) rows: the HBM figure beside each host figure."""
        rows: list[tuple[str, str, str, str]] = []
        ratio = (lambda r: "") if self.functional else _ratio  # no verdict: no ratio
        for label, cmp in (("at the largest batch", self.at_max), (f"under {_ms(self.tpot_ms)} ms TPOT", self.at_target)):
            h, b = cmp.host, cmp.hbm
            rows.append((f"sequences {label}", _batch_cell(h), _batch_cell(b),
                         ratio(h.serve_batch / b.serve_batch) if h and b else ""))
            rows.append((f"tokens/s {label}", _tok(h.tokens_per_s) if h else "–", _tok(b.tokens_per_s) if b else "–",
                         ratio(cmp.ratio) if cmp.ratio is not None else ""))
            rows.append((f"TPOT ms {label}", _ms(h.tpot_ms) if h else "–", _ms(b.tpot_ms) if b else "–",
                         ratio(h.tpot_ms / b.tpot_ms) if h and b else ""))
        return rows

    def summary_cells(self) -> list[str]:
        """The scenario as one row of :data:`SUMMARY_HEADERS`: host / HBM in one cell, at the largest
        batch, then the tokens/s ratio under the target (each step's figures: summary.csv)."""
        m, t = self.at_max, self.at_target

        def pair(h: str, b: str) -> str:
            return f"{h} / {b}"

        def ratio(cmp: Comparison) -> str:
            return "–" if cmp.ratio is None or self.functional else _ratio(cmp.ratio)  # no verdict: no ratio

        h, b = m.host, m.hbm
        under = "–" if t.host == m.host and t.hbm == m.hbm else (
            f"{pair(_batch_cell(t.host), _batch_cell(t.hbm))}: {ratio(t)}")
        return [self.scenario.label, pair(_batch_cell(h), _batch_cell(b)),
                pair(_tok(h.tokens_per_s) if h else "–", _tok(b.tokens_per_s) if b else "–"),
                pair(_ms(h.tpot_ms) if h else "–", _ms(b.tpot_ms) if b else "–"), ratio(m),
                _ms(self.tpot_ms), under]

    def to_json(self) -> dict[str, Any]:
        def point(p: ServePoint | None) -> dict[str, Any] | None:
            return None if p is None else {"serve_batch": p.serve_batch, "step_ms": p.step_ms, "tpot_ms": p.tpot_ms,
                                           "tokens_per_s": p.tokens_per_s, "source": p.source,
                                           **({"tokens_per_s_ci": list(p.tokens_per_s_ci), "processes": p.processes}
                                              if p.tokens_per_s_ci else {})}

        return {"model": self.scenario.model, "context_len": self.scenario.context_len,
                "kv_dtype": self.scenario.kv_dtype, "table_bytes": self.scenario.table_bytes,
                "tpot_target_ms": self.tpot_ms, "functional": self.functional,
                "placements": {pl.placement: {"max_batch": pl.max_batch, "reason": pl.reason or None,
                                              "at_max": point(pl.at_max), "at_target": point(pl.under(self.tpot_ms)),
                                              "points": [point(p) for p in sorted(pl.points, key=lambda p: p.serve_batch)]}
                               for pl in (self.host, self.hbm)},
                "ratio_at_max": None if self.functional else self.at_max.ratio,
                "ratio_at_target": None if self.functional else self.at_target.ratio,
                "verdict": self.verdict, "verdict_at_target": self.verdict_at_target,
                "answer": self.sentence()}


#: the columns of :meth:`ServingAnswer.summary_cells` (the report's and summary.md's answer table)
#: the serving summary's columns (summary.md, the report): host / HBM side by side; "under the target":
#: the sequences each runs under the TPOT target and the tokens/s ratio there ("–": the target does
#: not bind).  Each served step's own figures are in summary.csv and the report's step table.
SUMMARY_HEADERS = ("scenario", "sequences host / HBM", "tok/s host / HBM", "TPOT ms host / HBM", "host/HBM tok/s",
                   "TPOT target ms", "under the target: sequences host / HBM, host/HBM tok/s")


# ---------------------------------------------------------------- words

def context_words(tokens: int) -> str:
    """8192 -> "8 K", 2048 -> "2 K", 32768 -> "32 K", 1000 -> "1000"."""
    return f"{tokens // 1024} K" if tokens >= 1024 and tokens % 1024 == 0 else str(tokens)


def _tok(v: float) -> str:
    """Tokens/s to 3 significant figures, thousands apart: 3 100, 1 900, 812, 12.3."""
    if v >= 100:
        digits = 3 - int(math.floor(math.log10(v))) - 1
        return f"{round(v, digits):,.0f}".replace(",", " ")
    return f"{v:.3g}"


def _ms(v: float) -> str:
    return f"{v:.1f}" if v >= 10 else f"{v:.3g}"


def _ratio(r: float) -> str:
    return f"{r:.2f}×"


def _batch_cell(p: ServePoint | None) -> str:
    if p is None:
        return "–"
    return f"{p.serve_batch}" + ("" if p.source == "measured" else f" ({p.source})")


def _label(p: ServePoint) -> str:
    return "" if p.source == "measured" else f" ({p.source})"


def _placement_words(pl: Placement, p: ServePoint | None, ctx: str, first: bool) -> str:
    if p is None:  # the rule gave it a batch the run did not measure (fp8 KV), or no batch at all
        what = "not measured" if pl.max_batch else "no batch fits"
        return f"{pl.name}: {what}" + (f" ({pl.reason})" if pl.reason else "")
    seqs = f"{p.serve_batch} sequences of {ctx} tokens" if first else f"{p.serve_batch} sequences"
    return f"{pl.name}: {seqs}, {_tok(p.tokens_per_s)} tok/s{_ci(p)} at {_ms(p.tpot_ms)} ms TPOT{_label(p)}"


def _ci(p: ServePoint) -> str:
    """`` (95 % CI a-b, k processes)`` for a repeated case's point, else nothing."""
    if p.tokens_per_s_ci is None:
        return ""
    lo, hi = p.tokens_per_s_ci
    return f" (95 % CI {_tok(lo)}-{_tok(hi)}, {p.processes} processes)"


def _target_words(pl: Placement, p: ServePoint | None) -> str:
    if p is None:
        smallest = min(pl.points, key=lambda q: q.serve_batch) if pl.points else None
        return (f"{pl.name} runs no batch under it" +
                (f" (its smallest, {smallest.serve_batch} sequences, takes {_ms(smallest.tpot_ms)} ms)"
                 if smallest else ""))
    return f"{pl.name} {p.serve_batch} sequences, {_tok(p.tokens_per_s)} tok/s at {_ms(p.tpot_ms)} ms{_label(p)}"


def _verdict_words(c: Comparison, short: bool = False) -> str:
    w = c.winner
    if w is None:
        return "no answer"
    if c.ratio is None:
        return f"only {PLACEMENT_NAMES[w]} serves"
    if w == "equal":
        return "equal" if short else f"equal (host/HBM {_ratio(c.ratio)})"
    r = c.ratio if w == "host" else 1.0 / c.ratio
    return f"{PLACEMENT_NAMES[w]} serves {_ratio(r)} the tokens/s"


# ---------------------------------------------------------------- from records

def _s(v: Any) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def serve_records(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in records if r.get("kind") == "serve"]


def scenario_of(r: Mapping[str, Any]) -> Scenario:
    table = num(r.get("table_bytes"))
    return Scenario(_s(r.get("model")), int(num(r.get("context_len")) or 0), _s(r.get("kv_dtype")) or "bf16",
                    int(table) if table else None)


def point_of(r: Mapping[str, Any]) -> ServePoint | None:
    """A measured (or, ``kv_source = "predicted"``, predicted) point of an ok serve record."""
    batch, step = num(r.get("serve_batch")), num(r.get("step_ms"))
    if r.get("status") != "ok" or not batch or not step or step <= 0:
        return None
    source = "predicted" if _s(r.get("kv_source")) == "predicted" else "measured"
    lo, hi = num(r.get("tokens_per_s_ci_low")), num(r.get("tokens_per_s_ci_high"))
    return ServePoint(int(batch), float(step), source, _s(r.get("case_id")), num(r.get("batch_fraction")),
                      num(r.get("tokens_per_s")), (lo, hi) if lo and hi else None,
                      int(num(r.get("processes")) or 1))


def placement_of(records: Sequence[Mapping[str, Any]], placement: str) -> Placement:
    """One placement's curve from its records (ok ones give points, skipped ones their reason)."""
    mine = [r for r in records if _s(r.get("placement")) == placement]
    pts: dict[int, ServePoint] = {}
    for r in mine:
        p = point_of(r)
        if p is not None:
            pts[p.serve_batch] = p  # the last record of a batch (a resumed run's newest)
    caps = [int(num(r.get("max_batch"))) for r in mine if num(r.get("max_batch")) is not None]
    reasons = [_s(r.get("reason")) for r in mine if r.get("status") != "ok" and _s(r.get("reason"))]
    reason = "" if pts else (reasons[0] if reasons else "not measured")
    return Placement(placement, tuple(sorted(pts.values(), key=lambda p: p.serve_batch)),
                     max(caps) if caps else None, reason)


def answer_for(scenario: Scenario, host: Placement, hbm: Placement, tpot_ms: float | None = None,
               functional: bool = False) -> ServingAnswer:
    """The serving verdict for one scenario: every screen (report, summary.md, advise) prints this."""
    return ServingAnswer(scenario, host, hbm, DEFAULT_TPOT_MS if tpot_ms is None else float(tpot_ms), functional)


def serving_verdict(records: Iterable[Mapping[str, Any]], tpot_ms: float | None = None) -> list[ServingAnswer]:
    """:func:`answer_for` for every scenario of the serve records (by model, context, KV dtype,
    table); [] when there are none."""
    serve = serve_records(records)
    scenarios: dict[Scenario, list[Mapping[str, Any]]] = {}
    for r in serve:
        scenarios.setdefault(scenario_of(r), []).append(r)
    out = []
    for sc in sorted(scenarios, key=lambda s: (s.model, s.kv_dtype, s.table_bytes or 0, s.context_len)):
        recs = scenarios[sc]
        functional = any(_s(r.get("mode")) == "functional" for r in recs)
        out.append(answer_for(sc, placement_of(recs, "host"), placement_of(recs, "hbm"), tpot_ms, functional))
    return out


__all__ = ["EQUAL_PCT", "DEFAULT_TPOT_MS", "SUMMARY_HEADERS", "ServePoint", "Scenario", "Placement", "Comparison", "ServingAnswer",
           "answer_for", "serving_verdict", "placement_of", "point_of", "scenario_of", "context_words"]
