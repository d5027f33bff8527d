"""Uncertainty where it lives: a figure measured in several worker processes, several rounds in
each, many samples in a round (:mod:`ple_bench.run.replicate`), summarised and given an interval
that a rerun falls in.

The levels, in the manner of Kalibera & Jones ("Rigorous benchmarking in reasonable time", ISMM
2013): samples inside a round (one measurement of a case: its warm-up, its samples' median), rounds
inside a process (each round re-captures the case's graphs and re-allocates its buffers, the cases
of a round in a new random order), processes (a fresh interpreter, a fresh pin of the table).  The
figure of a repeated case is the mean over processes of each process's mean over its rounds of the
rounds' medians (:func:`point`).

The interval (:func:`interval`, :func:`ratio_interval`) is a bootstrap of that hierarchy at its top
level: processes resampled with replacement, each bringing the mean of its rounds as measured (the
rounds' and the samples' variance is inside each process's mean already; resampling them again would
count it twice -- Davison & Hinkley, "Bootstrap methods and their application", 1997, section 3.8,
on two-stage sampling).  The bootstrap's spread of the log figure gives its standard error; the
interval is the point times ``exp(+- t * se)`` with ``t`` the Student quantile at ``processes - 1``
degrees of freedom and the standard error widened by ``sqrt(k / (k - 1))`` (a bootstrap of k values
underestimates their mean's variance by that factor), so that four processes are not read as if
they were four hundred.  With one process its rounds are the top level, and the interval then says
nothing about another process (:attr:`Interval.level`: "rounds").  The lower levels are not lost:
:func:`components` reads each level's variance from them, and the number of processes is chosen
from those (:func:`processes_for`).

A ratio of two cases measured in the same processes and rounds (a pinned step and its resident
baseline) is resampled in pairs: the same processes and rounds for both, which is what makes their
shared disturbances (a slow process, a slow round) cancel in the ratio.

:func:`components` estimates each level's variance (a nested analysis of variance) from the same
data: what ``docs/uncertainty.md`` tabulates and what the number of processes is chosen from
(:func:`processes_for`)."""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 4000
_IQR_PER_SIGMA = 1.349
#: the standard error of a median of n normal values is this times sigma / sqrt(n)
_MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2)


@dataclass(frozen=True)
class Obs:
    """One round's figure: its median (ms), the standard error of that median, where it ran."""

    process: int
    round: int
    ms: float
    se: float = 0.0


@dataclass(frozen=True)
class Interval:
    point: float
    low: float
    high: float
    processes: int
    rounds: int  # rounds in all
    level: str  # "processes" | "rounds" | "samples": the highest level the interval resamples

    @property
    def half_width_pct(self) -> float:
        return 100.0 * (self.high - self.low) / 2.0 / self.point if self.point else float("nan")

    def to_json(self) -> dict[str, Any]:
        return {"point": self.point, "low": self.low, "high": self.high, "processes": self.processes,
                "rounds": self.rounds, "level": self.level}


def median_se(samples: Sequence[float]) -> float:
    """The standard error of a median of ``samples``: the IQR's sigma (robust to the rare
    pre-empted sample) times sqrt(pi / 2) over sqrt(n); 0 for fewer than 4 samples."""
    x = np.asarray([v for v in samples if v is not None and math.isfinite(v)], dtype=float)
    if x.size < 4:
        return 0.0
    q1, q3 = np.percentile(x, [25, 75])
    return float((q3 - q1) / _IQR_PER_SIGMA * _MEDIAN_SE_FACTOR / math.sqrt(x.size))


def observations(replicates: Iterable[Mapping[str, Any]], figure: str) -> list[Obs]:
    """The rounds of a record's ``replicates`` that measured ``figure`` (e.g. ``step_ms``)."""
    out = []
    for rep in replicates or ():
        ms = (rep.get("ms") or {}).get(figure)
        if isinstance(ms, (int, float)) and math.isfinite(ms) and ms > 0:
            se = (rep.get("se_ms") or {}).get(figure) or 0.0
            out.append(Obs(int(rep.get("process", 0)), int(rep.get("round", 0)), float(ms), float(se)))
    return out


def _by_process(obs: Sequence[Obs]) -> dict[int, list[Obs]]:
    out: dict[int, list[Obs]] = {}
    for o in obs:
        out.setdefault(o.process, []).append(o)
    return {p: sorted(v, key=lambda o: o.round) for p, v in sorted(out.items())}


def point(obs: Sequence[Obs]) -> float | None:
    """Mean over processes of each process's mean of its rounds' medians."""
    groups = _by_process(obs)
    if not groups:
        return None
    return float(np.mean([np.mean([o.ms for o in g]) for g in groups.values()]))


def _t(df: int) -> float:
    from scipy.stats import t as student_t  # scipy: a heavy import only an interval needs, not every record load

    return float(student_t.ppf(0.5 + CONFIDENCE / 2, df))


def _resample(groups: list[list[tuple[float, ...]]], rng: np.random.Generator, resamples: int, top: str) -> np.ndarray:
    """``resamples`` x m means (one per paired figure): the top level resampled with replacement,
    everything below it kept as measured.  ``top == "processes"``: processes drawn, each
    contributing the mean of its rounds; ``"rounds"`` (one process): its rounds drawn."""
    if top == "processes":
        units = np.asarray([np.mean(np.asarray(g, dtype=float), axis=0) for g in groups])  # k x m
    else:
        units = np.asarray(groups[0], dtype=float)  # rounds x m
    n = units.shape[0]
    idx = rng.integers(0, n, size=(resamples, n))
    return units[idx].mean(axis=1)


def _paired(series: Sequence[Sequence[Obs]]) -> tuple[list[list[tuple[float, ...]]], list[list[tuple[float, ...]]]]:
    """Per process, the rounds every series measured, as tuples (one value per series)."""
    maps = [{(o.process, o.round): o for o in s} for s in series]
    common = sorted(set.intersection(*(set(m) for m in maps))) if maps else []
    values: dict[int, list[tuple[float, ...]]] = {}
    errors: dict[int, list[tuple[float, ...]]] = {}
    for key in common:
        values.setdefault(key[0], []).append(tuple(m[key].ms for m in maps))
        errors.setdefault(key[0], []).append(tuple(m[key].se for m in maps))
    procs = sorted(values)
    return [values[p] for p in procs], [errors[p] for p in procs]


def _interval_of(stat: np.ndarray, centre: float, processes: int, rounds: int, rounds_in_one: int) -> Interval:
    if processes >= 2:
        level, df, widen = "processes", processes - 1, math.sqrt(processes / (processes - 1))
    elif rounds_in_one >= 2:
        level, df, widen = "rounds", rounds_in_one - 1, math.sqrt(rounds_in_one / (rounds_in_one - 1))
    else:
        level, df, widen = "samples", None, 1.0
    logs = np.log(stat[np.isfinite(stat) & (stat > 0)])
    se = float(np.std(logs, ddof=1)) * widen if logs.size > 1 else 0.0
    q = _t(df) if df else 1.959963984540054
    return Interval(centre, centre * math.exp(-q * se), centre * math.exp(q * se), processes, rounds, level)


def interval(obs: Sequence[Obs], seed_text: str = "", resamples: int = RESAMPLES) -> Interval | None:
    """The 95 % interval of :func:`point` over the hierarchy (see the module doc)."""
    values, _errors = _paired([obs])
    if not values:
        return None
    rng = np.random.default_rng(zlib.crc32(seed_text.encode()))
    top = "processes" if len(values) >= 2 else "rounds"
    means = _resample(values, rng, resamples, top)[:, 0]
    centre = float(np.mean([np.mean([v[0] for v in g]) for g in values]))
    return _interval_of(means, centre, len(values), sum(map(len, values)), len(values[0]))


def ratio_interval(num: Sequence[Obs], den: Sequence[Obs], seed_text: str = "",
                   resamples: int = RESAMPLES) -> Interval | None:
    """The 95 % interval of point(num) / point(den), the two resampled in pairs (the rounds both
    measured); None where they share no round."""
    values, _errors = _paired([num, den])
    if not values:
        return None
    rng = np.random.default_rng(zlib.crc32(seed_text.encode()))
    top = "processes" if len(values) >= 2 else "rounds"
    means = _resample(values, rng, resamples, top)
    ratios = means[:, 0] / means[:, 1]
    a = np.mean([np.mean([v[0] for v in g]) for g in values])
    b = np.mean([np.mean([v[1] for v in g]) for g in values])
    return _interval_of(ratios, float(a / b), len(values), sum(map(len, values)), len(values[0]))


def ratio_observations(num: Sequence[Obs], den: Sequence[Obs]) -> list[Obs]:
    """The per-round ratio num / den of the rounds both measured (its se from both ses)."""
    b = {(o.process, o.round): o for o in den}
    out = []
    for o in num:
        d = b.get((o.process, o.round))
        if d is not None and d.ms > 0:
            r = o.ms / d.ms
            se = r * math.hypot(o.se / o.ms if o.ms else 0.0, d.se / d.ms)
            out.append(Obs(o.process, o.round, r, se))
    return out


@dataclass(frozen=True)
class Components:
    """Variance of one figure at each level, as relative standard deviations (% of the mean)."""

    processes_pct: float
    rounds_pct: float
    samples_pct: float
    processes: int
    rounds: int  # per process (the smallest)
    mean: float

    def half_width_pct(self, processes: int, rounds: int) -> float:
        """The 95 % half-width (% of the mean) that ``processes`` x ``rounds`` would give."""
        var = (self.processes_pct ** 2 / processes + self.rounds_pct ** 2 / (processes * rounds)
               + self.samples_pct ** 2 / (processes * rounds))
        return _t(max(processes - 1, 1)) * math.sqrt(var)

    def to_json(self) -> dict[str, Any]:
        return {"processes_pct": self.processes_pct, "rounds_pct": self.rounds_pct, "samples_pct": self.samples_pct,
                "processes": self.processes, "rounds": self.rounds, "mean": self.mean}


def components(obs: Sequence[Obs]) -> Components | None:
    """The variance components of a nested design (processes > rounds > samples), by the method
    of moments: the rounds' spread inside a process less the samples' share, the processes' spread
    less the rounds' share (negative estimates read as 0)."""
    groups = _by_process(obs)
    if len(groups) < 2 or min(len(g) for g in groups.values()) < 2:
        return None
    r = min(len(g) for g in groups.values())
    mean = float(np.mean([o.ms for o in obs]))
    samples_var = float(np.mean([o.se ** 2 for o in obs]))
    within = float(np.mean([np.var([o.ms for o in g], ddof=1) for g in groups.values()]))
    rounds_var = max(within - samples_var, 0.0)
    proc_means = [np.mean([o.ms for o in g]) for g in groups.values()]
    proc_var = max(float(np.var(proc_means, ddof=1)) - within / r, 0.0)
    pct = lambda v: 100.0 * math.sqrt(v) / mean  # noqa: E731
    return Components(pct(proc_var), pct(rounds_var), pct(samples_var), len(groups), r, mean)


def pooled(parts: Sequence[Components]) -> Components | None:
    """Components of several runs of one case as one: each level's variance averaged, weighted by
    the processes each run had (the estimate a later run chooses its processes from)."""
    parts = [c for c in parts if c is not None]
    if not parts:
        return None
    w = [c.processes for c in parts]
    avg = lambda f: math.sqrt(sum(wi * f(c) ** 2 for wi, c in zip(w, parts)) / sum(w))  # noqa: E731
    return Components(avg(lambda c: c.processes_pct), avg(lambda c: c.rounds_pct), avg(lambda c: c.samples_pct),
                      sum(w), min(c.rounds for c in parts), sum(wi * c.mean for wi, c in zip(w, parts)) / sum(w))


def processes_for(comp: Components, target_half_width_pct: float, rounds: int, most: int = 16) -> int:
    """The fewest processes (2..most) whose 95 % half-width meets the target at ``rounds`` rounds
    each; ``most`` where none does."""
    for k in range(2, most + 1):
        if comp.half_width_pct(k, rounds) <= target_half_width_pct:
            return k
    return most


__all__ = ["Obs", "Interval", "Components", "observations", "point", "interval", "ratio_interval",
           "ratio_observations", "components", "pooled", "processes_for", "median_se", "CONFIDENCE"]
