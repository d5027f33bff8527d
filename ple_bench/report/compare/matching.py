"""Pairing the cases of two sides of runs: records matched by ``case_id`` (the last record of a run
wins), each side's ok records of a case compared (pooled samples or run medians), the broken, the
not-comparable timers and the recalibrated workloads set apart, the run-median family adjusted, and
the warnings a reader must see (runs on different devices, modes, timers, unfinished runs)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Sequence, Union

from ...uncertainty import observations
from ..data import AXES, Run, case_label, load_run, measured_samples, median_or_stored, run_median, unflagged_throttled
from .result import (FUNCTIONAL_NO_VERDICT, NO_VERDICT, NOT_COMPARABLE, TIMED_VERDICTS, UNRECORDED_TIMER, VERDICTS,
                     CaseComparison, CompareResult, device_name)
from .stats import (MIN_RUNS, MIN_SAMPLES, P_ADJUST, RUNS_ALPHA, SAMPLES_ALPHA, change_pct, decide, holm, welch_p,
                    mann_whitney_p, noise_pct, runs_needed, significant, smallest_one_sided_p)

PathLike = Union[str, Path]


def compare_pooled(bases: Sequence[dict[str, Any]], cands: Sequence[dict[str, Any]], threshold_pct: float,
                   alpha: float, min_samples: int = MIN_SAMPLES) -> CaseComparison:
    """One case, each side's runs' (throttle-filtered) samples pooled: pooled medians, two-sided test."""
    bs = [s for r in bases for s in measured_samples(r)]
    cs = [s for r in cands for s in measured_samples(r)]
    bm, cm = median_or_stored(bs, bases), median_or_stored(cs, cands)
    change = change_pct(bm, cm)
    p_value = None
    if len(bs) < min_samples or len(cs) < min_samples or change is None:
        verdict = "insufficient"
    else:
        p_value = mann_whitney_p(bs, cs)
        verdict = decide(change, p_value, threshold_pct, alpha)
    return _comparison(bases, cands, bm, cm, change, p_value, len(bs), len(cs), verdict, "samples",
                       noise_pct(bs), noise_pct(cs))


def compare_run_medians(bases: Sequence[dict[str, Any]], cands: Sequence[dict[str, Any]], threshold_pct: float,
                        alpha: float, min_runs: int = MIN_RUNS) -> CaseComparison:
    """One case, one observation per run (its run median): median of run medians, one-sided test
    in the direction of the change (see the module docstring for why).  The verdict here is on the
    raw p; :func:`compare_runs` decides it again on the adjusted p of the whole family."""
    bmeds = [m for m in (run_median(r) for r in bases) if m is not None]
    cmeds = [m for m in (run_median(r) for r in cands) if m is not None]
    bm = statistics.median(bmeds) if bmeds else None
    cm = statistics.median(cmeds) if cmeds else None
    return _one_sided(bases, cands, bmeds, cmeds, bm, cm, mann_whitney_p, "runs", threshold_pct, alpha,
                      enough=len(bmeds) >= min_runs and len(cmeds) >= min_runs)


def _one_sided(bases, cands, b_obs, c_obs, bm, cm, test, basis: str, threshold_pct: float, alpha: float,
               enough: bool = True) -> CaseComparison:
    """One case's verdict on independent observations a side: the change of ``bm`` to ``cm``, and
    ``test`` one-sided in the direction of the change (change > 0: is the candidate slower, the
    baseline stochastically less?  < 0: faster?)."""
    change = change_pct(bm, cm)
    p_value = None
    if not enough or change is None:
        verdict = "insufficient"
    elif change == 0:
        p_value, verdict = 1.0, "same"
    else:
        p_value = test(b_obs, c_obs, alternative="less" if change > 0 else "greater")
        verdict = decide(change, p_value, threshold_pct, alpha)
    return _comparison(bases, cands, bm, cm, change, p_value, len(b_obs), len(c_obs), verdict, basis,
                       noise_pct(b_obs), noise_pct(c_obs))


def process_means(records: Sequence[dict[str, Any]]) -> list[float] | None:
    """A side's observations of a repeated case: every process's mean figure over its rounds, over
    the side's runs; None unless every record is a repeated case of two or more processes."""
    out: list[float] = []
    for r in records:
        reps = r.get("replicates")
        figure = "median_ms" if (r.get("kind") or "lookup") == "lookup" else "step_ms"
        obs = observations(reps, figure) if isinstance(reps, list) else []
        by_process: dict[int, list[float]] = {}
        for o in obs:
            by_process.setdefault(o.process, []).append(o.ms)
        if len(by_process) < 2:
            return None
        out += [statistics.fmean(v) for v in by_process.values()]
    return out or None


def compare_processes(bases: Sequence[dict[str, Any]], cands: Sequence[dict[str, Any]], threshold_pct: float,
                      alpha: float) -> CaseComparison | None:
    """One repeated case, one observation per worker process (its mean over rounds), every run of a
    side pooled: the change of the means, a one-sided Welch test on the process means in the
    direction of the change (decided again after Holm over the family, as run medians are).
    Processes are the level a rerun varies at (docs/uncertainty.md), so one run a side is enough.
    None where a side is not repeated."""
    bp, cp = process_means(bases), process_means(cands)
    if bp is None or cp is None:
        return None
    bm, cm = statistics.fmean(bp), statistics.fmean(cp)
    if change_pct(bm, cm) is None:
        return None
    return _one_sided(bases, cands, bp, cp, bm, cm, welch_p, "processes", threshold_pct, alpha)


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
    alpha_given = alpha
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
            cmp = compare_processes(b_ok, c_ok, threshold_pct, RUNS_ALPHA if alpha_given is None else alpha)
            if cmp is not None:
                pass  # a repeated case: its processes are the observations, in every mode
            elif mode == "runs":
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
    if result.cases and all(c.basis == "processes" for c in result.cases) and alpha_given is None:
        result.alpha = RUNS_ALPHA  # the family-wise rule of independent observations, as run medians
    if mode == "runs" or any(c.basis == "processes" for c in result.cases):
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
        alpha = result.alpha if c.basis == "runs" or result.mode == "runs" else RUNS_ALPHA
        if c.change_pct:
            c.verdict = decide(c.change_pct, p_adj, result.threshold_pct, alpha)


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



def _warnings(bases: Sequence[Run], cands: Sequence[Run]) -> list[str]:
    out = []
    runs = list(bases) + list(cands)

    def differ(what: str, values: list[str]) -> None:
        distinct = list(dict.fromkeys(values))
        if len(distinct) > 1:
            out.append(f"The runs {what} ({' vs '.join(distinct)}).")

    differ("were on different devices", [device_name(r) for r in runs])
    differ("have different modes", [r.mode for r in runs])
    if any(r.mode == "functional" for r in runs):
        out.append("A CPU functional run (host timer) is involved: its times are not GPU performance.")
    differ("used different timers", [r.meta.timer for r in runs if r.meta.timer])
    seen = set()
    for run in runs:
        if run.meta.status not in (None, "complete") and run.path not in seen:
            seen.add(run.path)
            out.append(f"Run {run.run_id} has status “{run.meta.status}”: it did not finish.")
    return out
