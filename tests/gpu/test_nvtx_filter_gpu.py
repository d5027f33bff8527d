"""Which ``ncu --nvtx-include`` expressions select a kernel inside nested ``ple_bench`` NVTX ranges
(``case demo`` ⊃ ``lookup`` ⊃ ``measurement``; one kernel outside ``measurement``, one inside).
``python -m ple_bench profile --tool ncu`` filters on ``ple_bench@measurement/``: it must select
the kernel inside the measurement range and only that one. Skipped where ncu is not installed.

On the H200 (2026-11-30): ``ple_bench@measurement/`` 1 kernel, ``ple_bench@*/measurement/`` 0,
the full path 1, ``ple_bench@case demo/*/measurement/`` 1
(docs/gpu-logs/2026-11-30-h200-first-runs/nvtx_probe.log)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import torch
from ple_bench.annotate import annotate
x = torch.ones(1 << 20, device="cuda")
with annotate("case demo"):
    with annotate("lookup"):
        x.add_(1)                       # kernel 1: outside measurement
        with annotate("measurement"):
            x.mul_(2)                   # kernel 2: inside measurement
torch.cuda.synchronize()
"""


@pytest.mark.parametrize("expr,kernels", [("ple_bench@measurement/", 1),
                                          ("ple_bench@case demo/lookup/measurement/", 1),
                                          ("ple_bench@case demo/*/measurement/", 1)])
def test_the_measurement_filter_selects_the_kernel_inside_it_only(tmp_path, expr, kernels):
    ncu = shutil.which("ncu")
    if ncu is None:
        pytest.skip("ncu is not installed here")
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([ncu, "--clock-control", "none", "--nvtx", "--nvtx-include", expr, sys.executable, str(probe)],
                          capture_output=True, text=True, timeout=300, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-2000:]
    assert out.count("==PROF== Profiling") == kernels, out[-2000:]
