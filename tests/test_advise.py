"""`advise`: ranked options and the recommendation from measured step records (hand-made here),
the verdict, the memory budgets, bad input exits 2 naming the flag, and a run over docs/runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ple_bench.report.advise import AdviseError, advise

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30


def rec(impl, tokens, step_ms, overhead=None, graph="breakable", ids_on="host", kernel="", table=32 * GIB,
        compute=200.0):
    r = {"case_id": f"step.{impl}.{kernel}.t{tokens}.{graph}.{ids_on}.{table}", "status": "ok", "kind": "step",
         "impl": impl, "kernel": kernel, "dim": 160, "dtype": "fp8", "num_heads": 16, "num_tokens": tokens,
         "graph": graph, "ids_on": ids_on, "prefetch": impl != "device", "compute_us": compute,
         "table_bytes": table, "step_ms": step_ms, "_run_id": "20261201-000000-paths-t"}
    if impl != "device":
        r.update(offload_overhead=overhead, offload_baseline="device · triton_reference",
                 offload_baseline_timer="host_sync")
    return r


RECS = [rec("device", 256, 0.266), rec("pinned_cpu_gather", 256, 0.272, 0.02),
        rec("pinned_uva", 256, 0.459, 0.72, kernel="triton_reference"),
        rec("device", 512, 0.289), rec("pinned_cpu_gather", 512, 0.314, 0.09),
        rec("pinned_uva", 512, 0.30, -0.30, graph="eager"),  # eager: not how a server runs the step
        rec("pinned_uva", 256, 0.2, -0.5, table=GIB)]  # another table size


def test_ranked_options_recommendation_and_verdict():
    a = advise(table_bytes=47 * GIB, dim=160, dtype="fp8", heads=16, tokens=[256, 512], compute_us=200, records=RECS)
    assert a.measured_table_bytes == 32 * GIB and any("32.0 GiB table" in n for n in a.notes)
    t256, t512 = a.answers
    assert [o.placement for o in t256.options] == ["HBM", "pinned host", "pinned host"]
    assert t256.options[1].path == "pinned_cpu_gather" and t256.options[1].overhead_pct == pytest.approx(2.0)
    assert t256.recommendation.startswith("pinned host: pinned_cpu_gather") and "+2 %" in t256.recommendation
    assert t512.recommendation.startswith("HBM") and "+9 %" in t512.recommendation  # the eager -30 % is not ranked
    assert all(o.graph != "eager" for o in t512.options if o.placement != "HBM")
    assert a.verdict == "Pinned host memory is as fast as HBM at 256 tokens; from 512 tokens HBM wins."
    # the same with eager steps allowed: now the eager -30 % ranks first
    a = advise(table_bytes=32 * GIB, dim=160, dtype="fp8", heads=16, tokens=[512], compute_us=200, records=RECS,
               graph_modes="any")
    assert a.answers[0].options[1].graph == "eager"


def test_budgets_and_impossible_inputs():
    a = advise(table_bytes=32 * GIB, dim=160, dtype="fp8", heads=16, tokens=[512], compute_us=200, records=RECS,
               hbm_bytes=16 * GIB)
    assert a.answers[0].recommendation.startswith("pinned host (the table does not fit the HBM budget)")
    assert not a.answers[0].options[0].fits and "does not fit the HBM budget" in a.verdict
    with pytest.raises(AdviseError, match="fits neither"):
        advise(table_bytes=32 * GIB, dim=160, dtype="fp8", heads=16, tokens=[256], compute_us=200, records=RECS,
               hbm_bytes=GIB, host_bytes=GIB)
    with pytest.raises(AdviseError, match="--tokens"):
        advise(table_bytes=GIB, dim=160, dtype="fp8", heads=16, tokens=[0], compute_us=200, records=RECS)
    with pytest.raises(AdviseError, match="no measured decode step of dim 128"):
        advise(table_bytes=GIB, dim=128, dtype="fp8", heads=16, tokens=[256], compute_us=200, records=RECS)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "ple_bench", "advise", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_cli_answers_the_qwen4exp_shape_from_the_archived_runs():
    runs = sorted(str(p) for p in (ROOT / "docs" / "runs").iterdir() if (p / "meta.json").exists())
    proc = _cli("--table-bytes", "47.7GiB", "--dim", "160", "--dtype", "fp8", "--heads", "16", "--tokens",
                "64,256,512", "--compute-us", "200", "--runs", *runs, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert [a["tokens"] for a in out["answers"]] == [64, 256, 512] and out["verdict"]
    assert all(o["run_id"] for a in out["answers"] for o in a["options"])
    bad = _cli("--table-bytes", "lots", "--dim", "160", "--dtype", "fp8", "--heads", "16", "--tokens", "64",
               "--compute-us", "200", "--runs", *runs[:1])
    assert bad.returncode == 2 and "--table-bytes" in bad.stderr
    bad = _cli("--rows", "100", "--dim", "160", "--dtype", "fp8", "--heads", "16", "--tokens", "64",
               "--compute-us", "200", "--runs", "/nonexistent")
    assert bad.returncode == 2 and "not a run folder" in bad.stderr
