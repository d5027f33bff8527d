"""Regression compare of stored runs: baseline vs candidate, one run or several a side.

Cases are matched by ``case_id``; only cases measured (status ok) on both sides
are compared.  Every sample list is first put through the record's throttle
filter (:func:`ple_bench.report.data.measured_samples`: the samples flagged
``samples_throttled`` are dropped, exactly as the run's own ``median_ms`` dropped
them), and the median shown and the samples tested are the *same* list.  An
older record that counts throttled samples without flagging them is compared on
all its samples, median and test alike, and the output says so.

**The timer is checked per case.**  Each record names the timer that took its
samples (``timer``: ``cuda_event``, events around calls queued behind a
launch-hiding spin -- what every record had before the host-sync timer, host
paths included; ``host_sync``, synchronized calls on the host clock;
``host_monotonic``, functional mode; nothing in the oldest skipped records).
A case whose baseline and candidate records were timed differently (or a side
whose runs mixed timers) is **not comparable**: the two numbers measure
different things (a host path moved from ``cuda_event`` to ``host_sync`` reads
-91 %), so it is listed with both timers named, never a regression or an
improvement, and it does not change the exit code.

Two modes, chosen by how many runs each side has:

* **Run medians** (at least :data:`MIN_RUNS` = 3 runs on *each* side,
  ``compare B1 B2 B3 --vs C1 C2 C3``).  A case's observations are its per-run
  medians.  The change is that of the median of run medians; a case is a
  **regression** only when it is slower by more than ``threshold_pct`` *and* a
  **one-sided** exact Mann-Whitney U test on the run medians (baseline
  stochastically faster than candidate) gives a **Holm-adjusted** ``p <= alpha``;
  an **improvement** is the mirror image (the test in the other direction).
  Why one-sided: the gate asks a directional question fixed before looking at
  the data ("did the candidate get slower?"); a two-sided exact test cannot get
  below 2/C(2n, n).  Why adjusted: one compare tests every case of the suite
  (23 in ``nightly``), and the gate fails when *any* of them is called, so the
  error to bound is the chance that a night with no change fails on some case
  (the family-wise error), not each case's own.  With per-case ``alpha`` = 0.05
  and 23 cases that chance is far above 5 % (``tests/test_compare.py::
  test_unchanged_nights_rarely_fail``; docs/nightly.md has the measured rates).
  **Holm** (not Benjamini-Hochberg) because a failed night is a family-wise
  event: Holm bounds the probability of *any* false regression by ``alpha``
  under every combination of changed and unchanged cases, with no assumption on
  how the cases' p-values depend on each other (cases of one run share the
  machine, so they are not independent); Benjamini-Hochberg bounds the expected
  *share* of false calls among the calls, which equals the family-wise error
  only when nothing changed and is looser whenever something did -- the right
  tool for screening many results, not for a pass/fail gate.  The family is the
  cases tested in this compare (run-median cases with a test; not the
  insufficient, workload or not-comparable ones); raw and adjusted p are shown.
  The exact test is discrete: its smallest p is 1/C(nb + nc, nb) (0.05 at 3 vs 3,
  0.014 at 4 vs 4, 0.004 at 5 vs 5, 0.0011 at 6 vs 6), and after Holm over m
  cases the smallest p must be <= alpha / m -- with 3 vs 3 runs nothing can ever
  be called, and for the 23 nightly cases at alpha 0.05 it takes 6 runs a side
  (:func:`runs_needed`); the output says so when the runs given cannot reach it.
  A case with fewer than 3 ok runs on a side is **insufficient**.  Run medians
  are the honest unit: samples of one run share one process, one table
  allocation and one machine state (a pinned table's placement alone moves a run
  by up to ~12 %, docs/nightly.md), so they are not independent; separate runs
  are.  ``p_adjust="none"`` (``--p-adjust none``) gives the per-case rule.
* **Pooled samples** (1 or 2 runs on a side; ``compare BASE CAND`` is this
  mode) -- **advisory**.  The runs' samples are pooled per side; the change is
  that of the pooled medians, and the test is a two-sided Mann-Whitney U on the
  pooled raw samples with ``p <= alpha`` (default 0.01, no adjustment) -- the asv
  rule.  Samples within one run are not independent, so this p-value is
  optimistic (:data:`INDEPENDENCE_CAVEAT`): the verdicts are printed with that
  note and a regression does not fail the compare (exit 0) unless
  ``strict_pooled`` (``--strict-pooled``) asks for the old gate.  Fewer than
  :data:`MIN_SAMPLES` samples on either side is **insufficient**.

In both modes a change over the threshold that is not significant is **noisy**;
a case ok on the baseline side (in any of its runs) that failed or was invalid
in any candidate run is **broken**.  A decode step whose compute was calibrated
to a different number of matmuls on the two sides (``compute_matmuls``: the
calibration picks the count per run, and on the H200 the same code gave 10 and
11 matmuls for 200 us in two runs) did not do the same work: its verdict is
**workload**, whatever its times, and it fails nothing.  When a run is in
functional mode (:attr:`ple_bench.report.data.Run.functional`, the check the
HTML report's "No verdict" uses) the times are the CPU's: every timed case is
**no verdict** and the compare says "No verdict: functional-mode runs time the
CPU, not the GPU".

Summaries as tables: :func:`summary_frame` (one row per case: case id, the axes
that differ across the cases, both times, both noises, change, raw and adjusted
p, and an nvbench_compare-like status from :data:`STATUS`), written as markdown
(``--markdown PATH``) and CSV (``--csv PATH``).  The history page of a results
directory (each case's run median over the ordered runs) is
:mod:`ple_bench.report.history` (``compare --history RESULTS_DIR``).

Exit codes of the CLI (``python -m ple_bench compare BASE CAND`` or
``compare BASE... --vs CAND...``): 0 no regression (pooled mode: whatever the
verdicts, unless ``--strict-pooled``; functional runs: no verdict); 1 a
regression on run medians (or pooled with ``--strict-pooled``), or a broken case
(in every mode: a case that stopped working is not a timing verdict); 2 bad input
(missing run, no meta.json, no case measured on both sides -- different suites
with nothing in common is not a pass -- or a bad command line).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence, Union

from .data import (AXES, BadRunError, Run, case_label, fmt, load_run, measured_samples,
                   median_or_stored, run_median, unflagged_throttled, varying_axes)
from .history import run_history
from .verdict import headline as offload_headline
from .verdict import is_functional, verdicts
from .html import Column, render_page
import numpy as np

MIN_SAMPLES = 5  # pooled mode: fewer samples a side is "insufficient"
MIN_RUNS = 3  # run-median mode: runs a side needed (and ok runs a case needs)
SAMPLES_ALPHA = 0.01  # default alpha, pooled samples (two-sided, advisory)
RUNS_ALPHA = 0.05  # default alpha, run medians (one-sided, family-wise after Holm)
P_ADJUST = ("holm", "none")  # run-median mode: multiplicity control across the tested cases
NOT_COMPARABLE = "not comparable"
NO_VERDICT = "no verdict"
VERDICTS = ("regression", "broken", "improvement", "noisy", NOT_COMPARABLE, "workload", NO_VERDICT,
            "insufficient", "same")
# The verdicts as nvbench_compare-like statuses (the markdown / CSV summaries).
STATUS = {"regression": "SLOW", "improvement": "FAST", "same": "SAME", "noisy": "NOISY",
          NOT_COMPARABLE: NOT_COMPARABLE, "workload": "WORKLOAD", NO_VERDICT: "NO VERDICT",
          "insufficient": "INSUFFICIENT", "broken": "BROKEN"}
TIMED_VERDICTS = ("regression", "improvement", "noisy", "same")  # verdicts a timing test decided
FUNCTIONAL_NO_VERDICT = "functional-mode runs time the CPU, not the GPU"
INDEPENDENCE_CAVEAT = (
    "samples within one run are not independent (one process, one table allocation, one machine state), "
    "so the Mann-Whitney p-value on pooled samples is optimistic; for a verdict on run medians give at "
    f"least {MIN_RUNS} runs a side (compare B1 B2 B3 --vs C1 C2 C3)")
UNRECORDED_TIMER = "unrecorded"

PathLike = Union[str, Path]


@dataclass
class CaseComparison:
    case_id: str
    label: str
    baseline_ms: float | None  # pooled median (samples) or median of run medians (runs)
    candidate_ms: float | None
    change_pct: float | None  # (candidate - baseline) / baseline * 100; > 0 is slower
    p_value: float | None  # raw
    n_baseline: int  # observations tested: samples (pooled) or run medians (runs)
    n_candidate: int
    verdict: str
    basis: str = "samples"  # "samples" | "runs"
    p_adjusted: float | None = None  # run medians: Holm-adjusted over the tested cases (= raw with "none")
    baseline_noise_pct: float | None = None  # 100 x std / mean of the observations (run medians or samples)
    candidate_noise_pct: float | None = None
    baseline_timer: str = ""
    candidate_timer: str = ""
    axes: dict[str, Any] = field(default_factory=dict)  # the candidate record's axes

    @property
    def timers_text(self) -> str:
        return f"baseline timer {self.baseline_timer}, candidate timer {self.candidate_timer}"


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
    p_adjust: str = "holm"
    strict_pooled: bool = False  # pooled mode: a regression fails (exit 1) as a run-median one does
    no_verdict: str | None = None  # why no timing verdict is given (functional-mode runs)

    @property
    def baseline(self) -> Run:
        return self.baselines[0]

    @property
    def candidate(self) -> Run:
        return self.candidates[0]

    @property
    def tested(self) -> list[CaseComparison]:
        """The cases in the multiplicity family: run-median cases that got a test."""
        return [c for c in self.cases if c.basis == "runs" and c.p_value is not None
                and c.verdict in TIMED_VERDICTS + (NO_VERDICT,)]

    @property
    def basis_text(self) -> str:
        nb, nc = len(self.baselines), len(self.candidates)
        if self.mode == "runs":
            adjust = f", Holm over {len(self.tested)} cases" if self.p_adjust == "holm" else ", per case"
            return f"run medians of {nb} vs {nc} runs, one-sided Mann-Whitney U{adjust}"
        return (f"pooled samples of {nb} vs {nc} run{'s' if nc != 1 else ''}, two-sided Mann-Whitney U, "
                f"{'strict' if self.strict_pooled else 'advisory'}")

    @property
    def advisory(self) -> bool:
        """Pooled verdicts that do not decide the exit code."""
        return self.mode == "samples" and not self.strict_pooled

    @property
    def caveat(self) -> str | None:
        """What a reader must know about this comparison's p-values (pooled mode only)."""
        return INDEPENDENCE_CAVEAT if self.mode == "samples" else None

    @property
    def advisory_text(self) -> str | None:
        if not self.advisory:
            return None
        return (f"advisory: {INDEPENDENCE_CAVEAT}. These verdicts do not fail the compare (exit 0 unless a case "
                "broke); --strict-pooled makes a regression exit 1")

    def with_verdict(self, verdict: str) -> list[CaseComparison]:
        return [c for c in self.cases if c.verdict == verdict]

    @property
    def regressions(self) -> list[CaseComparison]:
        return self.with_verdict("regression")

    @property
    def improvements(self) -> list[CaseComparison]:
        return self.with_verdict("improvement")

    @property
    def not_comparable(self) -> list[CaseComparison]:
        return self.with_verdict(NOT_COMPARABLE)

    @property
    def exit_code(self) -> int:
        if self.broken:
            return 1
        if not self.cases:
            return 2
        if self.regressions and not self.advisory:
            return 1
        return 0

    def offload_verdicts(self) -> list[str]:
        """Each run's offload verdict (report/verdict.py: the headline its report and advise print),
        baselines first: ``"<side> <run>: <headline>"``."""
        out = []
        for label, side in (("baseline", self.baselines), ("candidate", self.candidates)):
            for run in side:
                out.append(f"{label} {run.path.name}: "
                           + offload_headline(verdicts(run.records), is_functional(run.records) or run.functional))
        return out

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
        if self.exit_code == 1:
            head = "FAIL"
        elif self.no_verdict:
            head = "No verdict"
        elif self.advisory and self.regressions:
            head = "PASS (advisory)"
        else:
            head = "PASS"
        why = f" {self.no_verdict}." if self.no_verdict else ""
        return (f"{head}:{why} " + ", ".join(parts)
                + f" (threshold {self.threshold_pct:g}%, alpha {self.alpha:g}; {self.basis_text}).")


def mann_whitney_p(a: Sequence[float], b: Sequence[float], alternative: str = "two-sided") -> float:
    """Mann-Whitney U p-value of ``a`` vs ``b`` (scipy's ``alternative``: "less" = ``a`` tends to be
    smaller); 1.0 when the test cannot separate them (empty side, all values tied)."""
    from scipy.stats import mannwhitneyu  # scipy: heavy, only a test needs it

    if not a or not b:
        return 1.0
    if len(set(a) | set(b)) == 1:
        return 1.0
    p = float(mannwhitneyu(a, b, alternative=alternative).pvalue)
    return 1.0 if math.isnan(p) else p


def smallest_one_sided_p(n_a: int, n_b: int) -> float:
    """The smallest p an exact one-sided Mann-Whitney test can give with these sizes (complete separation)."""
    return 1.0 / math.comb(n_a + n_b, n_a) if n_a and n_b else 1.0


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order: the i-th smallest p times (m - i + 1),
    made monotone and capped at 1.  A case is significant at family-wise level alpha when its
    adjusted p <= alpha."""
    p = np.asarray(p_values, dtype=float)
    m = p.size
    if not m:
        return []
    order = np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = stepped
    return [float(v) for v in out]


def runs_needed(m: int, alpha: float) -> int:
    """The fewest runs a side (equal sides) at which Holm over ``m`` tested cases can call one case at
    ``alpha``: the smallest n with m / C(2n, n) <= alpha."""
    n = MIN_RUNS
    while not significant(max(m, 1) * smallest_one_sided_p(n, n), alpha):
        n += 1
    return n


def _change(base_ms: float | None, cand_ms: float | None) -> float | None:
    return (cand_ms - base_ms) / base_ms * 100 if base_ms and cand_ms is not None else None


def _noise_pct(values: Sequence[float]) -> float | None:
    """100 x std / mean of a side's observations (nvbench's noise: relative standard deviation)."""
    if len(values) < 2:
        return None
    arr = np.asarray(values, dtype=float)
    mean = float(arr.mean())
    return 100.0 * float(arr.std(ddof=1)) / mean if mean else None


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
    bm, cm = median_or_stored(bs, bases), median_or_stored(cs, cands)
    change = _change(bm, cm)
    p_value = None
    if len(bs) < min_samples or len(cs) < min_samples or change is None:
        verdict = "insufficient"
    else:
        p_value = mann_whitney_p(bs, cs)
        verdict = _verdict(change, p_value, threshold_pct, alpha)
    return _comparison(bases, cands, bm, cm, change, p_value, len(bs), len(cs), verdict, "samples",
                       _noise_pct(bs), _noise_pct(cs))


def compare_run_medians(bases: Sequence[dict[str, Any]], cands: Sequence[dict[str, Any]], threshold_pct: float,
                        alpha: float, min_runs: int = MIN_RUNS) -> CaseComparison:
    """One case, one observation per run (its run median): median of run medians, one-sided test
    in the direction of the change (see the module docstring for why).  The verdict here is on the
    raw p; :func:`compare_runs` decides it again on the adjusted p of the whole family."""
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
    return _comparison(bases, cands, bm, cm, change, p_value, len(bmeds), len(cmeds), verdict, "runs",
                       _noise_pct(bmeds), _noise_pct(cmeds))


def _comparison(bases, cands, bm, cm, change, p_value, nb, nc, verdict, basis, b_noise, c_noise) -> CaseComparison:
    last = cands[-1]
    return CaseComparison(case_id=str(last.get("case_id")), label=case_label(last), baseline_ms=bm, candidate_ms=cm,
                          change_pct=change, p_value=p_value, n_baseline=nb, n_candidate=nc, verdict=verdict,
                          basis=basis, baseline_noise_pct=b_noise, candidate_noise_pct=c_noise,
                          baseline_timer=timer_of(bases), candidate_timer=timer_of(cands),
                          axes={k: v for k, v in last.items() if k in AXES})


def compare_case(base: dict[str, Any], cand: dict[str, Any], threshold_pct: float, alpha: float,
                 min_samples: int = MIN_SAMPLES) -> CaseComparison:
    """One case of one baseline run vs one candidate run (pooled mode)."""
    return compare_pooled([base], [cand], threshold_pct, alpha, min_samples)


def timer_of(records: Sequence[dict[str, Any]]) -> str:
    """The timer a side's records of one case were taken with (``a+b`` when its runs mixed timers;
    ``unrecorded`` for a record that names none)."""
    return "+".join(sorted({str(r.get("timer") or UNRECORDED_TIMER) for r in records}))


def comparable_timers(bases: Sequence[dict[str, Any]], cands: Sequence[dict[str, Any]]) -> bool:
    """Both sides timed with one and the same timer."""
    b, c = timer_of(bases), timer_of(cands)
    return b == c and "+" not in b


def _as_list(dirs: PathLike | Sequence[PathLike]) -> list[PathLike]:
    return [dirs] if isinstance(dirs, (str, Path)) else list(dirs)


def compare_runs(baseline_dirs: PathLike | Sequence[PathLike], candidate_dirs: PathLike | Sequence[PathLike],
                 threshold_pct: float = 5.0, alpha: float | None = None,
                 min_samples: int = MIN_SAMPLES, p_adjust: str = "holm",
                 strict_pooled: bool = False) -> CompareResult:
    """Compare stored runs (one directory or a list a side); raises :class:`BadRunError` when one is
    not a run.  ``alpha`` defaults to :data:`SAMPLES_ALPHA` (pooled) or :data:`RUNS_ALPHA` (run medians);
    ``p_adjust``: ``holm`` (run medians: family-wise over the tested cases) or ``none`` (per case)."""
    bdirs, cdirs = _as_list(baseline_dirs), _as_list(candidate_dirs)
    if not bdirs or not cdirs:
        raise ValueError("give at least one baseline run and one candidate run")
    _check_options(threshold_pct, alpha, p_adjust)
    # its warnings name each lost line (printed with the table): not on stderr a second time
    return compare_loaded([load_run(d, warn=False) for d in bdirs], [load_run(d, warn=False) for d in cdirs],
                          threshold_pct, alpha,
                          min_samples, p_adjust, strict_pooled)


def _check_options(threshold_pct: float, alpha: float | None, p_adjust: str) -> None:
    if threshold_pct < 0:
        raise ValueError("threshold_pct must be >= 0")
    if alpha is not None and not 0 < alpha < 1:
        raise ValueError("alpha must be in (0, 1)")
    if p_adjust not in P_ADJUST:
        raise ValueError(f"p_adjust must be one of {', '.join(P_ADJUST)}, not {p_adjust!r}")


def compare_loaded(bases: Sequence[Run], cands: Sequence[Run], threshold_pct: float = 5.0,
                   alpha: float | None = None, min_samples: int = MIN_SAMPLES, p_adjust: str = "holm",
                   strict_pooled: bool = False) -> CompareResult:
    """:func:`compare_runs` on runs already loaded (or built in memory)."""
    if not bases or not cands:
        raise ValueError("give at least one baseline run and one candidate run")
    _check_options(threshold_pct, alpha, p_adjust)
    bases, cands = list(bases), list(cands)
    mode = "runs" if len(bases) >= MIN_RUNS and len(cands) >= MIN_RUNS else "samples"
    if alpha is None:
        alpha = RUNS_ALPHA if mode == "runs" else SAMPLES_ALPHA
    result = CompareResult(baselines=bases, candidates=cands, threshold_pct=threshold_pct, alpha=alpha, mode=mode,
                           p_adjust=p_adjust, strict_pooled=strict_pooled)
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
            if mode == "runs":
                cmp = compare_run_medians(b_ok, c_ok, threshold_pct, alpha)
            else:
                cmp = compare_pooled(b_ok, c_ok, threshold_pct, alpha, min_samples)
            if not comparable_timers(b_ok, c_ok):
                cmp.verdict, cmp.p_value = NOT_COMPARABLE, None
            elif _matmuls(b_ok) != _matmuls(c_ok):
                cmp = compare_pooled(b_ok, c_ok, threshold_pct, alpha, min_samples)
                cmp.verdict = "workload"
            result.cases.append(cmp)
        else:
            result.not_compared.append(cid)
    if mode == "runs":
        _adjust(result)
    if any(run.functional for run in bases + cands):
        result.no_verdict = FUNCTIONAL_NO_VERDICT
        for c in result.cases:
            if c.verdict in TIMED_VERDICTS:
                c.verdict = NO_VERDICT
    order = {v: i for i, v in enumerate(VERDICTS)}
    result.cases.sort(key=lambda c: (order[c.verdict], -abs(c.change_pct or 0.0), c.case_id))
    result.warnings = _warnings(bases, cands) + result.warnings
    if unflagged:
        result.warnings.append(
            f"{unflagged} compared case{'s have' if unflagged != 1 else ' has'} throttled samples that the record "
            "does not flag one by one (no samples_throttled: an older run); such a case is compared on all its "
            "samples, throttled ones included, in its median and its test alike.")
    if result.not_comparable:
        n = len(result.not_comparable)
        result.warnings.append(
            f"{n} case{'s were' if n != 1 else ' was'} timed with a different timer on the two sides: not comparable "
            "(listed with both timers; they fail nothing).")
    if mode == "runs" and not result.no_verdict:
        floor_warning = _floor_warning(result)
        if floor_warning:
            result.warnings.append(floor_warning)
    return result


def _adjust(result: CompareResult) -> None:
    """Decide the tested run-median cases again on their adjusted p (Holm over the family, or per case)."""
    family = result.tested
    raw = [c.p_value for c in family]
    adjusted = holm(raw) if result.p_adjust == "holm" else raw
    for c, p_adj in zip(family, adjusted):
        c.p_adjusted = p_adj
        if c.change_pct:
            c.verdict = _verdict(c.change_pct, p_adj, result.threshold_pct, result.alpha)


def _floor_warning(result: CompareResult) -> str | None:
    """Say so when the run counts cannot reach significance (the exact test is discrete)."""
    nb, nc = len(result.baselines), len(result.candidates)
    floor = smallest_one_sided_p(nb, nc)
    m = len(result.tested) if result.p_adjust == "holm" else 1
    if significant(m * floor, result.alpha):
        return None
    if m <= 1:
        return (f"alpha {result.alpha:g} is below the smallest p a one-sided exact Mann-Whitney test can give with "
                f"{nb} vs {nc} runs ({floor:.3g}): no case can be called a regression or an improvement; give "
                "more runs or a larger alpha.")
    return (f"no case can be called a regression or an improvement: with {nb} vs {nc} runs the smallest p a "
            f"one-sided exact Mann-Whitney test can give is {floor:.3g}, and Holm over the {m} tested cases needs "
            f"p <= {result.alpha:g}/{m} = {result.alpha / m:.3g} for the first call; "
            f"{runs_needed(m, result.alpha)} runs a side reach it (the smallest p is 1/C(2n, n)).")


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


def _folders_tag(runs: Sequence[Run]) -> str:
    name = "".join(c if c.isalnum() or c in "-_.+" else "_" for c in runs[0].path.name) or "run"
    return name + (f"+{len(runs) - 1}" if len(runs) > 1 else "")


def default_html_name(result: CompareResult) -> str:
    """``compare-BASE-vs-CAND.html`` named after the run FOLDERS (a copy of a run shares its
    meta.json's run id, not its folder name); with several runs a side, the first one and ``+N``."""
    return f"compare-{_folders_tag(result.baselines)}-vs-{_folders_tag(result.candidates)}.html"


def rule_text(result: CompareResult) -> str:
    """The verdict rule of this comparison, in one sentence."""
    if result.mode == "runs":
        nb, nc = len(result.baselines), len(result.candidates)
        m = len(result.tested)
        adjust = (f"Holm-adjusted over the {m} tested cases (family-wise error <= {result.alpha:g}) "
                  if result.p_adjust == "holm" else "per case, unadjusted ")
        return (f"verdict on run medians ({nb} vs {nc} runs): a change of the median of run medians beyond "
                f"{result.threshold_pct:g}% and a one-sided exact Mann-Whitney U test on the run medians with p "
                f"{adjust}<= {result.alpha:g} (smallest raw p {smallest_one_sided_p(nb, nc):.3g}); throttled "
                "samples are dropped before each run's median; a case timed differently on the two sides is not "
                "comparable")
    return (f"verdict on pooled samples ({len(result.baselines)} vs {len(result.candidates)} "
            f"run{'s' if len(result.candidates) != 1 else ''}): a median change beyond {result.threshold_pct:g}% "
            f"and a two-sided Mann-Whitney U test on the raw samples with p <= {result.alpha:g}; throttled "
            "samples are dropped from the median and the test alike; a case timed differently on the two sides "
            "is not comparable")


def _p(v: float | None) -> str:
    return "" if v is None else f"{v:.2g}"


def _case_text(c: CaseComparison) -> str:
    return f"{c.case_id}  ({c.timers_text})" if c.verdict == NOT_COMPARABLE else c.case_id


def format_table(result: CompareResult, show_all: bool = False) -> str:
    """An aligned text table (changed cases, or every case with ``show_all``)."""
    runs = result.mode == "runs"
    n_head = "runs" if runs else "n"
    header = ("verdict", "change", "p", "p adj", "baseline ms", "candidate ms", n_head, "case")
    rows = []
    for c in result.cases:
        if not show_all and c.verdict == "same":
            continue
        rows.append((
            c.verdict,
            "" if c.change_pct is None else f"{c.change_pct:+.1f}%",
            _p(c.p_value), _p(c.p_adjusted),
            fmt(c.baseline_ms), fmt(c.candidate_ms), f"{c.n_baseline}/{c.n_candidate}", _case_text(c),
        ))
    for b in result.broken:
        rows.append(("broken", "", "", "", "", "", "", f"{b['case_id']}  ({b['status']}: {b['reason']})"))
    if not runs:  # pooled mode: no adjusted p
        header = header[:3] + header[4:]
        rows = [r[:3] + r[4:] for r in rows]
    lines = []
    if rows:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        right = set(range(1, len(header) - 1))

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
    if result.advisory_text:
        lines.append(result.advisory_text)
    elif result.caveat:
        lines.append(f"note: {result.caveat}")
    lines += [f"offload verdict, {v}" for v in result.offload_verdicts()]
    lines.append(result.summary())
    return "\n".join(lines)


def _slug(verdict: str) -> str:
    return verdict.replace(" ", "-")


def _timer_cell(rec: dict[str, Any]) -> str:
    """One timer, or ``baseline → candidate`` when they differ."""
    b, c = rec["baseline_timer"], rec["candidate_timer"]
    return b if b == c else f"{b} → {c}"


def write_compare_html(result: CompareResult, out: str | Path) -> Path:
    runs = result.mode == "runs"
    test = "p (one-sided Mann–Whitney, run medians)" if runs else "p (Mann–Whitney, pooled samples)"
    columns = [
        Column("verdict", "verdict", "text"),
        Column("change_pct", "change %", formatter=lambda v: "" if v is None else f"{v:+.1f}%"),
        Column("case_id", "case", "text"),
        Column("baseline_ms", "baseline median of run medians ms" if runs else "baseline median ms"),
        Column("candidate_ms", "candidate median of run medians ms" if runs else "candidate median ms"),
        Column("p_value", test),
    ]
    if runs:
        columns.append(Column("p_adjusted", "p adjusted (Holm)" if result.p_adjust == "holm" else "p (unadjusted)",
                              help="the p the verdict used"))
    columns += [
        Column("baseline_noise_pct", "baseline noise %", formatter=lambda v: "" if v is None else f"{v:.1f}%",
               help="std / mean of the " + ("run medians" if runs else "samples")),
        Column("candidate_noise_pct", "candidate noise %", formatter=lambda v: "" if v is None else f"{v:.1f}%"),
        Column("n_baseline", "baseline runs" if runs else "baseline samples"),
        Column("n_candidate", "candidate runs" if runs else "candidate samples"),
        Column("timer", "timer", "text", getter=_timer_cell),
        Column("label", "what", "text"),
    ]
    rows = []
    for c in result.cases:
        rec = vars(c)
        cells = [{"text": c.verdict, "v": None, "cls": f"verdict-{_slug(c.verdict)}"}]
        cells += [col.cell(rec) for col in columns[1:]]
        rows.append({"status": c.verdict, "cells": cells})
    code = result.exit_code
    banner = {0: "good", 1: "bad", 2: "warn"}[code]
    if code == 0 and (result.no_verdict or (result.advisory and result.regressions)):
        banner = "warn"

    def ids(side: Sequence[Run]) -> str:
        return ", ".join(r.run_id for r in side)

    def devices(side: Sequence[Run]) -> str:
        return ", ".join(dict.fromkeys(_device(r) for r in side))

    html = render_page(
        "compare.html", base_id=ids(result.baselines), cand_id=ids(result.candidates),
        base_device=devices(result.baselines), cand_device=devices(result.candidates), summary=result.summary(),
        offload=result.offload_verdicts(),
        banner_class=banner, threshold=f"{result.threshold_pct:g}", alpha=f"{result.alpha:g}",
        min_samples=MIN_SAMPLES, min_runs=MIN_RUNS, mode=result.mode, n_base=len(result.baselines),
        n_cand=len(result.candidates), caveat=result.caveat, advisory=result.advisory,
        p_adjust=result.p_adjust, n_tested=len(result.tested), no_verdict=result.no_verdict,
        p_floor=f"{smallest_one_sided_p(len(result.baselines), len(result.candidates)):.3g}",
        warnings=result.warnings, columns=columns, rows=rows,
        verdicts=[v for v in VERDICTS if result.with_verdict(v)], broken=result.broken,
        not_comparable=result.not_comparable,
        only_base=result.only_in_baseline, only_cand=result.only_in_candidate,
        not_compared=result.not_compared,
    )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html, encoding="utf-8")
    return out


# ----------------------------------------------------------- machine-readable summaries

def summary_frame(result: CompareResult):
    """One row per case, as nvbench_compare prints them: ``case_id``, the axes that differ across the
    compared cases, both times (ms), both noises (%), the change (%), raw and adjusted p and a status
    (:data:`STATUS`), plus a note (both timers of a not-comparable case, a broken case's reason).
    A pandas DataFrame (what :func:`write_csv` and :func:`write_markdown` write)."""
    import pandas as pd  # pandas: heavy, only the CSV/markdown tables

    axes = varying_axes([c.axes for c in result.cases], exclude=("seed",))
    rows = []
    for c in result.cases:
        note = c.timers_text if c.verdict == NOT_COMPARABLE else (
            "compute calibrated to different matmul counts" if c.verdict == "workload" else "")
        rows.append({"case_id": c.case_id, **{a: c.axes.get(a) for a in axes},
                     "baseline_ms": c.baseline_ms, "baseline_noise_pct": c.baseline_noise_pct,
                     "candidate_ms": c.candidate_ms, "candidate_noise_pct": c.candidate_noise_pct,
                     "change_pct": c.change_pct, "p": c.p_value, "p_adjusted": c.p_adjusted,
                     "status": STATUS[c.verdict], "note": note})
    for b in result.broken:
        rows.append({"case_id": b["case_id"], "status": STATUS["broken"], "note": f"{b['status']}: {b['reason']}"})
    columns = ["case_id", *axes, "baseline_ms", "baseline_noise_pct", "candidate_ms", "candidate_noise_pct",
               "change_pct", "p", "p_adjusted", "status", "note"]
    return pd.DataFrame(rows, columns=columns)


def write_csv(result: CompareResult, out: str | Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    summary_frame(result).to_csv(out, index=False)
    return out


def _md_cell(column: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if column in ("change_pct",):
        return f"{value:+.1f}%"
    if column.endswith("_pct"):
        return f"{value:.1f}%"
    if column in ("p", "p_adjusted"):
        return f"{value:.3g}"
    if column.endswith("_ms"):
        return fmt(value)
    return str(value).replace("|", "\\|").replace("\n", " ")


_MD_HEADERS = {"baseline_ms": "baseline ms", "baseline_noise_pct": "baseline noise", "candidate_ms": "candidate ms",
               "candidate_noise_pct": "candidate noise", "change_pct": "change", "p_adjusted": "p adjusted"}


def markdown_summary(result: CompareResult) -> str:
    """The summary line, the rule, any advisory and warnings, then the :func:`summary_frame` table."""
    df = summary_frame(result)
    lines = [f"## ple_bench compare: {_runs_tag(result.baselines)} vs {_runs_tag(result.candidates)}", "",
             f"**{result.summary()}**", "", f"Rule: {rule_text(result)}.", ""]
    lines += [f"- offload verdict, {v}" for v in result.offload_verdicts()]
    if result.advisory_text:
        lines += ["", f"*{result.advisory_text}.*"]
    if result.warnings:
        lines += [""] + [f"- warning: {w}" for w in result.warnings]
    lines += ["", "| " + " | ".join(_MD_HEADERS.get(c, c) for c in df.columns) + " |",
              "|" + "|".join("---" for _ in df.columns) + "|"]
    for rec in df.to_dict("records"):
        lines.append("| " + " | ".join(_md_cell(c, rec[c]) for c in df.columns) + " |")
    return "\n".join(lines) + "\n"


def write_markdown(result: CompareResult, out: str | Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown_summary(result), encoding="utf-8")
    return out


# --------------------------------------------------------------------- CLI

def add_compare_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("runs", nargs="*", metavar="RUN",
                        help="BASE CAND (two run directories, results/<run_id>), or with --vs: the baseline runs "
                             "(with --history: the baseline runs whose band is shaded)")
    parser.add_argument("--vs", nargs="+", metavar="CAND", default=None,
                        help=f"the candidate runs; the positional runs are then all baselines. With >= {MIN_RUNS} "
                             "runs a side the verdict is on run medians")
    parser.add_argument("--threshold", type=float, default=5.0, metavar="PCT",
                        help="smallest median change (in %%) that can count (default 5)")
    parser.add_argument("--alpha", type=float, default=None,
                        help=f"significance level (default {RUNS_ALPHA:g} on run medians: family-wise after Holm; "
                             f"{SAMPLES_ALPHA:g} on pooled samples)")
    parser.add_argument("--p-adjust", choices=P_ADJUST, default="holm",
                        help="run medians: holm (default; the chance that an unchanged night fails on any case is "
                             "<= alpha) or none (per case)")
    parser.add_argument("--strict-pooled", action="store_true",
                        help="pooled samples (< 3 runs a side): exit 1 on a regression (default: advisory, exit 0)")
    parser.add_argument("--reports-dir", default="reports", help="where the HTML goes (default: reports)")
    parser.add_argument("--out", default=None, help="HTML path (default: REPORTS_DIR/compare-BASE-vs-CAND.html; "
                                                    "--history: REPORTS_DIR/history-SUITE.html)")
    parser.add_argument("--markdown", default=None, metavar="PATH",
                        help="also write the per-case summary as a markdown table (status SAME/FAST/SLOW/NOISY/...)")
    parser.add_argument("--csv", default=None, metavar="PATH", help="also write the same table as CSV")
    parser.add_argument("--all", action="store_true", help="print unchanged cases too")
    parser.add_argument("--history", default=None, metavar="RESULTS_DIR",
                        help="instead of a compare: plot each case's run median over the runs kept in RESULTS_DIR "
                             "(oldest to newest, commit on the x axis, the baseline runs' band shaded) into one HTML")
    parser.add_argument("--suite", default=None,
                        help="--history: the suite to plot (default: the baseline's, else the newest run's)")
    parser.add_argument("--history-last", type=int, default=0, metavar="N",
                        help="--history: only the newest N runs (default: all)")
    return parser


def run_compare(args: argparse.Namespace) -> int:
    if getattr(args, "history", None):
        return run_history(args)
    if args.vs is not None:
        baselines, candidates = list(args.runs), list(args.vs)
        if not baselines:
            print("ple_bench compare: --vs needs the baseline runs before it", file=sys.stderr)
            return 2
    elif len(args.runs) == 2:
        baselines, candidates = [args.runs[0]], [args.runs[1]]
    else:
        print(f"ple_bench compare: {len(args.runs)} runs given without --vs: give BASE CAND, "
              "or BASE1 BASE2 ... --vs CAND1 CAND2 ... (or --history RESULTS_DIR)", file=sys.stderr)
        return 2
    try:
        result = compare_runs(baselines, candidates, threshold_pct=args.threshold, alpha=args.alpha,
                              p_adjust=args.p_adjust, strict_pooled=args.strict_pooled)
    except (BadRunError, ValueError) as exc:
        print(f"ple_bench compare: {exc}", file=sys.stderr)
        return 2
    for label, side in (("baseline ", result.baselines), ("candidate", result.candidates)):
        for run in side:
            print(f"{label} {run.run_id}  ({run.path})")
    print(format_table(result, show_all=getattr(args, "all", False)))
    out = args.out or Path(args.reports_dir) / default_html_name(result)
    try:
        print(f"HTML diff: {write_compare_html(result, out)}")
    except OSError as exc:  # the verdict above stands: its exit code is kept
        print(f"ple_bench compare: warning: HTML diff not written to {out}: {exc.strerror or exc}", file=sys.stderr)
    try:
        if args.markdown:
            print(f"markdown: {write_markdown(result, args.markdown)}")
        if args.csv:
            print(f"CSV: {write_csv(result, args.csv)}")
    except OSError as exc:
        print(f"ple_bench compare: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    code = result.exit_code
    if code == 2:
        print("ple_bench compare: no case measured in both runs; different suites with nothing in common "
              "is not a pass", file=sys.stderr)
    return code


def compare_main(argv: Sequence[str] | None = None) -> int:
    parser = add_compare_args(argparse.ArgumentParser(
        prog="ple_bench compare", description="Compare stored runs (threshold + Mann-Whitney U)"))
    return run_compare(parser.parse_args(argv))
