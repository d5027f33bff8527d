"""ple_bench.uncertainty: figures over processes and rounds, their interval, the variance components;
and the verdict's primary path, its process-level interval and the choice among other paths."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ple_bench import uncertainty as U
from ple_bench import verdict as V
from tests._fake_runs import derive_in_order
from tests.test_verdict import _rec, _resident


def _hierarchy(rng, truth: float, k: int, r: int, sd_p: float, sd_r: float, shared=None) -> list[U.Obs]:
    """k processes x r rounds of a figure: a per-process offset (sd_p), a per-round one (sd_r)."""
    out = []
    for p in range(k):
        proc = rng.normal(0, sd_p) if shared is None else shared[p]
        for j in range(r):
            out.append(U.Obs(p, j, truth * math.exp(proc + rng.normal(0, sd_r)), se=truth * 0.001))
    return out


def test_the_point_is_the_mean_over_processes_of_each_process_mean():
    obs = [U.Obs(0, 0, 1.0), U.Obs(0, 1, 3.0), U.Obs(1, 0, 10.0)]  # process 0 means 2, process 1 means 10
    assert U.point(obs) == pytest.approx(6.0)


def test_the_interval_covers_the_truth_about_95_percent_of_simulated_runs():
    rng = np.random.default_rng(7)
    hits = 0
    trials = 300
    for t in range(trials):
        obs = _hierarchy(rng, 1.0, k=4, r=2, sd_p=0.02, sd_r=0.02)
        iv = U.interval(obs, seed_text=str(t), resamples=600)
        hits += iv.low <= 1.0 <= iv.high
    # a percentile bootstrap of 4 process means, uncorrected, covers about 75 %; the Student correction
    # brings it to the nominal 95 % (binomial sd of 300 trials: 1.3 %)
    assert 0.90 <= hits / trials <= 0.995


def test_a_ratio_of_pairs_cancels_what_both_cases_share_in_a_process():
    rng = np.random.default_rng(3)
    shared = rng.normal(0, 0.10, size=6)  # a slow or fast process moves both cases alike
    a = _hierarchy(rng, 1.02, k=6, r=3, sd_p=0, sd_r=0.002, shared=shared)
    b = _hierarchy(rng, 1.00, k=6, r=3, sd_p=0, sd_r=0.002, shared=shared)
    paired = U.ratio_interval(a, b, "x")
    alone = U.interval(a, "x")
    assert paired.level == "processes" and paired.processes == 6
    assert paired.low < 1.02 < paired.high
    assert paired.half_width_pct < 1.0 < alone.half_width_pct  # the shared 10 % cancels in the ratio only


def test_one_process_gives_an_interval_over_its_rounds_and_says_so():
    obs = [U.Obs(0, j, v) for j, v in enumerate([1.0, 1.02, 0.99, 1.01])]
    iv = U.interval(obs)
    assert iv.level == "rounds" and iv.processes == 1 and iv.low < 1.005 < iv.high


def test_components_recover_where_the_variance_lives():
    rng = np.random.default_rng(11)
    obs = _hierarchy(rng, 1.0, k=40, r=4, sd_p=0.03, sd_r=0.005)
    c = U.components(obs)
    assert 2.0 < c.processes_pct < 4.5 and c.rounds_pct < 1.0
    obs = _hierarchy(rng, 1.0, k=40, r=4, sd_p=0.0, sd_r=0.03)
    c = U.components(obs)
    assert c.processes_pct < 1.0 and 2.4 < c.rounds_pct < 3.6


def test_more_processes_for_a_tighter_target_and_none_beyond_the_most():
    c = U.Components(processes_pct=1.0, rounds_pct=2.0, samples_pct=0.1, processes=4, rounds=2, mean=1.0)
    loose, tight = U.processes_for(c, 4.0, rounds=2), U.processes_for(c, 2.0, rounds=2)
    assert loose < tight
    assert c.half_width_pct(tight, 2) <= 2.0 < c.half_width_pct(tight - 1, 2)
    assert U.processes_for(c, 0.01, rounds=2, most=9) == 9


def _replicates(values: list[list[float]], figure: str = "step_ms") -> list[dict]:
    return [{"process": p, "round": j, "ms": {figure: v}, "se_ms": {figure: 0.0001}}
            for p, rounds in enumerate(values) for j, v in enumerate(rounds)]


def _base(tokens: int, values: list[list[float]]) -> dict:
    """A repeated resident step whose host-sync figure is its only one on that timer."""
    rec = _resident(tokens, 0.2, 0.2)
    rec["full_step_ms"] = rec["full_step_host_sync_ms"] = None
    return _repeated(rec, values, "step_host_sync_ms")


def _repeated(rec: dict, values: list[list[float]], figure: str = "step_ms") -> dict:
    means = [sum(r) / len(r) for r in values]
    rec.update(replicates=_replicates(values, figure), processes=len(values), rounds=len(values[0]))
    rec[figure] = sum(means) / len(means)
    if figure == "step_ms":
        rec["median_ms"] = rec["step_ms"]
    return rec


def test_the_verdict_is_the_primary_paths_over_processes_and_the_others_are_shown_beside_it():
    base = _base(256, [[0.200, 0.201], [0.199, 0.200], [0.202, 0.201], [0.200, 0.199]])
    flag = _repeated(_rec("pinned_host_flag", 256, 0.0, graph="full"),
                     [[0.204, 0.203], [0.202, 0.204], [0.205, 0.203], [0.203, 0.204]])
    faster_other = _rec("pinned_host_graph", 256, 0.150, graph="full")  # one process, faster: never chosen
    (entry,) = V.verdicts(derive_in_order([base, flag, faster_other]))
    assert entry.primary and entry.pinned_case_id == flag["case_id"]
    assert entry.processes == 4 and entry.level == "processes"
    assert entry.verdict == V.AS_FAST and entry.ci_low < entry.ratio < entry.ci_high < 1.05
    (alt,) = entry.alternatives
    assert alt["pinned_case_id"] == faster_other["case_id"] and alt["ratio"] < 0.8
    doc = entry.to_json()
    assert doc["processes"] == 4 and doc["primary_path"] is True and doc["interval_level"] == "processes"
    assert "4 processes" in V.entry_text(entry) and any("also:" in line for line in V.verdict_lines([entry]))


def test_without_the_primary_path_the_fastest_is_chosen_on_half_the_processes_and_judged_on_the_rest():
    base = _base(256, [[0.2, 0.2]] * 4)
    # path A is faster on processes 1 and 3 only (a lucky draw); path B is steadily a little faster
    a = _repeated(_rec("pinned_host_graph", 256, 0.0, graph="full"), [[0.18, 0.18], [0.22, 0.22], [0.18, 0.18],
                                                                         [0.22, 0.22]])
    b = _repeated(_rec("pinned_cpu_gather", 256, 0.0, graph="breakable"), [[0.19, 0.19]] * 4)
    (entry,) = V.verdicts(derive_in_order([base, a, b]))
    assert not entry.primary and entry.selected_from == 2
    assert entry.pinned_case_id == a["case_id"]  # chosen on processes 1 and 3 ...
    assert entry.ratio == pytest.approx(1.10)  # ... its ratio read from processes 2 and 4 alone
    assert "processes 1, 3" in entry.selection and "2, 4" in entry.selection


def test_an_interval_across_the_band_edge_is_undecided_not_slower():
    base = _base(64, [[0.2, 0.2]] * 4)
    flag = _repeated(_rec("pinned_host_flag", 64, 0.0, graph="full"),
                     [[0.200, 0.202], [0.216, 0.214], [0.204, 0.206], [0.220, 0.218]])
    (entry,) = V.verdicts(derive_in_order([base, flag]))
    assert entry.ci_low <= 1.05 < entry.ci_high and entry.verdict == V.UNDECIDED


def test_advise_prints_the_verdicts_interval_over_processes_and_an_undecided_count_as_neither_answer():
    from ple_bench.advise.answer import advise

    recs = derive_in_order([
        _base(64, [[0.2, 0.2]] * 4),
        _repeated(_rec("pinned_host_flag", 64, 0.0, graph="full"),
                  [[0.200, 0.202], [0.216, 0.214], [0.204, 0.206], [0.220, 0.218]]),
        _base(256, [[0.2, 0.2]] * 4),
        _repeated(_rec("pinned_host_flag", 256, 0.0, graph="full"), [[0.199, 0.201], [0.2, 0.2]] * 2),
    ])
    for r in recs:
        r["_run_id"] = "20261207-000000-default-t"
    entries = {e.num_tokens: e for e in V.verdicts(recs)}
    a = advise(table_bytes=160 << 20, dim=160, dtype="fp8", heads=16, tokens=[64, 256], compute_us=200, records=recs)
    t64, t256 = a.answers
    assert (t64.verdict, t256.verdict) == (V.UNDECIDED, V.AS_FAST)
    flag64 = next(o for o in t64.options if o.placement == "pinned host")
    assert (flag64.ci_low, flag64.ci_high) == (entries[64].ci_low, entries[64].ci_high)  # one interval everywhere
    assert t64.recommendation.startswith("undecided:") and "Undecided at 64 tokens" in a.verdict
    assert a.verdict.startswith("Keep the table in pinned host memory") and "256" in a.verdict


def test_a_stored_repeated_run_gives_its_verdicts_over_processes_with_the_primary_path():
    from ple_bench.results import load_records
    from tests._fixtures import fixture_run

    recs = load_records(fixture_run("default-13a2"))
    entries = {e.num_tokens: e for e in V.verdicts(recs)}
    assert set(entries) == {64, 256, 512}
    for e in entries.values():
        assert e.primary and e.level == "processes" and e.processes == 4
        assert e.ci_low <= e.ratio <= e.ci_high and e.pinned.processes == 4
    # as stored: 64 tokens straddles the band (1.03, 0.98-1.09), 256 and 512 lie inside it
    assert entries[64].verdict == V.UNDECIDED and entries[256].verdict == entries[512].verdict == V.AS_FAST
    by_id = {r["case_id"]: r for r in recs}
    assert len(V.ratio_rounds(entries[256], by_id)) == 8  # 4 processes x 2 rounds, paired
