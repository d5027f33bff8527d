"""When to stop sampling: pluggable criteria (after nvbench's stopping criteria).

Every criterion has the same small interface::

    crit.start()              # sampling begins (time-based criteria read the clock)
    crit.update(sample_ms)    # one more sample
    crit.done() -> str | None # the reason to stop, or None to go on

A :class:`Stopper` composes several; the first criterion in its list that is
done gives the reason (so put the "good" reason, noise, first).  Clocks are
injectable (``clock=`` a zero-argument callable returning seconds) so the rules
can be tested with fake time.

The reasons are the strings stored as ``Measurement.stopped_by``:
``"noise"``, ``"max_samples"``, ``"max_time"``.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Iterable

from .stats import relative_noise

Clock = Callable[[], float]


class Criterion:
    """Base class: never done.  ``counts_throttled`` False means the Stopper
    feeds it only samples not flagged as throttled."""

    reason = "criterion"
    counts_throttled = True

    def start(self) -> None:
        pass

    def update(self, sample_ms: float) -> None:
        pass

    def done(self) -> str | None:
        return None


class SampleCount(Criterion):
    """Done after ``max_samples`` samples (throttled ones included: a cap)."""

    reason = "max_samples"

    def __init__(self, max_samples: int) -> None:
        if max_samples < 1:
            raise ValueError("max_samples must be >= 1")
        self.max_samples = max_samples
        self.n = 0

    def update(self, sample_ms: float) -> None:
        self.n += 1

    def done(self) -> str | None:
        return self.reason if self.n >= self.max_samples else None


class TimeBudget(Criterion):
    """Done once ``max_time_s`` of wall time has passed since ``start()``.

    A hard cap: it does not wait for any minimum sample count (the caller
    always takes at least one sample)."""

    reason = "max_time"

    def __init__(self, max_time_s: float, clock: Clock = time.monotonic) -> None:
        self.max_time_s = max_time_s
        self.clock = clock
        self._t0: float | None = None

    def start(self) -> None:
        self._t0 = self.clock()

    def elapsed_s(self) -> float:
        if self._t0 is None:
            self.start()
        return self.clock() - self._t0  # type: ignore[operator]

    def done(self) -> str | None:
        return self.reason if self.elapsed_s() >= self.max_time_s else None


class RelativeNoise(Criterion):
    """Done when the relative noise of the samples (see
    :func:`ple_bench.measure.stats.relative_noise`: IQR-based 95 % CI half-width
    of the median over the median) is at most ``max_noise``, once at least
    ``min_samples`` samples and ``min_time_s`` of wall time are in."""

    reason = "noise"
    counts_throttled = False

    def __init__(
        self,
        max_noise: float,
        *,
        min_samples: int = 10,
        min_time_s: float = 0.0,
        clock: Clock = time.monotonic,
    ) -> None:
        self.max_noise = max_noise
        self.min_samples = max(1, min_samples)
        self.min_time_s = min_time_s
        self.clock = clock
        self.samples: list[float] = []
        self._t0: float | None = None

    def start(self) -> None:
        self._t0 = self.clock()

    def update(self, sample_ms: float) -> None:
        self.samples.append(sample_ms)

    def noise(self) -> float:
        return relative_noise(self.samples)

    def done(self) -> str | None:
        if len(self.samples) < self.min_samples:
            return None
        if self._t0 is None:
            self.start()
        if self.clock() - self._t0 < self.min_time_s:  # type: ignore[operator]
            return None
        return self.reason if self.noise() <= self.max_noise else None


class Stopper:
    """A list of criteria; ``done()`` is the first criterion's reason that fires."""

    def __init__(self, criteria: Iterable[Criterion]) -> None:
        self.criteria = list(criteria)
        if not self.criteria:
            raise ValueError("a Stopper needs at least one criterion")
        self.n = 0
        self.n_throttled = 0

    def start(self) -> None:
        for c in self.criteria:
            c.start()

    def update(self, sample_ms: float, throttled: bool = False) -> None:
        self.n += 1
        self.n_throttled += int(throttled)
        for c in self.criteria:
            if c.counts_throttled or not throttled:
                c.update(sample_ms)

    def done(self) -> str | None:
        for c in self.criteria:
            reason = c.done()
            if reason is not None:
                return reason
        return None

    def noise(self) -> float:
        for c in self.criteria:
            if isinstance(c, RelativeNoise):
                return c.noise()
        return math.nan


def stopper_for(policy, clock: Clock = time.monotonic) -> Stopper:
    """The standard composition for a :class:`~ple_bench.measure.timer.TimingPolicy`:
    noise target (after min_samples and min_time_s), then the max_samples and
    max_time_s caps."""
    return Stopper([
        RelativeNoise(policy.max_noise, min_samples=policy.min_samples,
                      min_time_s=policy.min_time_s, clock=clock),
        SampleCount(policy.max_samples),
        TimeBudget(policy.max_time_s, clock=clock),
    ])
