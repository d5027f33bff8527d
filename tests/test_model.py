"""The what-if model: fitted on synthetic steps that follow a known law its leave-one-out error
is ~0; predictions outside what was measured are flagged; the ETP reduce is alpha-beta; advise
answers with measured / predicted marked, writes an HTML page, and exits 2 on impossible what-ifs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ple_bench.report.model import GIB, Rates, build_model, predict, reduce_ms

ROOT = Path(__file__).resolve().parents[1]


def law(impl, prefetch, rows, table, compute_us):
    """A known step law: compute, lookup (rate falling with the table), exposed."""
    compute = 0.02 + 0.001 * compute_us + 2e-6 * rows
    per_row = {"device": 1e-6, "pinned_uva": 2e-5}[impl]
    delta = 0.0 if impl == "device" else 0.1
    lookup = 0.005 + per_row * rows * (table / (32 * GIB)) ** delta
    exposed = (max(0.0, lookup - compute) if prefetch else lookup) + 0.003
    return compute, lookup, compute + exposed


def synthetic(tables=(8 * GIB, 32 * GIB), tokens=(64, 128, 256, 512), computes=(50.0, 200.0)):
    recs = []
    for impl, pf in (("device", False), ("pinned_uva", True), ("pinned_uva", False)):
        for table in tables:
            for t in tokens:
                for cu in computes:
                    c, lk, st = law(impl, pf, t * 16, table, cu)
                    recs.append({"case_id": f"step.{impl}.{pf}.{table}.{t}.{cu}", "status": "ok", "kind": "step",
                                 "mode": "gpu", "world_size": 1, "impl": impl, "kernel": "triton_reference",
                                 "prefetch": pf, "ids_on": "device", "graph": "breakable", "num_tokens": t,
                                 "num_heads": 16, "rows": t * 16, "row_bytes": 160, "dim": 160, "dtype": "fp8",
                                 "table_bytes": table, "compute_us": cu, "compute_ms": c, "lookup_ms": lk,
                                 "step_ms": st, "_run_id": "20261201-000000-synthetic"})
    # a table-size sweep of pinned lookups with the same law's delta
    for table in (8 * GIB, 32 * GIB, 64 * GIB):
        recs.append({"case_id": f"lookup.{table}", "status": "ok", "kind": "lookup", "mode": "gpu", "world_size": 1,
                     "impl": "pinned_uva", "kernel": "triton_reference", "prefetch": False, "rows": 4096,
                     "row_bytes": 160, "table_bytes": table, "_run_id": "20261201-000000-synthetic",
                     "median_ms": 0.1 * (table / (32 * GIB)) ** 0.1})
    return recs


def test_known_law_is_recovered_with_near_zero_leave_one_out_error():
    m = build_model(synthetic(), [], row_bytes=160)
    assert m.rates.delta_kernel == pytest.approx(0.1, abs=1e-6)
    assert m.loo_overall.n == 3 * 2 * 4 * 2 and m.loo_overall.worst_pct < 1.0
    fit = next(f for k, f in m.fits.items() if k[0] == "pinned_uva" and k[2])
    # a 200 GB table and 1024 tokens were never measured: predicted, flagged, and still on the law
    pr = predict(fit, m.rates, rows=1024 * 16, table_bytes=200 * 10**9, compute_us=200)
    assert any("table" in o for o in pr.outside) and any("rows" in o for o in pr.outside)
    assert pr.step_ms == pytest.approx(law("pinned_uva", True, 1024 * 16, 200 * 10**9, 200)[2], rel=0.02)


def test_leave_one_out_is_not_zero_on_noisy_data():
    recs = synthetic()
    recs[5]["step_ms"] *= 1.5  # one measurement off the law: its own prediction misses it
    m = build_model(recs, [], row_bytes=160)
    assert m.loo_overall.worst_case == recs[5]["case_id"] and m.loo_overall.worst_pct > 20


def test_etp_reduce_is_alpha_beta_and_the_link_bounds_it():
    r = Rates(reduce_alpha_ms=0.015, reduce_busbw_gbps=240.0)
    assert reduce_ms(r, 1, 1e6) == 0.0
    assert reduce_ms(r, 4, 1e6) == pytest.approx(0.015 + 1e6 * 1.5 / 240e9 * 1e3)
    # over 2 nodes with a 50 GB/s link and 5 us latency: the link's bandwidth, two more latencies
    assert reduce_ms(r, 4, 1e6, nodes=2, link_gbps=50, link_latency_us=5) == \
        pytest.approx(0.015 + 0.010 + 1e6 * 1.5 / 50e9 * 1e3)
    with pytest.raises(ValueError, match="no all-reduce"):
        reduce_ms(Rates(), 2, 1e6)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "ple_bench", "advise", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


SHAPE = ["--dim", "160", "--dtype", "fp8", "--heads", "16", "--compute-us", "200"]


@pytest.fixture(scope="module")
def runs():
    return sorted(str(p) for p in (ROOT / "docs" / "runs").iterdir() if (p / "meta.json").exists())


def test_advise_what_if_marks_predicted_and_writes_html(runs, tmp_path):
    html = tmp_path / "advice.html"
    proc = _cli("--table-bytes", "200GB", "--tokens", "64,512", *SHAPE, "--runs", *runs, "--etp", "4",
                "--json", "--html", str(html))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    m = out["model"]
    assert m["verdict"].startswith("ETP 4") and out["verdict"] == m["verdict"]
    opts = [o for a in m["answers"] for o in a["options"]]
    assert opts and all(o["source"] == "predicted" for o in opts)  # an ETP 4 group was never measured
    assert all(o["error_median_pct"] is not None for o in opts if o["error"].startswith("leave-one-out"))
    assert m["loo_overall"]["n"] > 100 and m["what_would_change"]
    page = html.read_text()
    assert 'id="verdict"' in page and "predicted" in page and "data:image/png;base64" in page
    assert "leave-one-out" in page


def test_advise_marks_a_measured_case_measured(runs):
    proc = _cli("--table-bytes", "47.7GiB", "--tokens", "256", *SHAPE, "--runs", *runs, "--graph", "any", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    opts = json.loads(proc.stdout)["model"]["answers"][0]["options"]
    measured = [o for o in opts if o["source"] == "measured"]
    assert measured and all(o["run_id"] and o["error"] == "" for o in measured)


@pytest.mark.parametrize("extra, key", [
    (["--etp", "3", "--nodes", "2"], "--etp / --nodes"),
    (["--etp", "4", "--nodes", "2"], "--link-gbps"),
    (["--host-cores", "0"], "--host-cores"),
    (["--link-gbps", "-1"], "--link-gbps"),
    (["--hbm-bytes", "10GiB", "--host-bytes", "10GiB", "--etp", "2"], "fits neither"),
])
def test_advise_impossible_what_ifs_exit_2(runs, extra, key):
    proc = _cli("--table-bytes", "47.7GiB", "--tokens", "64", *SHAPE, "--runs", *runs[-1:], *extra)
    assert proc.returncode == 2 and key in proc.stderr, proc.stderr


def test_advise_zero_tokens_exits_2_before_running_anything():
    proc = _cli("--table-bytes", "1GiB", "--tokens", "0", *SHAPE)
    assert proc.returncode == 2 and "--tokens" in proc.stderr


@pytest.mark.slow
def test_advise_without_runs_runs_its_cases_and_on_a_cpu_ranks_nothing(tmp_path):
    proc = _cli("--table-bytes", "1GiB", "--dim", "160", "--dtype", "fp8", "--heads", "4", "--tokens", "8",
                "--compute-us", "20", "--results-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    if "functional mode" not in proc.stdout:
        pytest.skip("a GPU machine: the self-run measured and ranked (tests/gpu covers it)")
    (run,) = [p for p in tmp_path.iterdir() if (p / "meta.json").exists()]
    from ple_bench.results import load_records

    recs = load_records(run)
    assert (run / "advise.toml").exists() and len(recs) == 16  # 12 cases and the resident baselines they need
    assert all(r["status"] == "ok" and r["mode"] == "functional" for r in recs), \
        [(r["case_id"], r["status"], r["reason"]) for r in recs if r["status"] != "ok"]
    assert "not timings" in proc.stdout


def test_a_prefetch_cannot_hide_the_etp_reduce():
    """The all-reduce runs in finalize after the compute: a prefetched path whose local lookup is
    fully hidden still exposes the whole reduce, and its step grows by exactly that much."""
    from ple_bench.report.model import PathFit

    fit = PathFit(key=("pinned_cpu_gather", "", True, "host", "breakable", "uniform", 0), c0=0.01, c1=1e-3, c2=0.0,
                  l0=0.02, l1=1e-5, e0=0.0, e1=0.0, n=10, tables=(GIB, 64 * GIB), rows=(1024, 8192),
                  computes=(50.0, 200.0), resident=False, host_gather=True, prefetch=True, row_bytes=160)
    rates = Rates(reduce_alpha_ms=0.015, reduce_busbw_gbps=240.0)
    one = predict(fit, rates, rows=4096, table_bytes=32 * GIB, compute_us=200.0)
    four = predict(fit, rates, rows=4096, table_bytes=32 * GIB, compute_us=200.0, etp=4)
    red = reduce_ms(rates, 4, 4 * 4096 * 160)
    assert one.exposed_ms == pytest.approx(0.0)  # the local lookup hides behind 0.21 ms of compute
    assert four.reduce_ms == pytest.approx(red) and four.exposed_ms == pytest.approx(red)
    assert four.step_ms - four.compute_ms == pytest.approx(red)
