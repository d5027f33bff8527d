"""The verbs that read stored records (report, compare, schema) do not import torch: each runs in
a fresh interpreter and says whether ``torch`` is in ``sys.modules`` when it is done.  ``env``,
which does need torch, is the control that shows the probe can see it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ._fake_runs import write_gpu_run

REPO = Path(__file__).resolve().parents[1]

PROBE = ("import contextlib, io, json, sys\n"
         "from ple_bench.cli import main\n"
         "with contextlib.redirect_stdout(io.StringIO()):\n"
         "    rc = main(sys.argv[1:])\n"
         "print(json.dumps({'rc': rc, 'torch': 'torch' in sys.modules}))\n")


def verb_loads(*argv: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    base = write_gpu_run(root, "20261130-020000-nightly-b0a1", seed=1, n_samples=8, include_broken=False)
    cand = write_gpu_run(root, "20261201-020000-nightly-c0a1", seed=2, n_samples=8, include_broken=False,
                         started_at="2026-12-01T02:00:00+00:00")
    return base, cand


def test_schema_does_not_import_torch():
    assert verb_loads("schema") == {"rc": 0, "torch": False}


def test_report_does_not_import_torch(runs, tmp_path):
    base, _ = runs
    assert verb_loads("report", str(base), "--reports-dir", str(tmp_path)) == {"rc": 0, "torch": False}
    assert any(tmp_path.rglob("index.html"))


def test_compare_does_not_import_torch(runs):
    base, cand = runs
    out = verb_loads("compare", str(base), str(cand))
    assert out["torch"] is False and out["rc"] in (0, 1)  # 1: a regression found in the noise, still read


def test_the_probe_sees_torch_when_a_verb_loads_it():
    assert verb_loads("env")["torch"] is True
