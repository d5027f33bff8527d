"""`python -m ple_bench run` of the smoke suite end to end on a CPU (the main job's fallback): a file of its
own so that the parallel test workers (`--dist loadfile`) run it beside test_cli.py's other runs."""

from __future__ import annotations

import json

import pytest

from ple_bench import results
from ple_bench.record import SCHEMA_VERSION
from ple_bench.results import RECORD_KEYS
from tests.test_cli import AXES, _only_run, cli

@pytest.mark.slow
def test_run_smoke_end_to_end(tmp_path):
    res_dir, rep_dir = tmp_path / "results", tmp_path / "reports"
    proc = cli("run", "--suite", "smoke", "--results-dir", str(res_dir), "--reports-dir", str(rep_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "functional mode" in proc.stderr
    run_dir = _only_run(res_dir)
    meta = results.load_meta(run_dir)
    for key in ("run_id", "suite", "device", "torch", "triton", "python", "git_commit", "host", "ceilings",
                "started_at", "ended_at"):
        assert key in meta, key
    assert meta["mode"] == "functional" and meta["status"] == "complete"
    assert meta["ceilings"]["host_memcpy_gbps"] > 0
    recs = results.load_records(run_dir)
    from ple_bench.backends.kernels import get_kernel, kernel_reads_sorted
    from ple_bench.spec.suite import load_suite

    assert {r["case_id"] for r in recs} == {c.case_id for c in load_suite("smoke").cases}
    # the run's summaries beside its records (ple_bench.report.export), one row per record
    import pandas as pd

    assert list(pd.read_csv(run_dir / "summary.csv")["case_id"]) == [r["case_id"] for r in recs]
    md_rows = [ln for ln in (run_dir / "summary.md").read_text().splitlines() if ln.startswith("| ")]
    assert len(md_rows) == len(recs) + 1  # the header and a row per record
    statuses = {r["status"] for r in recs}
    assert statuses <= {"ok", "skipped"}
    # the run's one compute calibration, which every worker of the run reads (ple_bench.run.step)
    calibration = json.loads((run_dir / "calibration.json").read_text())
    assert {tuple(v) for v in calibration.values()} >= {(r["compute_matmuls"], r["matmul_us"]) for r in recs
                                                          if r["status"] == "ok" and r.get("compute_matmuls")}
    for r in recs:
        for key in RECORD_KEYS + AXES:
            assert key in r, (key, r["case_id"])
        if r["status"] == "ok":
            assert r["timer"] == "host_monotonic"
            assert r["median_ms"] > 0 and len(r["samples_ms"]) == r["n_samples"] >= 1
            assert r["schema_version"] == SCHEMA_VERSION and r["upgraded_from"] is None
            if r["kind"] == "lookup":
                assert r["gbps"] > 0 and r["rows_per_s"] > 0 and r["pct_of_ceiling"] > 0
                # functional mode: single-rank kernel paths against their own random-row ceiling
                # (meta.json ceilings.random_row), host paths their host-gather one, multi-rank the memcpy
                # (the batch's own rows), copy engines (no gather to bound them here) the memcpy
                if r["tp"] * r["dp"] > 1 or r["lookup_mechanism"] == "host_copy":
                    assert r["ceiling"] == "host_memcpy_gbps"
                elif r["host_gather_ceiling_ms"] is not None:
                    assert r["ceiling"] == "host_gather" and r["lookup_mechanism"] == "host_gather"
                else:  # a kernel declared sorted_reads is held against the same rows gathered sorted
                    sorted_reads = kernel_reads_sorted(get_kernel(r["kernel_ran"]))
                    assert r["ceiling"] == ("host_sorted_random_row_at_rows" if sorted_reads
                                            else "host_random_row_at_rows")
                    assert meta["ceilings"]["random_row"][r["random_row_ceiling_at_rows"]]["gbps"] == r["ceiling_gbps"]
            else:  # steps carry no GB/s and no share of a ceiling
                assert r["gbps"] is None and r["ceiling"] is None and r["pct_of_ceiling"] is None
        else:
            assert r["reason"]
    # multi-rank cases really ran on two gloo ranks
    multi = [r for r in recs if r["tp"] * r["dp"] > 1]
    assert multi and all(r["status"] == "ok" and len(r["rank_medians_ms"]) == 2 for r in multi)
    steps = [r for r in recs if r["kind"] == "step" and r["status"] == "ok"]
    assert steps and all(r["step_ms"] > 0 for r in steps)
    # what a path reports about itself: host-thread CPU time, cache hit rate
    by_impl = {}
    for r in recs:
        if r["status"] == "ok":
            by_impl.setdefault(r["impl"], []).append(r)
    assert all(r["host_thread_ms"] > 0 for r in by_impl["pinned_cpu_gather"])
    assert all(r["host_thread_ms"] == 0 for r in by_impl["device"] + by_impl["pinned_uva"])
    assert all(0 <= r["cache_hit_rate"] <= 1 for r in by_impl["pinned_hot_cache"])
    assert all(r["id_sets"] == 2 for r in recs if r["status"] == "ok" and r["kind"] == "lookup")
    # every pinned step is held against the resident step of its workload (ids on the device, the same
    # id distribution and timer, its best prefetch and graph mode), which the suite carries, named in the record
    by_id = {r["case_id"]: r for r in recs}
    pinned_steps = [r for r in steps if r["impl"] != "device" and r["status"] == "ok"]
    assert pinned_steps
    for r in pinned_steps:
        base = by_id[r["offload_baseline"]]
        assert base["impl"] == "device" and base["ids_on"] == "device" and base["offload_overhead"] is None
        assert (base["ids"], base["num_tokens"], base["compute_us"]) == (r["ids"], r["num_tokens"], r["compute_us"])
        like = by_id.get(r["offload_baseline_same_graph"])  # its own graph mode and prefetch, where measured
        assert like is None or (like["prefetch"], like["graph"]) == (r["prefetch"], r["graph"])
        assert r["offload_overhead"] == pytest.approx(r["step_ms"] / r["offload_baseline_ms"] - 1)
    df = results.load(run_dir)
    assert len(df) == len(recs)
    assert (rep_dir / run_dir.name / "index.html").exists()
