"""Fault isolation on a CPU: each fault planted between two good cases, in one run.
The good cases are ``VictimBackend``, which fails in a process an earlier case poisoned, so an ok
record proves the case ran in a fresh worker and the result is its own.  Faults: a worker killed
(``os._exit``), a worker poisoned, a hang past ``--case-timeout``, a table larger than host memory
(skipped with the numbers, never allocated), and the case-level ones: wrong rows (invalid, never
timed) and a lookup that raises (failed, the worker kept).  The GPU matrix is
tests/gpu/test_fault_matrix_gpu.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ple_bench import results
from ple_bench.spec.suite import load_suite
from tests._fault_matrix import Step, check_records, planned_order, write_suite

ROOT = Path(__file__).resolve().parents[1]
GOOD = "tests.plugin_backends:VictimBackend"
HOST_MEM = 256 << 20  # what the run is told the host has (PLE_BENCH_HOST_MEM_BYTES)
TIMEOUT_S = 20

STEPS = [
    Step("good", GOOD, "ok"),
    Step("wrong rows", "tests.plugin_backends:WrongRowsBackend", "invalid", ("differ",)),
    Step("good", GOOD, "ok"),
    Step("lookup raises", "tests.plugin_backends:RaisingBackend", "failed", ("planted failure in lookup",)),
    Step("good", GOOD, "ok"),
    Step("worker killed", "tests.plugin_backends:CrashingBackend", "failed", ("died (exit code 17)",)),
    Step("good", GOOD, "ok"),
    Step("worker poisoned", "tests.plugin_backends:PoisoningBackend", "failed", ("poisons the worker",)),
    Step("good", GOOD, "ok"),
    Step("hang", "tests.plugin_backends:HangingBackend", "failed", ("timed out",)),
    Step("good", GOOD, "ok"),
    Step("table larger than host memory", "pinned_uva", "skipped", ("of host memory",),
         table_bytes=2 * HOST_MEM),
    Step("good", GOOD, "ok"),
]


@pytest.mark.slow  # python -m ple_bench run end to end: a new interpreter and five worker processes
def test_each_fault_between_two_good_cases(tmp_path):
    suite = tmp_path / "faults.toml"
    vocabs = write_suite(suite, STEPS)
    assert planned_order(load_suite(suite).cases) == vocabs  # the runner runs them in this order
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PLE_BENCH_FORCE_CPU="1", PLE_BENCH_HOST_MEM_BYTES=str(HOST_MEM))
    env.pop("PLE_BENCH_TEST_POISONED", None)
    proc = subprocess.run([sys.executable, "-m", "ple_bench", "run", "--suite", str(suite), "--results-dir",
                           str(tmp_path / "res"), "--no-report", "--case-timeout", str(TIMEOUT_S)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]  # failed cases, a complete run
    (run_dir,) = results.iter_run_dirs(tmp_path / "res")
    check_records(results.load_records(run_dir), STEPS, vocabs)
    assert results.load_meta(run_dir)["status"] == "complete"
