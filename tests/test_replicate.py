"""Repeated cases (ple_bench.run.replicate): fresh processes, randomized rounds, the merged record, a
resumed run; the machine profile (ple_bench.run.machine_profile); the CLI's --processes / --rounds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ple_bench.record import CaseResult
from ple_bench.run import machine_profile as mp
from ple_bench.run import replicate as R
from ple_bench.spec.case import Case

REPO = Path(__file__).resolve().parents[1]

#: a tiny repeated pair for functional runs (a pinned step and its resident baselines); {repeat}: the table's keys
PAIR_SUITE = """
[suite]
description = "a repeated pair"
[suite.timing]
warmup_ms = 0
min_samples = 3
max_samples = 10
min_time_s = 0.0
max_time_s = 0.05
cold_l2 = false
hot = false
[defaults]
vocab_size = 4096
dim = 160
dtype = "fp8"
num_heads = 4
hidden = 256
[[group]]
name = "pair"
kind = "step"
impl = "pinned_uva"
kernel = "triton_reference"
prefetch = "on"
num_tokens = 8
compute_us = 20
repeat = {{ {repeat} }}
"""


def _cases() -> list[Case]:
    return [Case(kind="step", impl=impl, num_tokens=t, compute_us=20.0) for impl in ("device", "pinned_uva")
            for t in (8, 16)]


class _FakeWorkers:
    """Stands for the worker pool: a 'process' is the number of fresh_process calls; each case's
    figure is its token count plus 0.1 x the process and 0.01 x the round in it."""

    def __init__(self, fail_on: tuple[int, str] | None = None):
        self.process = -1
        self.rounds_seen: dict[tuple[int, str], int] = {}
        self.calls: list[tuple[int, str, dict]] = []
        self.fail_on = fail_on

    def fresh(self) -> None:
        self.process += 1

    def run(self, case: Case, extra: dict) -> CaseResult:
        key = (self.process, case.case_id)
        r = self.rounds_seen.get(key, 0)
        self.rounds_seen[key] = r + 1
        self.calls.append((self.process, case.case_id, extra))
        if self.fail_on == (self.process, case.case_id):
            return CaseResult(status="failed", reason="boom")
        ms = case.num_tokens + 0.1 * self.process + 0.01 * r
        return CaseResult(measurement={"step_ms": ms, "median_ms": ms, "samples_ms": [ms] * 9, "timer": "x"},
                          process={"cpu": self.process, "pid": 100 + self.process})


def _run(tmp_path, workers, cases, processes=3, rounds=2):
    got = {}
    R.run_repeated(cases, lambda _cid: (processes, rounds), workers.run, workers.fresh, tmp_path,
                   on_round=lambda *_: None, on_record=lambda case, result: got.__setitem__(case.case_id, result))
    return got


def test_every_case_runs_in_each_fresh_process_once_a_round_in_a_drawn_order(tmp_path):
    workers, cases = _FakeWorkers(), _cases()
    got = _run(tmp_path, workers, cases)
    assert workers.process == 3  # three processes, then a fresh one for what follows (the tables freed)
    for p in range(3):
        assert all(workers.rounds_seen[(p, c.case_id)] == 2 for c in cases)
    assert all(extra == {"park_tables": True, "process_facts": True} for _, _, extra in workers.calls)
    orders = {tuple(R.round_order(cases, tmp_path.name, p, r)) for p in range(3) for r in range(2)}
    assert len(orders) > 1  # the order is drawn anew, not one fixed sequence
    assert R.round_order(cases, "run", 1, 1) == R.round_order(cases, "run", 1, 1)  # and reproducibly
    rec = got[cases[0].case_id]
    assert rec.status == "ok" and rec.measurement["processes"] == 3 and rec.measurement["rounds"] == 2
    # the mean over processes of each process's mean over its rounds: 8 + 0.1 x mean(0, 1, 2) + 0.005
    assert rec.measurement["step_ms"] == pytest.approx(8 + 0.1 + 0.005)
    reps = rec.measurement["replicates"]
    assert len(reps) == 6 and {e["cpu"] for e in reps} == {0, 1, 2}
    assert all(e["se_ms"]["step_ms"] == 0.0 for e in reps)  # identical samples: no sampling error
    lines = (tmp_path / R.REPLICATES_FILE).read_text().splitlines()
    assert len(lines) == 6 * len(cases)


def test_a_failed_round_fails_the_case_and_says_where(tmp_path):
    cases = _cases()
    got = _run(tmp_path, _FakeWorkers(fail_on=(1, cases[2].case_id)), cases)
    bad = got[cases[2].case_id]
    assert bad.status == "failed" and bad.reason.startswith("process 2, round 1: boom")
    assert got[cases[0].case_id].status == "ok"


def test_a_resumed_run_keeps_the_processes_it_finished_and_measures_the_rest(tmp_path):
    cases = _cases()
    _run(tmp_path, _FakeWorkers(), cases, processes=2)
    # keep process 1 only, as if the run had stopped in process 2
    path = tmp_path / R.REPLICATES_FILE
    kept = [line for line in path.read_text().splitlines() if json.loads(line)["process"] == 0]
    path.write_text("\n".join(kept) + "\n")
    workers = _FakeWorkers()
    workers.process = 0  # the next fresh process is number 1
    got = _run(tmp_path, workers, cases, processes=2)
    assert {p for p, _, _ in workers.calls} == {1}
    rec = got[cases[1].case_id]
    assert rec.measurement["processes"] == 2 and len(rec.measurement["replicates"]) == 4
    assert rec.measurement["timer"] == "x"  # built on the first round's stored result


def test_the_machine_profile_is_made_once_and_never_changed(tmp_path):
    key = {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580", "torch": "2.11", "cuda": "13.0"}
    assert mp.load(key, tmp_path) is None
    path, added = mp.update(key, {"a": [11, 18.0]}, "run-1", tmp_path)
    assert added == 1 and path.parent == tmp_path and path.name.startswith("nvidia-h100-80gb-hbm3-")
    _, added = mp.update(key, {"a": [10, 19.3], "b": [8, 24.7]}, "run-2", tmp_path)
    found_path, data = mp.load(key, tmp_path)
    assert added == 1 and data["calibration"] == {"a": [11, 18.0], "b": [8, 24.7]}  # "a" kept as first measured
    assert data["created_by"] == "run-1" and data["updated_by"] == ["run-2"]
    assert mp.load(dict(key, driver="590"), tmp_path) is None  # another driver: another profile


@pytest.mark.parametrize("flag", ["--processes", "--rounds"])
def test_a_repeat_override_out_of_range_exits_2_naming_the_flag(flag):
    out = subprocess.run([sys.executable, "-m", "ple_bench", "run", "--suite", "smoke", flag, "0"],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 2 and flag in out.stderr and "[1, 64]" in out.stderr


@pytest.mark.slow
def test_a_repeated_group_runs_end_to_end_in_functional_mode(tmp_path):
    suite = tmp_path / "rep.toml"
    suite.write_text(PAIR_SUITE.format(repeat="processes = 2, rounds = 2"))
    env = {"PLE_BENCH_FORCE_CPU": "1"}
    import os
    out = subprocess.run([sys.executable, "-m", "ple_bench", "run", "--suite", str(suite), "--results-dir",
                          str(tmp_path / "res"), "--no-report", "--no-progress"], capture_output=True, text=True,
                         cwd=REPO, timeout=600, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr
    (run_dir,) = (tmp_path / "res").iterdir()
    recs = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]
    ok = [r for r in recs if r["status"] == "ok"]
    assert ok and all(r["processes"] == 2 and r["rounds"] == 2 and len(r["replicates"]) == 4 for r in ok)
    assert len({e["pid"] for r in ok for e in r["replicates"]}) == 2  # two worker processes
    meta = json.loads((run_dir / "meta.json").read_text())
    assert set(meta["repeated"]) == {r["case_id"] for r in recs}


def _group(target=None, most=None, processes=4, rounds=2):
    from ple_bench.spec.suite import SuiteGroup

    return SuiteGroup(name="pair", repeat=(processes, rounds), repeated_ids=["p", "b"], repeat_target_pct=target,
                      repeat_most=most)


def test_the_processes_come_from_the_machines_variance_components_where_a_target_is_set(tmp_path):
    from ple_bench.run.loop import RunOptions, choose_processes
    from ple_bench.uncertainty import Components

    key = {"gpu": "g", "driver": "d", "torch": "t", "cuda": "c"}
    mp.update(key, {"a": [1, 1.0]}, "run-1", tmp_path)
    noisy = Components(processes_pct=1.0, rounds_pct=3.0, samples_pct=0.1, processes=4, rounds=2, mean=1.0)
    mp.add_components(key, {"p": noisy.to_json()}, "run-1", tmp_path)
    _, profile = mp.load(key, tmp_path)
    assert choose_processes(_group(), RunOptions(), profile) == (4, "the suite's number")
    k, why = choose_processes(_group(target=2.5, most=8), RunOptions(), profile)
    assert k > 4 and noisy.half_width_pct(k, 2) <= 2.5 < noisy.half_width_pct(k - 1, 2) and "profile" in why
    k, why = choose_processes(_group(target=0.5, most=6), RunOptions(), profile)
    assert k == 6 and "falls short" in why
    assert choose_processes(_group(target=2.5), RunOptions(processes=3), profile)[0] == 3  # the flag wins
    assert choose_processes(_group(target=2.5), RunOptions(), None)[0] == 4  # nothing measured here yet
    # the newest runs are kept and pooled
    for i in range(2, 8):
        mp.add_components(key, {"p": noisy.to_json()}, f"run-{i}", tmp_path)
    _, profile = mp.load(key, tmp_path)
    assert [c["run"] for c in profile["components"]["p"]] == [f"run-{i}" for i in range(3, 8)]
    assert mp.components_of(profile, ["p", "b"])["p"].processes == 20


def test_a_runs_ratio_components_are_read_from_its_verdicts():
    from ple_bench.verdict import ratio_components
    from tests._fake_runs import derive_in_order
    from tests.test_uncertainty import _base, _rec, _repeated

    base = _base(256, [[0.2, 0.2]] * 4)
    flag = _repeated(_rec("pinned_host_flag", 256, 0.0, graph="full"),
                     [[0.200, 0.210], [0.202, 0.208], [0.201, 0.209], [0.199, 0.211]])
    comps = ratio_components(derive_in_order([base, flag]))
    (comp,) = comps.values()
    assert comp.processes == 4 and comp.rounds_pct > 2.0 and comp.processes_pct < 1.0  # rounds, not processes


@pytest.mark.slow
def test_a_gpu_mode_run_keeps_its_components_and_the_next_run_chooses_its_processes_from_them(tmp_path, monkeypatch):
    """The machine-profile branch of a GPU run, driven in functional workers: the first run takes the
    suite's number of processes and leaves the pair's variance components in the profile; the second
    run reads them and chooses its processes for the target (said in meta.json's repeat_choice)."""
    from ple_bench.measure import TimingPolicy
    from ple_bench.run.loop import RunOptions, run_suite
    from ple_bench.spec.suite import load_suite

    suite_file = tmp_path / "rep.toml"
    suite_file.write_text(PAIR_SUITE.format(repeat="processes = 2, rounds = 2, target_pct = 0.1, most = 3"))
    monkeypatch.setenv("PLE_BENCH_FORCE_CPU", "1")
    monkeypatch.setenv(mp.PROFILE_DIR_ENV, str(tmp_path / "profile"))
    key = {"gpu": "test GPU", "driver": "1", "torch": "t", "cuda": "c"}
    monkeypatch.setattr(mp, "machine_key", lambda: key)
    # CPU timings may be too noisy for a verdict (and so for components); their stability is not what is tested
    from ple_bench import verdict

    monkeypatch.setattr(verdict, "stable", lambda rec: True)
    suite = load_suite(suite_file)
    policy = TimingPolicy.from_dict(suite.timing).scaled_for_cpu()
    metas = []
    for _ in range(2):
        summary = run_suite(suite, suite.cases, policy, RunOptions(results_dir=tmp_path / "res", progress=False,
                                                                   quiet=True), "gpu")
        metas.append(json.loads((summary.run_dir / "meta.json").read_text()))
    first, second = metas
    assert first["repeat_choice"]["pair"] == {"processes": 2, "why": first["repeat_choice"]["pair"]["why"]}
    assert "no variance components" in first["repeat_choice"]["pair"]["why"]
    assert first["compute_profile"]["source"].startswith("calibrated by this run")
    assert second["compute_profile"]["source"] == "machine profile"
    # a 0.1 % target no CPU run meets: the most, and the choice says it falls short
    assert second["repeat_choice"]["pair"]["processes"] == 3 and "falls short" in second["repeat_choice"]["pair"]["why"]
    assert {tuple(v) for v in second["repeated"].values()} == {(3, 2)}
    _, profile = mp.load(key)
    (runs,) = profile["components"].values()
    assert len(runs) == 2 and {r["processes"] for r in runs} == {2, 3}
