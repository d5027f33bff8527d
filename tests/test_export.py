"""pytest-benchmark JSON export: format, seconds, ok records only, and that
pytest-benchmark's own storage loader and `compare` CLI read it."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from ._fake_runs import write_cpu_run, write_gpu_run
from ple_bench.spec.case import Case
from ple_bench.report.export import benchmark_stats, main as export_main, write_pytest_benchmark_json
from ple_bench.results import load_records

pytest_benchmark = pytest.importorskip("pytest_benchmark")
from pytest_benchmark.stats import Stats  # noqa: E402
from tests._fixtures import fixture_run

TARGET = Case(impl="pinned_uva", dtype="fp8", dim=160, vocab_size=1 << 24, num_heads=16, num_tokens=1024)


def small(case: Case) -> bool:
    return case.kind == "step" or (case.num_tokens == 1024 and case.dim == 160)


def test_export_format_and_units(tmp_path):
    run = write_gpu_run(tmp_path / "results", "run-a", seed=1, only=small)
    path = write_pytest_benchmark_json(run)
    assert path == run / "pytest-benchmark.json"
    doc = json.loads(path.read_text())
    assert set(doc) == {"machine_info", "commit_info", "benchmarks", "datetime", "version"}
    assert doc["version"] == pytest_benchmark.__version__
    assert doc["machine_info"]["node"] == "h200-node-1" and doc["machine_info"]["gpu"]["name"] == "NVIDIA H200"
    assert doc["commit_info"]["id"] == "0123456789abcdef0123456789abcdef01234567"
    records = load_records(run)
    ok = {r["case_id"]: r for r in records if r["status"] == "ok"}
    assert len(ok) < len(records)  # the fake run has skipped/failed/invalid cases
    assert {b["name"] for b in doc["benchmarks"]} == set(ok)  # only ok records
    for bench in doc["benchmarks"]:
        assert set(bench) >= {"group", "name", "fullname", "params", "extra_info", "options", "stats"}
        rec = ok[bench["name"]]
        stats = bench["stats"]
        assert set(stats) == {"min", "max", "mean", "stddev", "rounds", "median", "iqr", "q1", "q3",
                              "iqr_outliers", "stddev_outliers", "outliers", "ld15iqr", "hd15iqr", "ops",
                              "total", "data", "iterations"}
        # Seconds, not milliseconds.
        assert stats["median"] == pytest.approx(rec["median_ms"] / 1e3, rel=1e-12)
        assert stats["data"] == pytest.approx([v / 1e3 for v in rec["samples_ms"]], rel=1e-12)
        assert stats["rounds"] == len(rec["samples_ms"]) and stats["iterations"] == 1
        assert bench["params"]["impl"] == rec["impl"] and bench["params"]["vocab_size"] == rec["vocab_size"]
        assert bench["group"] == f"{rec['kind']}.{rec['impl']}"
        if rec["kind"] == "lookup":
            assert bench["extra_info"]["gbps"] == pytest.approx(rec["gbps"])
        else:
            assert bench["extra_info"]["exposed_ms"] == pytest.approx(rec["exposed_ms"])


@pytest.mark.parametrize("n", [1, 2, 5, 6, 7, 9, 30])
def test_stats_match_pytest_benchmark_stats(n):
    rng = np.random.default_rng(n)
    data = list(rng.lognormal(-9, 0.3, size=n))
    data[0] *= 4  # an outlier
    ours = benchmark_stats(data)
    ref = Stats()
    for v in data:
        ref.update(v)
    for field in Stats.fields:
        expected = getattr(ref, field)
        if isinstance(expected, str):
            assert ours[field] == expected, field
        else:
            assert ours[field] == pytest.approx(expected, rel=1e-12, abs=0), field
    assert ours["data"] == data


def test_pytest_benchmark_storage_loads_it(tmp_path):
    from pytest_benchmark.logger import Logger
    from pytest_benchmark.storage.file import FileStorage

    run = write_gpu_run(tmp_path / "results", "run-a", seed=1, only=small)
    path = write_pytest_benchmark_json(run)
    warnings = []

    class Recorder(Logger):
        def warning(self, text, **kwargs):
            warnings.append(text)

    storage = FileStorage(tmp_path / "storage", logger=Recorder(Logger.QUIET))
    benches = list(storage.load_benchmarks(str(path)))
    assert not warnings
    ok = {r["case_id"]: r for r in load_records(run) if r["status"] == "ok"}
    assert {b["name"] for b in benches} == set(ok)
    for b in benches:
        assert b["median"] == pytest.approx(ok[b["name"]]["median_ms"] / 1e3)
        assert b["ops"] == pytest.approx(b["rounds"] / b["total"])


def test_pytest_benchmark_compare_cli_reads_two_exports(tmp_path):
    results = tmp_path / "results"
    a = write_pytest_benchmark_json(write_gpu_run(results, "run-a", seed=1, only=small))
    b = write_pytest_benchmark_json(write_gpu_run(
        results, "run-b", seed=2, only=small, factor=lambda c: 1.3 if c.case_id == TARGET.case_id else 1.0))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_benchmark", "compare", str(a), str(b), "--between=median",
         f"--csv={cwd / 'out'}"],
        cwd=cwd, capture_output=True, text=True, timeout=120, env=dict(os.environ, COLUMNS="250"))
    assert proc.returncode == 0, proc.stderr
    assert "Failed to load" not in proc.stdout + proc.stderr
    line = next(l for l in proc.stdout.splitlines() if l.startswith(TARGET.case_id))
    delta = float(re.search(r"([+-]\d+(?:\.\d+)?)%\s*$", line).group(1))
    ra = {r["case_id"]: r for r in load_records(results / "run-a") if r["status"] == "ok"}
    rb = {r["case_id"]: r for r in load_records(results / "run-b") if r["status"] == "ok"}
    expect = (rb[TARGET.case_id]["median_ms"] / ra[TARGET.case_id]["median_ms"] - 1) * 100
    assert delta == pytest.approx(expect, abs=0.06) and delta > 20
    # The CSV pytest-benchmark wrote holds our medians, in seconds: one row per case and run.
    rows = list(csv.DictReader(open(cwd / "out.csv")))
    got: dict[str, list[float]] = {}
    for row in rows:
        got.setdefault(row["name"].split("::", 1)[1], []).append(float(row["median"]))
    assert set(got) == set(ra)
    for cid, medians in got.items():
        expected = [ra[cid]["median_ms"] / 1e3, rb[cid]["median_ms"] / 1e3]
        assert sorted(medians) == pytest.approx(sorted(expected), rel=1e-9)


def test_cpu_run_and_cli(tmp_path, capsys):
    run = write_cpu_run(tmp_path / "results")
    out = tmp_path / "elsewhere" / "pb.json"
    assert export_main([str(run), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["machine_info"]["mode"] == "functional" and doc["machine_info"]["timer"] == "host_monotonic"
    assert doc["commit_info"]["id"] == "unknown"
    assert len(doc["benchmarks"]) == sum(r["status"] == "ok" for r in load_records(run))
    assert export_main([str(tmp_path / "missing")]) == 2


# ------------------------------------------------------------------ summaries

def _markdown_table(text: str) -> tuple[list[str], list[list[str]]]:
    """summary.md's table of cases (after its verdict: the section "## Cases")."""
    assert text.count("## Verdict") == 1 and text.index("## Verdict") < text.index("## Cases")
    lines = [ln for ln in text.split("## Cases", 1)[1].splitlines() if ln.startswith("|")]
    split = lambda ln: [c.strip() for c in re.split(r"(?<!\\)\|", ln.strip())[1:-1]]  # noqa: E731
    assert set(lines[1].replace("|", "")) == {"-"}
    return split(lines[0]), [split(ln) for ln in lines[2:]]


def test_report_writes_summary_md_and_csv_that_read_back(tmp_path, capsys):
    import pandas as pd

    from ple_bench.commands.report import report_main
    from ple_bench.report.data import fmt, fmt_bytes

    run = write_gpu_run(tmp_path / "results")
    assert report_main([str(run), "--reports-dir", str(tmp_path / "reports")]) == 0
    records = load_records(run)
    # summary.csv: one row per record, the main fields as stored
    df = pd.read_csv(run / "summary.csv")
    assert list(df["case_id"]) == [r["case_id"] for r in records]
    assert list(df["status"]) == [r["status"] for r in records]
    by_id = {r["case_id"]: r for r in records}
    ok = df[df["status"] == "ok"]
    for cid, median, gbps in zip(ok["case_id"], ok["median_ms"], ok["gbps"]):
        assert median == by_id[cid]["median_ms"]
        assert (np.isnan(gbps) and by_id[cid]["gbps"] is None) or gbps == by_id[cid]["gbps"]
    assert {"path", "topology", "table_bytes", "pct_of_ceiling", "reason"} <= set(df.columns)
    # summary.md: the axes that vary in this run, then the five figures; one row per record
    header, rows = _markdown_table((run / "summary.md").read_text())
    assert header[-5:] == ["time ms", "noise %", "GB/s", "% of ceiling", "status"]
    for varying in ("kind", "path (impl · kernel)", "table", "dtype", "tokens", "topology", "prefetch", "compute µs"):
        assert varying in header, varying
    for fixed in ("seed", "hidden", "host_alloc", "impl", "vocab_size", "tp"):  # the same in every case, or folded
        assert fixed not in header, fixed
    assert len(rows) == len(records) and all(len(r) == len(header) for r in rows)
    col = {h: i for i, h in enumerate(header)}
    target = next(r for r in records if r["status"] == "ok" and r["kind"] == "lookup" and r["impl"] == "pinned_uva"
                  and (r["tp"], r["etp"], r["dp"]) == (1, 1, 1))
    row = rows[[r["case_id"] for r in records].index(target["case_id"])]
    assert row[col["time ms"]] == fmt(target["median_ms"], 3) and row[col["GB/s"]] == fmt(target["gbps"], 3)
    assert row[col["% of ceiling"]] == f"{target['pct_of_ceiling']:.0f}"
    assert row[col["status"]] == "ok"
    assert row[col["table"]] == fmt_bytes(target["table_bytes"]) and row[col["topology"]] == "tp1 etp1 dp1"
    failed = next(r for r in records if r["status"] == "failed")
    frow = rows[[r["case_id"] for r in records].index(failed["case_id"])]
    assert frow[col["status"]].startswith("failed: ") and frow[col["time ms"]] == ""
    assert "\\|" in frow[col["status"]] or "|" not in failed["reason"]  # a | in a reason cannot split the row


def test_summary_of_an_archived_gpu_run_names_the_axes_that_tell_cases_apart():
    """The production-table paths run: steps only, differing in path, tokens, graph, ids and where
    the ids are; every row of summary.md is a different case, its noise the record's, in %."""
    from pathlib import Path

    from ple_bench.report.export import summary_frame, summary_markdown
    from ple_bench.report.data import fmt, load_run

    run = load_run(fixture_run("20261201-130202-paths-b4db"))
    header, rows = _markdown_table(summary_markdown(run))
    assert header[:-5] == ["path (impl · kernel)", "tokens", "prefetch", "graph", "ids", "ids_on", "host_alloc"]
    assert len({tuple(r[:-5]) for r in rows}) == len(rows) == 42
    first = run.records[0]
    assert rows[0][header.index("noise %")] == fmt(first["noise"] * 100, 2)
    assert rows[0][header.index("GB/s")] == "" and rows[0][header.index("% of ceiling")] == ""  # steps carry none
    assert list(summary_frame(run)["noise"]) == [r["noise"] for r in run.records]
