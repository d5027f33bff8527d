"""Fault isolation on a CUDA GPU: one run of ``python -m ple_bench run`` over a
generated suite whose faults sit between good cases: a device table larger than HBM and a pinned
table larger than host memory (both skipped with the numbers, never allocated), a plug-in
backend whose kernel writes to an illegal address (failed with the CUDA error; its worker's context
is lost), and a GPU spin past ``--case-timeout`` (failed, timed out, its worker killed).  Every good
case after a fault runs in a fresh worker and is ok with its own record.  The CPU matrix is
tests/test_fault_matrix.py.

``python -m pytest -m gpu tests/gpu``; skipped with the reason elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ple_bench import results
from ple_bench.spec.suite import load_suite
from tests._fault_matrix import Step, check_records, planned_order, write_suite

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 20  # a good case takes a few seconds (tiny table, short timing policy)


def _steps() -> list[Step]:
    from ple_bench.run.executor import host_memory_bytes

    hbm = torch.cuda.get_device_properties(0).total_memory
    host = host_memory_bytes()
    return [
        Step("good", "device", "ok"),
        Step("device table larger than HBM", "device", "skipped", ("of device memory",), table_bytes=3 * hbm // 2),
        Step("good", "device", "ok"),
        Step("pinned table larger than host memory", "pinned_uva", "skipped", ("of host memory",),
             table_bytes=3 * host // 2),
        Step("good", "device", "ok"),
        Step("illegal address", "tests.gpu.fault_backends:IllegalAddressBackend", "failed",
             ("illegal memory access",)),
        Step("good", "device", "ok"),
        Step("GPU hang", "tests.gpu.fault_backends:GpuHangBackend", "failed", ("timed out",)),
        Step("good", "device", "ok"),
    ]


def test_each_gpu_fault_between_two_good_cases(tmp_path):
    steps = _steps()
    suite = tmp_path / "faults.toml"
    vocabs = write_suite(suite, steps)
    assert planned_order(load_suite(suite).cases) == vocabs  # the runner runs them in this order
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for var in ("PLE_BENCH_FORCE_CPU", "PLE_BENCH_HOST_MEM_BYTES"):
        env.pop(var, None)
    proc = subprocess.run([sys.executable, "-m", "ple_bench", "run", "--suite", str(suite), "--results-dir",
                           str(tmp_path / "res"), "--no-report", "--case-timeout", str(TIMEOUT_S)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 1, proc.stderr[-3000:]  # failed cases, a complete run
    (run_dir,) = results.iter_run_dirs(tmp_path / "res")
    records = results.load_records(run_dir)
    check_records(records, steps, vocabs)
    meta = results.load_meta(run_dir)
    assert meta["status"] == "complete" and meta["mode"] == "gpu"
    assert all(r["mode"] == "gpu" for r in records)
