"""``python -m ple_bench profile --tool torch`` on a CUDA GPU: the trace of a prefetched pinned_uva
decode step shows the step's phases as named ranges, and its lookup kernel on a CUDA stream of its
own, not the stream of the compute's matmuls (what the prefetch is for).

On the H200 (2026-12-01): the lookup kernel ``ple_lookup_row_per_program`` on stream 13, the
matmuls on stream 7, 23 % of the lookup's GPU time beside them
(docs/gpu-logs/2026-12-01-h200-host-paths/03-torch_trace_check.log)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu.trace_streams import PHASES, analyse

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
SUITE = "nightly"
CASE = "step.pinned_uva.v6710886.d160.fp8.h16.t256.pf.c100us*"  # 1 GiB fp8 table, 100 us of compute


def test_prefetched_lookup_runs_on_its_own_stream_beside_the_matmuls(tmp_path):
    cmd = [sys.executable, "-m", "ple_bench", "profile", "--suite", SUITE, "--case", CASE, "--tool", "torch",
           "--samples", "5", "--results-dir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    found = re.search(r"^trace: (\S+) ", proc.stdout, re.M)
    assert found, f"no trace path printed:\n{proc.stdout[-2000:]}"
    res = analyse(json.loads(Path(found.group(1)).read_text()))
    assert res["has_kernels"] and res["steps"] > 0
    assert set(PHASES) <= set(res["range_names"]), res["range_names"]
    assert res["lookup_streams"] and res["compute_streams"], res["phases"]
    assert not set(res["lookup_streams"]) & set(res["compute_streams"]), \
        f"lookup {res['lookup_names']} on {res['lookup_streams']}, matmuls on {res['compute_streams']}"
