"""Runs under ``torchrun`` (two gloo ranks on this CPU machine): every rank runs the
selected cases in lockstep, only rank 0 writes, multi-rank records carry the
slowest rank's time and each rank's median, and a rank that fails inside a case
gives a ``failed`` record naming it while the run goes on (no hang)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ple_bench import results
from ple_bench.run.loop import select_cases
from ple_bench.spec.suite import load_suite

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parent.parent
MULTI = ["*tp1etp2dp2*", "*tp2etp2dp1*"]
SINGLE = "lookup.device.v4096.d64.fp32*"  # a one-rank case: skipped under a 2-rank torchrun
COLLECTIVE_TIMEOUT_S = 5


def torchrun(tmp_path: Path, *run_args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node 2 -m ple_bench run ...``; the whole
    process group is killed if it outlives ``timeout_s`` (a hang fails the test)."""
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    env = dict(os.environ, PLE_BENCH_FORCE_CPU="1", PLE_BENCH_COLLECTIVE_TIMEOUT_S=str(COLLECTIVE_TIMEOUT_S),
               OMP_NUM_THREADS="1", TMPDIR=str(scratch), PYTHONPATH=str(REPO_ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "ple_bench", "run", "--no-progress", *run_args]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"torchrun run hung (> {timeout_s} s); stderr tail:\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def only_run(results_dir: Path) -> Path:
    runs = [p for p in results_dir.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def check_multi_rank_record(rec: dict) -> None:
    medians = rec["rank_medians_ms"]
    assert len(medians) == 2 and all(m > 0 for m in medians), rec
    assert rec["median_ms"] == max(medians)  # the case's time is the slowest rank's
    assert rec["slowest_rank"] in (0, 1) and medians[rec["slowest_rank"]] == max(medians)
    assert rec["rank_spread_ms"] == pytest.approx(max(medians) - min(medians))
    assert len(rec["samples_ms"]) == rec["n_samples"] > 0
    assert rec["reduce_ms"] > 0 and rec["reduce_busbw_gbps"] > 0 and rec["reduce_bytes"] > 0
    if rec["etp"] // rec["tp"] > 1:  # DP replicas share the table: their ids are gathered
        assert rec["gather_ms"] > 0 and rec["gather_bytes"] > 0
    else:
        assert rec.get("gather_ms") is None


def test_torchrun_two_ranks_lockstep_rank0_writes(tmp_path):
    res, rep = tmp_path / "res", tmp_path / "rep"
    proc = torchrun(tmp_path, "--suite", "smoke", *[a for p in MULTI + [SINGLE] for a in ("--case", p)],
                    "--results-dir", str(res), "--reports-dir", str(rep))
    assert proc.returncode == 0, proc.stderr[-4000:]
    run_dir = only_run(res)
    suite = load_suite("smoke")
    multi = {c.case_id for c in select_cases(suite.cases, MULTI)}
    single = {c.case_id for c in select_cases(suite.cases, [SINGLE])}
    assert len(multi) >= 4 and len(single) == 1
    assert {c.world_size for c in select_cases(suite.cases, MULTI)} == {2}

    recs = results.load_records(run_dir)
    by_id = {r["case_id"]: r for r in recs}
    assert len(recs) == len(by_id) == len(multi | single)  # one record per case: rank 1 wrote none
    for case_id in multi:
        rec = by_id[case_id]
        assert rec["status"] == "ok", rec["reason"]
        assert rec["world_size"] == 2
        check_multi_rank_record(rec)
    (skipped,) = [by_id[c] for c in single]
    assert skipped["status"] == "skipped" and "torchrun started 2" in skipped["reason"]

    meta = results.load_meta(run_dir)
    assert meta["status"] == "complete" and meta["launcher"] == "torchrun"
    assert meta["launch"]["world_size"] == 2 and meta["launch"]["nnodes"] == 1
    assert [r["rank"] for r in meta["ranks"]] == [0, 1]
    assert meta["ceilings"]["host_memcpy_gbps"] > 0 and meta["ceilings"]["allreduce_busbw_gbps_w2"] > 0
    assert meta["device"]["type"] == "cpu"
    assert (rep / run_dir.name / "index.html").exists()
    assert [p.name for p in rep.iterdir()] == [run_dir.name]
    assert not list((tmp_path / "tmp").glob("ple_bench-rank*")), "rank 1's scratch folder was left behind"
    assert proc.stdout.count("records:") == 1  # rank 0 alone reports


FAILING_SUITE = """
[suite]
description = "torchrun test: rank 1 fails inside two cases; the cases after them must still run"

[suite.timing]
warmup_ms = 0
min_samples = 3
max_samples = 5
min_time_s = 0.0
max_time_s = 0.1
cold_l2 = false
hot = false

[defaults]
vocab_size = 4096
dim = 64
num_heads = 4
num_tokens = 8
dtype = "bf16"
seed = 1

[[group]]
name = "rank 1 fails (rank 0 waits in the id gather / in the default group)"
impl = ["tests.plugin_backends:RankOneRaisingBackend", "tests.plugin_backends:RankOneRaisingDefaultGroupBackend"]
tp = 1
etp = 2
dp = 2

[[group]]
name = "after the failures (larger vocab: ordered after them)"
impl = "device"
vocab_size = 8192
variants = [{ tp = 1, etp = 2, dp = 2 }, { tp = 2, etp = 2, dp = 1 }]
"""


def test_torchrun_failing_rank_is_recorded_and_the_run_goes_on(tmp_path):
    suite = tmp_path / "failing.toml"
    suite.write_text(FAILING_SUITE)
    res = tmp_path / "res"
    started = time.monotonic()
    proc = torchrun(tmp_path, "--suite", str(suite), "--results-dir", str(res), "--no-report")
    elapsed = time.monotonic() - started
    assert proc.returncode == 1, proc.stderr[-4000:]  # a failed case
    recs = results.load_records(only_run(res))
    assert [r["impl"] for r in recs] == ["tests.plugin_backends:RankOneRaisingBackend",
                                         "tests.plugin_backends:RankOneRaisingDefaultGroupBackend",
                                         "device", "device"]
    for rec in recs[:2]:
        assert rec["status"] == "failed"
        # the root cause (rank 1) comes first; rank 0's collective timeout after it
        assert rec["reason"].startswith("rank 1 failed: RuntimeError: planted failure on rank 1"), rec["reason"]
        assert "rank 0 failed" in rec["reason"] and "planted failure" in rec["traceback"]
        assert [(o["rank"], o["status"]) for o in rec["rank_outcomes"]] == [(0, "failed"), (1, "failed")]
        assert rec["median_ms"] is None
    for rec in recs[2:]:  # fresh process groups after the failures: these run normally
        assert rec["status"] == "ok", rec["reason"]
        check_multi_rank_record(rec)
    meta = results.load_meta(only_run(res))
    assert meta["status"] == "complete" and not meta.get("abort_reason")
    assert "FAILED" in proc.stderr and "planted failure on rank 1" in proc.stderr
    # each failure costs about one collective timeout, not a hang
    assert elapsed < 2 * COLLECTIVE_TIMEOUT_S + 60
