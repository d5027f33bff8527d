"""What a compare decides: the verdicts, :class:`CaseComparison` (one case) and
:class:`CompareResult` (the whole comparison: its mode, cases, warnings, summary line and exit
code).  Built by :mod:`.matching`, written by :mod:`.writers`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..data import Run
from ...verdict import headline as offload_headline
from ...verdict import is_functional, verdicts
from .stats import MIN_RUNS

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
        return [c for c in self.cases if c.basis in ("runs", "processes") and c.p_value is not None
                and c.verdict in TIMED_VERDICTS + (NO_VERDICT,)]

    @property
    def basis_text(self) -> str:
        nb, nc = len(self.baselines), len(self.candidates)
        procs = [c for c in self.cases if c.basis == "processes"]
        if procs and len(procs) == len(self.cases):
            adjust = f", Holm over {len(self.tested)} cases" if self.p_adjust == "holm" else ", per case"
            return (f"process means of repeated cases ({procs[0].n_baseline} vs {procs[0].n_candidate} processes), "
                    f"one-sided Welch t-test{adjust}")
        if self.mode == "runs":
            adjust = f", Holm over {len(self.tested)} cases" if self.p_adjust == "holm" else ", per case"
            return f"run medians of {nb} vs {nc} runs, one-sided Mann-Whitney U{adjust}"
        return (f"pooled samples of {nb} vs {nc} run{'s' if nc != 1 else ''}, two-sided Mann-Whitney U, "
                f"{'strict' if self.strict_pooled else 'advisory'}")

    @property
    def advisory(self) -> bool:
        """Pooled verdicts that do not decide the exit code."""
        return (self.mode == "samples" and not self.strict_pooled
                and not any(c.basis == "processes" for c in self.cases))

    @property
    def caveat(self) -> str | None:
        """What a reader must know about this comparison's p-values (pooled mode only)."""
        pooled = any(c.basis == "samples" for c in self.cases)
        return INDEPENDENCE_CAVEAT if self.mode == "samples" and pooled else None

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

def device_name(run: Run) -> str:
    """The device a run was on, as its meta.json names it."""
    d = run.meta.get("device")
    return str(d.get("name") if isinstance(d, dict) else d)
