"""Summary statistics of timing samples, and the noise estimate the stopping
rule uses.  Pure numpy; no device, no formatting.

Quantiles use numpy's default (linear interpolation), so a one-sample list has
every quantile equal to that sample, IQR 0 and CV 0.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

# A 95 % confidence interval of the median, estimated without a bootstrap:
#   sigma ~= IQR / 1.349           (IQR of a normal distribution is 1.349 sigma)
#   SE(median) ~= 1.2533 * sigma / sqrt(n)   (asymptotic efficiency of the median)
#   half-width = 1.96 * SE(median)
# so half-width ~= 1.821 * IQR / sqrt(n).  The IQR makes it robust to outliers
# (a few pre-empted samples do not keep the measurement running forever).
_MEDIAN_CI95_PER_IQR = 1.96 * 1.2533 / 1.349

#: fewer samples than this give an infinite noise estimate (quartiles of 1-3
#: values say nothing about spread).
MIN_SAMPLES_FOR_NOISE = 4


def summarize(samples_ms: Sequence[float]) -> dict[str, float]:
    """median, mean, min, max, p10, p90, q1, q3, iqr, cv (stdev/mean, population
    stdev), n -- plain Python numbers."""
    a = np.asarray(list(samples_ms), dtype=np.float64)
    if a.size == 0:
        raise ValueError("summarize() needs at least one sample")
    if not np.all(np.isfinite(a)):
        raise ValueError("samples must be finite numbers")
    p10, q1, median, q3, p90 = np.percentile(a, [10, 25, 50, 75, 90])
    mean = float(a.mean())
    std = float(a.std())
    return {
        "median": float(median),
        "mean": mean,
        "min": float(a.min()),
        "max": float(a.max()),
        "p10": float(p10),
        "p90": float(p90),
        "q1": float(q1),
        "q3": float(q3),
        "iqr": float(q3 - q1),
        "cv": std / mean if mean != 0 else 0.0,
        "n": int(a.size),
    }


def relative_noise(samples_ms: Sequence[float]) -> float:
    """Relative half-width of an IQR-based 95 % CI of the median:
    ``1.96 * 1.2533 * (IQR / 1.349) / sqrt(n) / median``.

    ``inf`` below :data:`MIN_SAMPLES_FOR_NOISE` samples or for a non-positive
    median; 0 for identical samples."""
    n = len(samples_ms)
    if n < MIN_SAMPLES_FOR_NOISE:
        return math.inf
    a = np.asarray(samples_ms, dtype=np.float64)
    q1, median, q3 = np.percentile(a, [25, 50, 75])
    if median <= 0:
        return math.inf
    return float(_MEDIAN_CI95_PER_IQR * (q3 - q1) / math.sqrt(n) / median)


#: a series whose halves differ by more than this share of its median, with a rank test saying
#: so, is unstable: the machine changed under it (clock, a neighbour, a page-cache state)
UNSTABLE_SHIFT = 0.05
UNSTABLE_P = 1e-3
#: fewer samples than this a half: too few to tell drift from noise
MIN_SAMPLES_FOR_STABILITY = 8


def halves_disagree(samples_ms: Sequence[float]) -> bool:
    """The first and second halves of a series (in the order taken) disagree beyond its noise:
    a two-sided Mann-Whitney U test between them gives p < :data:`UNSTABLE_P` and their means
    differ by more than :data:`UNSTABLE_SHIFT` of the series' median (a shift that matters,
    seen by a test that a few outliers do not sway)."""
    from scipy.stats import mannwhitneyu  # scipy: heavy, only a test needs it

    n = len(samples_ms) // 2
    if n < MIN_SAMPLES_FOR_STABILITY:
        return False
    a = np.asarray(samples_ms, dtype=np.float64)
    first, second = a[:n], a[len(a) - n:]
    median = float(np.median(a))
    if median <= 0:
        return False
    shift = abs(float(first.mean()) - float(second.mean())) / median
    if shift <= UNSTABLE_SHIFT:
        return False
    return float(mannwhitneyu(first, second, alternative="two-sided").pvalue) < UNSTABLE_P
