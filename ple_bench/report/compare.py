"""Regression compare of stored runs: baseline vs candidate, one run or several a side.

Cases are matched by ``case_id``; only cases measured (status ok) on both sides
are compared.  Every sample list is first put through the record's throttle
filter (:func:`ple_bench.report.data.measured_samples`: the samples flagged
``samples_throttled`` are dropped, exactly as the run's own ``median_ms`` dropped
them), and the median shown and the samples tested are the *same* list.  An
older record that counts throttled samples without flagging them is compared on
all its samples, median and test alike, and the output says so.

Two modes, chosen by how many runs each side has:

* **Run medians** (at least :data:`MIN_RUNS` = 3 runs on *each* side,
  ``compare B1 B2 B3 --vs C1 C2 C3``).  A case's observations are its per-run
  medians.  The change is that of the median of run medians; a case is a
  **regression** only when it is slower by more than ``threshold_pct`` *and* a
  **one-sided** exact Mann-Whitney U test on the run medians (baseline
  stochastically faster than candidate) gives ``p <= alpha``; an **improvement**
  is the mirror image (the test in the other direction).  Why one-sided: the
  gate asks a directional question fixed before looking at the data ("did the
  candidate get slower?"), and a regression is called only when the slower-side
  test is significant, so the chance of failing the gate on a case that did not
  change is at most ``alpha`` -- the same for improvements, separately.  A
  two-sided test cannot work at the size nightly can afford: with 3 vs 3 runs
  its smallest exact p is 2/20 = 0.1, so no alpha below 0.1 could ever fire.
  One-sided, the smallest p is 1/C(6,3) = 0.05 -- reached only when every
  candidate run median is slower than every baseline run median -- so the
  default alpha here is :data:`RUNS_ALPHA` = 0.05; 4 vs 4 reaches 0.014, 5 vs 5
  0.004.  An alpha below the smallest attainable p is reported as a warning
  (nothing could be called).  A case with fewer than 3 ok runs on a side is
  **insufficient**.  Run medians are the honest unit: samples of one run share
  one process, one table allocation and one machine state (a pinned table's
  placement alone moves a run by up to ~12%, docs/nightly.md), so they are not
  independent; separate runs are.
* **Pooled samples** (1 or 2 runs on a side; ``compare BASE CAND`` is this
  mode, unchanged).  The runs' samples are pooled per side; the change is that
  of the pooled medians, and the test is a two-sided Mann-Whitney U on the pooled
  raw samples with ``p <= alpha`` (default 0.01) -- the asv rule.  The output
  says that samples within one run are not independent, so this p-value is
  optimistic (:data:`INDEPENDENCE_CAVEAT`).  Fewer than :data:`MIN_SAMPLES`
  samples on either side is **insufficient**.

In both modes a change over the threshold that is not significant is **noisy**;
a case ok on the baseline side (in any of its runs) that failed or was invalid
in any candidate run is **broken**.  A decode step whose compute was calibrated
to a different number of matmuls on the two sides (``compute_matmuls``: the
calibration picks the count per run, and on the H200 the same code gave 10 and
11 matmuls for 200 us in two runs) did not do the same work: its verdict is
**workload**, whatever its times, and it fails nothing.

Exit codes of the CLI (``python -m ple_bench compare BASE CAND`` or
``compare BASE... --vs CAND...``): 0 no regression; 1 at least one regression
or broken case; 2 bad input (missing run, no meta.json, no case measured on
both sides -- different suites with nothing in common is not a pass -- or a
bad command line).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence, Union

from .data import (BadRunError, Run, describe, fmt, load_run, measured_samples, num,
                   unflagged_throttled)

MIN_SAMPLES = 5  # pooled mode: fewer samples a side is "insufficient"
MIN_RUNS = 3  # run-median mode: runs a side needed (and ok runs a case needs)
SAMPLES_ALPHA = 0.01  # default alpha, pooled samples (two-sided)
RUNS_ALPHA = 0.05  # default alpha, run medians (one-sided; the floor at 3 vs 3 is 0.05)
VERDICTS = ("regression", "broken", "improvement", "noisy", "workload", "insufficient", "same")
INDEPENDENCE_CAVEAT = (
    "samples within one run are not independent (one process, one table allocation, one machine state), "
    "so the Mann-Whitney p-value on pooled samples is optimistic; for a verdict on run medians give at "
    f"least {MIN_RUNS} runs a side (compare B1 B2 B3 --vs C1 C2 C3)")

PathLike = Union[str, Path]


@dataclass
class CaseComparison:
    case_id: str
    label: str
    baseline_ms: float | None  # pooled median (samples) or median of run medians (runs)
    candidate_ms: float | None
    change_pct: float | None  # (candidate - baseline) / baseline * 100; > 0 is slower
    p_value: float | None
    n_baseline: int  # observations tested: samples (pooled) or run medians (runs)
    n_candidate: int
    verdict: str
    basis: str = "samples"  # "samples" | "runs"


@dataclass
class CompareResult:
    baselines: list[Run]
    candidates: list[Run]
    threshold_pct: float
    alpha: float
    mode: str = "samples"  # "samples" (pooled) | "runs" (run medians)
    cases: list[CaseComparison] = field(default_factory=list)
    only_in_baseline: list[str] = field(default_factory=list)
    only_in_candidate: list[str] = field(default_factory=list)
    broken: list[dict[str, Any]] = field(default_factory=list)  # ok in baseline, failed/invalid now
    not_compared: list[str] = field(default_factory=list)  # in both, not ok in both (e.g. skipped)
    warnings: list[str] = field(default_factory=list)

    @property
    def baseline(self) -> Run:
        return self.baselines[0]

    @property
    def candidate(self) -> Run:
        return self.candidates[0]

    @property
    def basis_text(self) -> str:
        nb, nc = len(self.baselines), len(self.candidates)
        if self.mode == "runs":
            return f"run medians of {nb} vs {nc} runs, one-sided Mann-Whitney U"
        return f"pooled samples of {nb} vs {nc} run{'s' if nc != 1 else ''}, two-sided Mann-Whitney U"

    @property
    def caveat(self) -> str | None:
        """What a reader must know about this comparison's p-values (pooled mode only)."""
        return INDEPENDENCE_CAVEAT if self.mode == "samples" else None

    def with_verdict(self, verdict: str) -> list[CaseComparison]:
        return [c for c in self.cases if c.verdict == verdict]

    @property
    def regressions(self) -> list[CaseComparison]:
        return self.with_verdict("regression")

    @property
    def improvements(self) -> list[CaseComparison]:
        return self.with_verdict("improvement")

    @property
    def exit_code(self) -> int:
        if self.regressions or self.broken:
            return 1
        if not self.cases:
            return 2
        return 0

    def summary(self) -> str:
        counts = {v: len(self.with_verdict(v)) for v in VERDICTS if v != "broken"}
        if not self.cases and not self.broken:
            return ("No case was measured in both runs: nothing to compare "
                    "(different suites with nothing in common is not a pass).")
        parts = [f"{len(self.cases)} cases compared"]
        parts += [f"{n} {v}{'s' if n != 1 and v in ('regression', 'improvement') else ''}"
                  for v, n in counts.items() if n]
        if self.broken:
            parts.append(f"{len(self.broken)} broken")
        head = "FAIL" if self.exit_code == 1 else "PASS"
        return (f"{head}: " + ", ".join(parts)
                + f" (threshold {self.threshold_pct:g}%, alpha {self.alpha:g}; {self.basis_text}).")


def mann_whitney_p(a: Sequence[float], b: Sequence[float], alternative: str = "two-sided") -> float:
    """Mann-Whitney U p-value of ``a`` vs ``b`` (scipy's ``alternative``: "less" = ``a`` tends to be
    smaller); 1.0 when the test cannot separate them (empty side, all values tied)."""
    from scipy.stats import mannwhitneyu

    if not a or not b:
        return 1.0
    if len(set(a) | set(b)) == 1:
        return 1.0
    p = float(mannwhitneyu(a, b, alternative=alternative).pvalue)
    return 1.0 if math.isnan(p) else p


def smallest_one_sided_p(n_a: int, n_b: int) -> float:
    """The smallest p an exact one-sided Mann-Whitney test can give with these sizes (complete separation)."""
    return 1.0 / math.comb(n_a + n_b, n_a) if n_a and n_b else 1.0


def _median_or_stored(samples: list[float], records: Sequence[dict[str, Any]]) -> float | None:
    if samples:
        return statistics.median(samples)
    stored = [m for m in (num(r.get("median_ms")) for r in records) if m is not None]
    return statistics.median(stored) if stored else None


def _change(base_ms: float | None, cand_ms: float | None) -> float | None:
    return (cand_ms - base_ms) / base_ms * 100 if base_ms and cand_ms is not None else None


def significant(p_value: float, alpha: float) -> bool:
    """``p <= alpha`` (the usual rejection rule; with an exact test the floor itself -- 1/20 at 3 vs 3
    runs -- must be reachable, so not ``<``), with a hair of tolerance for the floating-point p."""
    return p_value <= alpha * (1 + 1e-9)


def _verdict(change: float, p_value: float, threshold_pct: float, alpha: float) -> str:
    if abs(change) > threshold_pct and significant(p_value, alpha):
        return "regression" if change > 0 else "improvement"
    if abs(change) > threshold_pct:
        return "noisy"
    return "same"


def compare_pooled(bases: Sequence[dict[str, Any]], cands: Sequence[dict[str, Any]], threshold_pct: float,
                   alpha: float, min_samples: int = MIN_SAMPLES) -> CaseComparison:
    """One case, each side's runs' (throttle-filtered) samples pooled: pooled medians, two-sided test."""
    bs = [s for r in bases for s in measured_samples(r)]
    cs = [s for r in cands for s in measured_samples(r)]
    bm, cm = _median_or_stored(bs, bases), _median_or_stored(cs, cands)
    change = _change(bm, cm)
    p_value = None
    if len(bs) < min_samples or len(cs) < min_samples or change is None:
        verdict = "insufficient"
    else:
        p_value = mann_whitney_p(bs, cs)
        verdict = _verdict(change, p_value, threshold_pct, alpha)
    return CaseComparison(case_id=str(cands[-1].get("case_id")), label=_label(cands[-1]), baseline_ms=bm,
                          candidate_ms=cm, change_pct=change, p_value=p_value, n_baseline=len(bs),
                          n_candidate=len(cs), verdict=verdict, basis="samples")


def run_median(record: dict[str, Any]) -> float | None:
    """One run's observation of a case: the median of its throttle-filtered samples
    (the stored ``median_ms`` when the record kept no samples)."""
    return _median_or_stored(measured_samples(record), [record])


def compare_run_medians(bases: Sequence[dict[str, Any]], cands: Sequence[dict[str, Any]], threshold_pct: float,
                        alpha: float, min_runs: int = MIN_RUNS) -> CaseComparison:
    """One case, one observation per run (its run median): median of run medians, one-sided test
    in the direction of the change (see the module docstring for why)."""
    bmeds = [m for m in (run_median(r) for r in bases) if m is not None]
    cmeds = [m for m in (run_median(r) for r in cands) if m is not None]
    bm = statistics.median(bmeds) if bmeds else None
    cm = statistics.median(cmeds) if cmeds else None
    change = _change(bm, cm)
    p_value = None
    if len(bmeds) < min_runs or len(cmeds) < min_runs or change is None:
        verdict = "insufficient"
    elif change == 0:
        p_value, verdict = 1.0, "same"
    else:
        # change > 0: is the candidate slower (baseline stochastically less)?  < 0: faster?
        p_value = mann_whitney_p(bmeds, cmeds, alternative="less" if change > 0 else "greater")
        verdict = _verdict(change, p_value, threshold_pct, alpha)
    return CaseComparison(case_id=str(cands[-1].get("case_id")), label=_label(cands[-1]), baseline_ms=bm,
                          candidate_ms=cm, change_pct=change, p_value=p_value, n_baseline=len(bmeds),
                          n_candidate=len(cmeds), verdict=verdict, basis="runs")


def compare_case(base: dict[str, Any], cand: dict[str, Any], threshold_pct: float, alpha: float,
                 min_samples: int = MIN_SAMPLES) -> CaseComparison:
    """One case of one baseline run vs one candidate run (pooled mode)."""
    return compare_pooled([base], [cand], threshold_pct, alpha, min_samples)


def _label(record: dict[str, Any]) -> str:
    """What a case is, in a few words (the case id hides some axes in its hash)."""
    axes = ["kind", "impl", "dtype", "num_tokens"]
    if record.get("kind") == "step":
        axes += ["prefetch", "compute_us"]
    text = describe(record, axes)
    tp, etp, dp = (record.get(k) or 1 for k in ("tp", "etp", "dp"))
    if (tp, etp, dp) != (1, 1, 1):
        text += f" tp{tp} etp{etp} dp{dp}"
    return text


def _as_list(dirs: PathLike | Sequence[PathLike]) -> list[PathLike]:
    return [dirs] if isinstance(dirs, (str, Path)) else list(dirs)


def compare_runs(baseline_dirs: PathLike | Sequence[PathLike], candidate_dirs: PathLike | Sequence[PathLike],
                 threshold_pct: float = 5.0, alpha: float | None = None,
                 min_samples: int = MIN_SAMPLES) -> CompareResult:
    """Compare stored runs (one directory or a list a side); raises :class:`BadRunError` when one is
    not a run.  ``alpha`` defaults to :data:`SAMPLES_ALPHA` (pooled) or :data:`RUNS_ALPHA` (run medians)."""
    bdirs, cdirs = _as_list(baseline_dirs), _as_list(candidate_dirs)
    if not bdirs or not cdirs:
        raise ValueError("give at least one baseline run and one candidate run")
    mode = "runs" if len(bdirs) >= MIN_RUNS and len(cdirs) >= MIN_RUNS else "samples"
    if alpha is None:
        alpha = RUNS_ALPHA if mode == "runs" else SAMPLES_ALPHA
    if threshold_pct < 0:
        raise ValueError("threshold_pct must be >= 0")
    if not 0 < alpha < 1:
        raise ValueError("alpha must be in (0, 1)")
    bases, cands = [load_run(d) for d in bdirs], [load_run(d) for d in cdirs]
    result = CompareResult(baselines=bases, candidates=cands, threshold_pct=threshold_pct, alpha=alpha, mode=mode)
    b_by_id = _records_by_case(bases)
    c_by_id = _records_by_case(cands)
    result.only_in_baseline = sorted(set(b_by_id) - set(c_by_id))
    result.only_in_candidate = sorted(set(c_by_id) - set(b_by_id))
    for side, runs, other in (("baseline", bases, result.only_in_candidate),
                              ("candidate", cands, result.only_in_baseline)):
        for run in runs:  # a case whose line cannot be read is not "only in" the other side
            for lost in run.lost:
                if lost.case_id in other:
                    other.remove(lost.case_id)
                result.warnings.append(f"{side} {lost}" + (" -- not compared" if lost.case_id else ""))
    unflagged = 0
    for cid in sorted(set(b_by_id) & set(c_by_id)):
        b_ok = [r for r in b_by_id[cid] if r.get("status") == "ok"]
        c_ok = [r for r in c_by_id[cid] if r.get("status") == "ok"]
        c_bad = [r for r in c_by_id[cid] if r.get("status") in ("failed", "invalid")]
        if b_ok and c_bad:
            bad = c_bad[0]
            result.broken.append({"case_id": cid, "status": bad.get("status"), "reason": bad.get("reason") or ""})
        elif b_ok and c_ok:
            unflagged += any(unflagged_throttled(r) for r in b_ok + c_ok)
            if _matmuls(b_ok) != _matmuls(c_ok):
                cmp = compare_pooled(b_ok, c_ok, threshold_pct, alpha, min_samples)
                cmp.verdict = "workload"
                result.cases.append(cmp)
            elif mode == "runs":
                result.cases.append(compare_run_medians(b_ok, c_ok, threshold_pct, alpha))
            else:
                result.cases.append(compare_pooled(b_ok, c_ok, threshold_pct, alpha, min_samples))
        else:
            result.not_compared.append(cid)
    order = {v: i for i, v in enumerate(VERDICTS)}
    result.cases.sort(key=lambda c: (order[c.verdict], -abs(c.change_pct or 0.0), c.case_id))
    result.warnings = _warnings(bases, cands) + result.warnings
    if unflagged:
        result.warnings.append(
            f"{unflagged} compared case{'s have' if unflagged != 1 else ' has'} throttled samples that the record "
            "does not flag one by one (no samples_throttled: an older run); such a case is compared on all its "
            "samples, throttled ones included, in its median and its test alike.")
    if mode == "runs":
        floor = smallest_one_sided_p(len(bases), len(cands))
        if not significant(floor, alpha):
            result.warnings.append(
                f"alpha {alpha:g} is below the smallest p a one-sided exact Mann-Whitney test can give with "
                f"{len(bases)} vs {len(cands)} runs ({floor:.3g}): no case can be called a regression or an "
                "improvement; give more runs or a larger alpha.")
    return result


def _matmuls(records: Sequence[dict[str, Any]]) -> set:
    """The compute matmul counts a side's step records ran (empty for lookups)."""
    return {r.get("compute_matmuls") for r in records if r.get("kind") == "step" and r.get("compute_matmuls")}


def _records_by_case(runs: Sequence[Run]) -> dict[str, list[dict[str, Any]]]:
    """case_id -> that case's record in each run that has it (the last record of a run wins)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        for cid, rec in {r["case_id"]: r for r in run.records}.items():
            out.setdefault(cid, []).append(rec)
    return out


def _device(run: Run) -> str:
    d = run.meta.get("device")
    return str(d.get("name") if isinstance(d, dict) else d)


def _warnings(bases: Sequence[Run], cands: Sequence[Run]) -> list[str]:
    out = []
    runs = list(bases) + list(cands)

    def differ(what: str, values: list[str]) -> None:
        distinct = list(dict.fromkeys(values))
        if len(distinct) > 1:
            out.append(f"The runs {what} ({' vs '.join(distinct)}).")

    differ("were on different devices", [_device(r) for r in runs])
    differ("have different modes", [r.mode for r in runs])
    if any(r.mode == "functional" for r in runs):
        out.append("A CPU functional run (host timer) is involved: its times are not GPU performance.")
    differ("used different timers", [str(r.meta.get("timer")) for r in runs if r.meta.get("timer")])
    seen = set()
    for run in runs:
        if run.meta.get("status") not in (None, "complete") and run.path not in seen:
            seen.add(run.path)
            out.append(f"Run {run.run_id} has status “{run.meta.get('status')}”: it did not finish.")
    return out


# ------------------------------------------------------------------ output

def _runs_tag(runs: Sequence[Run]) -> str:
    return runs[0].run_id + (f"+{len(runs) - 1}" if len(runs) > 1 else "")


def default_html_name(result: CompareResult) -> str:
    """``compare-BASE-vs-CAND.html``; with several runs a side, the first one's id and ``+N`` more."""
    return f"compare-{_runs_tag(result.baselines)}-vs-{_runs_tag(result.candidates)}.html"


def rule_text(result: CompareResult) -> str:
    """The verdict rule of this comparison, in one sentence."""
    if result.mode == "runs":
        return (f"verdict on run medians ({len(result.baselines)} vs {len(result.candidates)} runs): a change of "
                f"the median of run medians beyond {result.threshold_pct:g}% and a one-sided exact Mann-Whitney "
                f"U test on the run medians with p <= {result.alpha:g} (smallest attainable p "
                f"{smallest_one_sided_p(len(result.baselines), len(result.candidates)):.3g}); throttled samples "
                "are dropped before each run's median")
    return (f"verdict on pooled samples ({len(result.baselines)} vs {len(result.candidates)} "
            f"run{'s' if len(result.candidates) != 1 else ''}): a median change beyond {result.threshold_pct:g}% "
            f"and a two-sided Mann-Whitney U test on the raw samples with p <= {result.alpha:g}; throttled "
            "samples are dropped from the median and the test alike")


def format_table(result: CompareResult, show_all: bool = False) -> str:
    """An aligned text table (changed cases, or every case with ``show_all``)."""
    n_head = "runs" if result.mode == "runs" else "n"
    header = ("verdict", "change", "p", "baseline ms", "candidate ms", n_head, "case")
    rows = []
    for c in result.cases:
        if not show_all and c.verdict == "same":
            continue
        rows.append((
            c.verdict,
            "" if c.change_pct is None else f"{c.change_pct:+.1f}%",
            "" if c.p_value is None else f"{c.p_value:.2g}",
            fmt(c.baseline_ms), fmt(c.candidate_ms), f"{c.n_baseline}/{c.n_candidate}", c.case_id,
        ))
    for b in result.broken:
        rows.append(("broken", "", "", "", "", "", f"{b['case_id']}  ({b['status']}: {b['reason']})"))
    lines = []
    if rows:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        right = {1, 2, 3, 4, 5}

        def line(cells: Sequence[str]) -> str:
            return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                             for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
        lines.append(line(header))
        lines.append(line(["-" * w for w in widths]))
        lines += [line(r) for r in rows]
    hidden = len(result.with_verdict("same")) if not show_all else 0
    if hidden:
        lines.append(f"({hidden} cases within {result.threshold_pct:g}% or not significant: same; --all shows them)")
    if result.only_in_baseline:
        lines.append(f"only in baseline ({len(result.only_in_baseline)}): " + ", ".join(result.only_in_baseline))
    if result.only_in_candidate:
        lines.append(f"only in candidate ({len(result.only_in_candidate)}): " + ", ".join(result.only_in_candidate))
    if result.not_compared:
        lines.append(f"in both but not measured in both ({len(result.not_compared)}): "
                     + ", ".join(result.not_compared))
    lines += [f"warning: {w}" for w in result.warnings]
    lines.append(f"rule: {rule_text(result)}")
    if result.caveat:
        lines.append(f"note: {result.caveat}")
    lines.append(result.summary())
    return "\n".join(lines)


def write_compare_html(result: CompareResult, out: str | Path) -> Path:
    from .html import Column, render_page

    runs = result.mode == "runs"
    test = "p (one-sided Mann–Whitney, run medians)" if runs else "p (Mann–Whitney, pooled samples)"
    columns = [
        Column("verdict", "verdict", "text"),
        Column("change_pct", "change %", formatter=lambda v: "" if v is None else f"{v:+.1f}%"),
        Column("case_id", "case", "text"),
        Column("baseline_ms", "baseline median of run medians ms" if runs else "baseline median ms"),
        Column("candidate_ms", "candidate median of run medians ms" if runs else "candidate median ms"),
        Column("p_value", test),
        Column("n_baseline", "baseline runs" if runs else "baseline samples"),
        Column("n_candidate", "candidate runs" if runs else "candidate samples"),
        Column("label", "what", "text"),
    ]
    rows = []
    for c in result.cases:
        rec = vars(c)
        cells = [{"text": c.verdict, "v": None, "cls": f"verdict-{c.verdict}"}] + [col.cell(rec) for col in columns[1:]]
        rows.append({"status": c.verdict, "cells": cells})
    code = result.exit_code
    banner = {0: "good", 1: "bad", 2: "warn"}[code]

    def ids(side: Sequence[Run]) -> str:
        return ", ".join(r.run_id for r in side)

    def devices(side: Sequence[Run]) -> str:
        return ", ".join(dict.fromkeys(_device(r) for r in side))

    html = render_page(
        "compare.html", base_id=ids(result.baselines), cand_id=ids(result.candidates),
        base_device=devices(result.baselines), cand_device=devices(result.candidates), summary=result.summary(),
        banner_class=banner, threshold=f"{result.threshold_pct:g}", alpha=f"{result.alpha:g}",
        min_samples=MIN_SAMPLES, min_runs=MIN_RUNS, mode=result.mode, n_base=len(result.baselines),
        n_cand=len(result.candidates), caveat=result.caveat,
        p_floor=f"{smallest_one_sided_p(len(result.baselines), len(result.candidates)):.3g}",
        warnings=result.warnings, columns=columns, rows=rows,
        verdicts=[v for v in VERDICTS if result.with_verdict(v)], broken=result.broken,
        only_base=result.only_in_baseline, only_cand=result.only_in_candidate,
        not_compared=result.not_compared,
    )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html, encoding="utf-8")
    return out


# --------------------------------------------------------------------- CLI

def add_compare_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="BASE CAND (two run directories, results/<run_id>), or with --vs: the baseline runs")
    parser.add_argument("--vs", nargs="+", metavar="CAND", default=None,
                        help=f"the candidate runs; the positional runs are then all baselines. With >= {MIN_RUNS} "
                             "runs a side the verdict is on run medians")
    parser.add_argument("--threshold", type=float, default=5.0, metavar="PCT",
                        help="smallest median change (in %%) that can count (default 5)")
    parser.add_argument("--alpha", type=float, default=None,
                        help=f"significance level of the Mann-Whitney U test (default {SAMPLES_ALPHA:g} on pooled "
                             f"samples, {RUNS_ALPHA:g} on run medians: one-sided, its floor at 3 vs 3 runs)")
    parser.add_argument("--reports-dir", default="reports", help="where the HTML diff goes (default: reports)")
    parser.add_argument("--out", default=None, help="HTML diff path (default: REPORTS_DIR/compare-BASE-vs-CAND.html)")
    parser.add_argument("--all", action="store_true", help="print unchanged cases too")
    return parser


def run_compare(args: argparse.Namespace) -> int:
    if args.vs is not None:
        baselines, candidates = list(args.runs), list(args.vs)
    elif len(args.runs) == 2:
        baselines, candidates = [args.runs[0]], [args.runs[1]]
    else:
        print(f"ple_bench compare: {len(args.runs)} runs given without --vs: give BASE CAND, "
              "or BASE1 BASE2 ... --vs CAND1 CAND2 ...", file=sys.stderr)
        return 2
    try:
        result = compare_runs(baselines, candidates, threshold_pct=args.threshold, alpha=args.alpha)
    except BadRunError as exc:
        print(f"ple_bench compare: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"ple_bench compare: {exc}", file=sys.stderr)
        return 2
    for label, side in (("baseline ", result.baselines), ("candidate", result.candidates)):
        for run in side:
            print(f"{label} {run.run_id}  ({run.path})")
    print(format_table(result, show_all=getattr(args, "all", False)))
    out = args.out or Path(args.reports_dir) / default_html_name(result)
    path = write_compare_html(result, out)
    print(f"HTML diff: {path}")
    code = result.exit_code
    if code == 2:
        print("ple_bench compare: no case measured in both runs; different suites with nothing in common "
              "is not a pass", file=sys.stderr)
    return code


def compare_main(argv: Sequence[str] | None = None) -> int:
    parser = add_compare_args(argparse.ArgumentParser(
        prog="ple_bench compare", description="Compare stored runs (threshold + Mann-Whitney U)"))
    return run_compare(parser.parse_args(argv))
