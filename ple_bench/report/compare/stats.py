"""compare's statistics: the Mann-Whitney U test, Holm's adjustment, the exact test's floor, the
thresholds and the verdict rule of one case (threshold AND significance).  Pure numbers: no runs,
no records (the rule and why it is this one: :mod:`ple_bench.report.compare`)."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

MIN_SAMPLES = 5  # pooled mode: fewer samples a side is "insufficient"
MIN_RUNS = 3  # run-median mode: runs a side needed (and ok runs a case needs)
SAMPLES_ALPHA = 0.01  # default alpha, pooled samples (two-sided, advisory)
RUNS_ALPHA = 0.05  # default alpha, run medians (one-sided, family-wise after Holm)
P_ADJUST = ("holm", "none")  # run-median mode: multiplicity control across the tested cases


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


def welch_p(a: Sequence[float], b: Sequence[float], alternative: str = "two-sided") -> float:
    """Welch's t-test p-value of the logs of ``a`` vs ``b`` (scipy's ``alternative``: "less" = ``a``
    tends to be smaller): the test of process means, each the mean of many rounds and samples, so
    near-normal; continuous, so a handful of processes a side can reach Holm's thresholds (an exact
    rank test of 4 vs 4 values cannot go below 1/70)."""
    from scipy.stats import ttest_ind  # scipy: loaded when a test runs, as mann_whitney_p does

    la, lb = np.log(np.asarray(a, dtype=float)), np.log(np.asarray(b, dtype=float))
    if np.ptp(np.concatenate([la, lb])) == 0:
        return 1.0
    p = float(ttest_ind(la, lb, equal_var=False, alternative=alternative).pvalue)
    return 1.0 if math.isnan(p) else p


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


def change_pct(base_ms: float | None, cand_ms: float | None) -> float | None:
    """(candidate - baseline) / baseline x 100 (> 0 is slower); None without both."""
    return (cand_ms - base_ms) / base_ms * 100 if base_ms and cand_ms is not None else None


def noise_pct(values: Sequence[float]) -> float | None:
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


def decide(change: float, p_value: float, threshold_pct: float, alpha: float) -> str:
    """One case's timing verdict: beyond the threshold and significant is a regression (slower) or
    an improvement; beyond it and not significant, noisy; else the same."""
    if abs(change) > threshold_pct and significant(p_value, alpha):
        return "regression" if change > 0 else "improvement"
    if abs(change) > threshold_pct:
        return "noisy"
    return "same"
