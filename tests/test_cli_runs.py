"""Runs that start from an earlier run's calibration, and records that name the kernel each lookup ran:
suites run end to end through `python -m ple_bench run` (a file of its own, beside test_cli.py, for
the parallel test workers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_cli import SUITE, _only_run, cli, run_suite_records, run_suite_text, verb

CALIBRATED_STEP = """
[suite]
description = "one decode step, calibrated"
[suite.timing]
warmup_ms = 0
min_samples = 3
max_samples = 3
max_time_s = 0.2
[[group]]
name = "step"
kind = "step"
impl = "device"
vocab_size = 1024
dim = 16
dtype = "bf16"
num_heads = 2
num_tokens = 4
hidden = 32
compute_us = 40
"""


@pytest.mark.slow  # python -m ple_bench run of a suite: a new interpreter and its worker processes
def test_run_calibration_starts_the_run_with_an_earlier_runs_matmul_counts(tmp_path):
    """``run --calibration FILE``: the steps run FILE's matmul count for their shape (a count no
    calibration here would pick), the run's calibration.json starts as FILE; a bad file is exit 2."""
    import json

    (tmp_path / "a").mkdir()
    first, _ = run_suite_text(tmp_path / "a", CALIBRATED_STEP)
    calib = json.loads((first / "calibration.json").read_text())
    (key, (count, per_us)), = calib.items()
    seeded = tmp_path / "seed.json"
    seeded.write_text(json.dumps({key: [count + 7, per_us]}))
    path = tmp_path / "a" / "suite.toml"
    res = tmp_path / "b"
    proc = cli("run", "--suite", str(path), "--results-dir", str(res), "--no-report", "--calibration", str(seeded))
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_dir = Path(_only_run(res))
    recs = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines() if line.strip()]
    assert {r["compute_matmuls"] for r in recs if r["kind"] == "step"} == {count + 7}
    assert json.loads((run_dir / "calibration.json").read_text()) == {key: [count + 7, per_us]}
    for bad in ("[1, 2]", '{"k": [1]}', "not json"):
        seeded.write_text(bad)
        proc = verb("run", "--suite", str(path), "--results-dir", str(res), "--no-report", "--calibration", str(seeded))
        assert proc.returncode == 2 and "--calibration" in proc.stderr, proc.stderr[-500:]
    proc = verb("run", "--suite", str(path), "--results-dir", str(res), "--calibration", str(tmp_path / "none.json"))
    assert proc.returncode == 2 and "--calibration" in proc.stderr


@pytest.mark.slow  # python -m ple_bench run of a suite: a new interpreter and its worker processes
def test_records_name_the_kernel_each_lookup_ran(tmp_path):
    """kernel_ran: the kernel the backend ran when the case names none (the device table's CPU
    default here; on a GPU its default is triton_reference), and None where the host gathers;
    the report's path label reads it."""
    from ple_bench.report.data import path_label

    text = SUITE.format(impls=json.dumps(["device", "pinned_uva", "pinned_cpu_gather"]),
                        dtypes=json.dumps(["bf16"]))
    recs = {r["impl"]: r for r in run_suite_records(tmp_path, text) if r["status"] == "ok"}
    assert recs["device"]["kernel_ran"] == "torch_masked"
    assert recs["pinned_uva"]["kernel_ran"] == "triton_reference"
    assert recs["pinned_cpu_gather"]["kernel_ran"] is None
    assert path_label(dict(recs["device"], kernel_ran="triton_reference")) == "device · triton_reference"
    assert path_label(dict(recs["device"], kernel_ran=None)) == "device · torch_masked"  # an older run's
