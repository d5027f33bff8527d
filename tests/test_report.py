"""HTML report of stored runs: sections, inline images, no network, findings
that follow the data, tolerance of old/CPU runs, trend over history, CLI."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest

from ._fake_runs import BROKEN_REASONS, gpu_cases, write_cpu_run, write_gpu_run, write_run
from ple_bench.spec.case import Case
from ple_bench.commands.report import report_main
from ple_bench.report import build_report
from ple_bench.report.data import Run, slice_series
from ple_bench.report.findings import findings
from ple_bench.results import load_records
from tests._fixtures import FIXTURE_RUNS, fixture_run

EXTERNAL = re.compile(r"""(?:src|href|action|poster)\s*=\s*["']?\s*(?:https?:)?//""", re.I)


@pytest.fixture(scope="module")
def gpu_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu")
    run_dir = write_gpu_run(root / "results")
    path = build_report(run_dir, root / "reports")
    return run_dir, path, path.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def cpu_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("cpu")
    run_dir = write_cpu_run(root / "results")
    path = build_report(run_dir, root / "reports")
    return run_dir, path, path.read_text(encoding="utf-8")


def images(html: str) -> list[bytes]:
    srcs = re.findall(r'<img[^>]*\ssrc="([^"]*)"', html)
    out = []
    for src in srcs:
        assert src.startswith("data:image/png;base64,"), src[:60]
        out.append(base64.b64decode(src.split(",", 1)[1], validate=True))
    return out


def section(html: str, element_id: str) -> str:
    start = html.index(f'id="{element_id}"')
    end = html.find("</section>", start)
    return html[start:end]


def table_rows(html: str, table_id: str) -> list[str]:
    start = html.index(f'<table class="data sortable" id="{table_id}">')
    body = html[start:html.index("</table>", start)]
    return re.findall(r"<tr[^>]*>.*?</tr>", body.split("<tbody>", 1)[1], re.S)


def test_gpu_report_is_where_it_belongs_and_self_contained(gpu_report):
    run_dir, path, html = gpu_report
    assert path.name == "index.html" and path.parent.name == run_dir.name
    assert not EXTERNAL.search(html), EXTERNAL.search(html).group(0)
    assert "<link" not in html and "@import" not in html and "url(" not in html
    pngs = images(html)
    # GB/s vs table size, vs row size, latency vs tokens, topology, lookup paths, step overlap (256 tokens)
    assert len(pngs) == 6
    for key in ("bandwidth_vs_table_bytes", "latency_vs_tokens", "topology", "paths", "step_overlap_t256"):
        assert f'id="plot-{key}"' in html
    for png in pngs:
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000
    for element_id in ("findings", "run", "meta", "ceilings", "plots", "records-table", "not-measured-table"):
        assert f'id="{element_id}"' in html, element_id


def test_gpu_report_holds_every_record_and_the_metadata(gpu_report):
    run_dir, _, html = gpu_report
    records = load_records(run_dir)
    rows = table_rows(html, "records-table")
    assert len(rows) == len(records)
    for rec in records:
        assert rec["case_id"] in html
    statuses = [re.search(r'data-status="(\w+)"', r).group(1) for r in rows]
    assert sorted(statuses) == sorted(r["status"] for r in records)
    meta = section(html, "run")
    for text in ("NVIDIA H200", "580.95.05", "2.11.0+cu130", "0123456789abcdef", "h200-node-1",
                 "d2d_gbps", "4,186", "h2d_gbps", "55.2", "pinned_random_row_gbps"):
        assert text in meta, text
    # Only GB/s figures are ceilings (a table, GB/s in its header, rows/s beside where measured);
    # the other facts stored beside them are a line of notes, without a unit.
    ceilings = table_rows(html, "ceilings")
    assert len(ceilings) == 9  # the fake run's nine *_gbps entries
    assert re.search(r'<td class="">d2d_gbps</td><td class="num" data-v="4186.0">4,186</td>', "".join(ceilings))
    row = next(r for r in ceilings if ">pinned_random_row_gbps<" in r)
    assert re.findall(r'<td class="num"[^>]*>([^<]*)</td>', row) == ["50.5", "190"]  # 1.9e8 rows/s in M rows/s
    assert "ceilings_seconds: 3.1" in meta and "ceilings_timer: cuda_event" in meta
    assert "3.1 GB/s" not in html and "cpu_count: 16" in meta
    # Numbers in the table carry their raw value for sorting.
    ok = next(r for r in records if r["status"] == "ok" and r["kind"] == "lookup")
    row = next(r for r in rows if ok["case_id"] in r)
    assert f'data-v="{ok["median_ms"]!r}"' in row


def test_not_measured_section_lists_reasons_escaped(gpu_report):
    _, _, html = gpu_report
    nm = table_rows(html, "not-measured-table")
    assert len(nm) == 3
    text = "".join(nm)
    assert BROKEN_REASONS["skipped"] in text
    assert BROKEN_REASONS["invalid"] in text
    # The failure reason contains markup characters: escaped, never raw.
    assert "&lt;bad &amp; &#39;quoted&#39;&gt;" in text or "&lt;bad &amp; &#x27;quoted&#x27;&gt;" in text
    assert "<bad &" not in html
    for case in gpu_cases()["broken"]:
        assert case.case_id in text


def test_gpu_findings_follow_the_data(gpu_report):
    run_dir, _, html = gpu_report
    records = [r for r in load_records(run_dir) if r["status"] == "ok"]
    found = section(html, "findings")
    # Best % of ceiling of pinned_uva single-GPU lookups: the records' pct_of_ceiling, against
    # the random-row ceiling at their row size
    pinned = [r for r in records if r["impl"] == "pinned_uva" and r["kind"] == "lookup"
              and (r["tp"], r["etp"], r["dp"]) == (1, 1, 1)]
    best = max(pinned, key=lambda r: r["pct_of_ceiling"])
    assert best["ceiling"].startswith("pinned_random_row_gbps_") and best["pct_of_ceiling"] <= 105
    assert f"pinned_uva reaches at best {best['pct_of_ceiling']:.0f}% of the {best['ceiling']} ceiling" in found
    assert f"{best['row_bytes']} B rows" in found
    device = [r for r in records if r["impl"] == "device" and r["kind"] == "lookup"
              and (r["tp"], r["etp"], r["dp"]) == (1, 1, 1)]
    dbest = max(device, key=lambda r: r["pct_of_ceiling"])
    assert f"device reaches at best {dbest['pct_of_ceiling']:.0f}% of the {dbest['ceiling']}" in found
    assert dbest["ceiling"].startswith("device_random_row_gbps_")
    assert "ceiling is wrong" not in found  # every fake lookup stays within its ceiling
    # Prefetch: in the fake model it pays once there is compute to hide behind, costs at compute_us=0.
    assert "pinned_uva · triton_reference, 256 tokens, graph eager, decode steps: prefetch pays at compute_us = 50, 200" in found
    assert "costs time at compute_us = 0" in found
    assert "1 skipped, 1 failed, 1 invalid" in found
    assert "at tp1 etp2 dp2 a lookup takes" in found
    assert "slows the main-stream compute by +4%" in found
    assert "not GPU performance" not in found


def test_cpu_functional_report_says_so_and_claims_nothing(cpu_report):
    run_dir, _, html = cpu_report
    assert 'id="functional-banner"' in html
    found = section(html, "findings")
    assert "CPU functional run, host timer" in found and "not GPU performance" in found
    for claim in ("reaches", "prefetch pays", "GB/s rises", "GB/s falls", "× the"):
        assert claim not in found, claim
    assert "pinned_uva needs CUDA (UVA)" in html
    assert "No ceilings were measured" in html
    assert not EXTERNAL.search(html)
    pngs = images(html)
    # Only latency vs tokens has a sweep (two token counts per dtype); each plot says "functional".
    assert len(pngs) == 1
    assert len(table_rows(html, "records-table")) == len(load_records(run_dir))


def test_report_tolerates_old_and_empty_runs(tmp_path):
    # An "old" run: bare meta, records with only a few keys and None everywhere.
    old = tmp_path / "results" / "old-run"
    old.mkdir(parents=True)
    (old / "meta.json").write_text(json.dumps({"suite": "legacy"}))
    lines = [
        {"case_id": "lookup.device.a", "status": "ok", "impl": "device", "dtype": "fp8", "dim": 64,
         "vocab_size": 1024, "median_ms": 0.5, "samples_ms": None, "gbps": None},
        {"case_id": "lookup.device.b", "status": "ok", "samples_ms": [0.4, 0.41, 0.39]},
        {"case_id": "lookup.device.c", "status": "failed", "reason": None},
    ]
    (old / "records.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n{torn")
    html = build_report(old, tmp_path / "reports").read_text()
    assert len(table_rows(html, "records-table")) == 3
    assert "lookup.device.b" in html
    # the report recomputes nothing (no median from the samples); the upgrade says what the record lacks
    b = next(r for r in load_records(old) if r["case_id"] == "lookup.device.b")
    assert b.get("median_ms") is None and "median_ms" in b["missing_fields"] and b["upgraded_from"] == 1
    assert "does not say whether it ran on a GPU" in html
    # A run that stored nothing yet.
    empty = write_run(tmp_path / "results", "empty-run", {"run_id": "empty-run", "suite": "x", "mode": "gpu",
                                                          "status": "interrupted"}, [])
    html = build_report(empty, tmp_path / "reports").read_text()
    assert "The run holds no records" in html and "did not finish" in html and 'id="no-records"' in html


def test_trend_over_history(tmp_path):
    results = tmp_path / "results"
    small = lambda case: case.kind == "lookup" and case.num_tokens == 1024 and case.dim == 160  # noqa: E731
    slow_case = Case(impl="pinned_uva", dtype="fp8", dim=160, vocab_size=1 << 24, num_heads=16, num_tokens=1024)
    old1 = write_gpu_run(results, "20261128-020000-nightly-0001", seed=1, only=small,
                         started_at="2026-11-28T02:00:00+00:00", include_broken=False)
    old2 = write_gpu_run(results, "20261129-020000-nightly-0002", seed=2, only=small,
                         started_at="2026-11-29T02:00:00+00:00", include_broken=False)
    new = write_gpu_run(results, "20261130-020000-nightly-0003", seed=3, only=small,
                        started_at="2026-11-30T02:00:00+00:00", include_broken=False,
                        factor=lambda c: 1.25 if c.case_id == slow_case.case_id else 1.0)
    (results / "not-a-run").mkdir()
    html = build_report(new, tmp_path / "reports", history_dirs=[old2, old1, results / "not-a-run"]).read_text()
    trend = section(html, "trend")
    assert "Trend over 3 runs" in trend
    assert "not a ple_bench run" in trend  # the unreadable entry is said, not hidden
    assert 'id="plot-trend"' in trend
    # Runs appear oldest first as table columns.
    assert trend.index("nightly-0001") < trend.index("nightly-0002") < trend.index("nightly-0003")
    rows = table_rows(html, "trend-table")
    assert rows
    slow_row = next(r for r in rows if slow_case.case_id in r)
    change = float(re.findall(r'data-v="([^"]+)"', slow_row)[-1])
    medians = [next(r for r in load_records(d) if r["case_id"] == slow_case.case_id)["median_ms"]
               for d in (old2, new)]
    assert change == pytest.approx((medians[1] / medians[0] - 1) * 100)
    assert 15 < change < 35


def test_report_cli(tmp_path, capsys):
    run_dir = write_cpu_run(tmp_path / "results")
    assert report_main([str(run_dir), "--reports-dir", str(tmp_path / "reports")]) == 0
    out = capsys.readouterr().out.strip()
    assert Path(out) == tmp_path / "reports" / run_dir.name / "index.html" and Path(out).exists()
    assert report_main([str(tmp_path / "missing"), "--reports-dir", str(tmp_path / "reports")]) == 2
    (tmp_path / "no-meta").mkdir()
    assert report_main([str(tmp_path / "no-meta")]) == 2
    assert "no meta.json" in capsys.readouterr().err


def test_history_last_picks_same_suite_runs(tmp_path):
    from ple_bench.report.html import history_runs

    results = tmp_path / "results"
    few = lambda case: case.kind == "lookup" and case.vocab_size == 1 << 14 and case.num_tokens == 64  # noqa: E731
    dirs = [write_gpu_run(results, f"2026112{i}-020000-nightly-000{i}", seed=i, only=few, include_broken=False,
                          started_at=f"2026-11-2{i}T02:00:00+00:00") for i in range(1, 5)]
    write_gpu_run(results, "20261125-020000-other-0009", suite="other", only=few, include_broken=False,
                  started_at="2026-11-25T02:00:00+00:00")
    (results / "baseline").symlink_to(dirs[0])
    picked = history_runs(dirs[-1], 2)
    assert [p.name for p in picked] == [dirs[1].name, dirs[2].name]
    assert len(history_runs(dirs[-1], 10)) == 3  # the symlink is not a second copy; other suite left out


def _step(impl: str, prefetch: bool, compute_us: float, step_ms: float) -> dict:
    case = Case(kind="step", impl=impl, prefetch=prefetch, compute_us=compute_us)
    return {"case_id": case.case_id, "status": "ok", **case.axes(), "step_ms": step_ms, "median_ms": step_ms}


def test_prefetch_finding_only_from_matched_pairs():
    recs = [
        _step("pinned_uva", False, 0.0, 0.100), _step("pinned_uva", True, 0.0, 0.101),
        _step("pinned_uva", False, 500.0, 0.600), _step("pinned_uva", True, 500.0, 0.480),
        _step("pinned_uva", False, 900.0, 1.000),  # no prefetch partner: no claim about 900
    ]
    run = Run(path=Path("x"), meta={"mode": "gpu"}, records=recs)
    text = " ".join(f.text for f in findings(run) if f.topic == "prefetch")
    assert "prefetch pays at compute_us = 500 (step time -20%)" in text
    assert "no measurable difference (within 5%) at compute_us = 0" in text
    assert "900" not in text
    # Without pairs there is no prefetch finding at all.
    run = Run(path=Path("x"), meta={"mode": "gpu"}, records=[recs[0], recs[3]])
    assert not [f for f in findings(run) if f.topic == "prefetch"]


def test_table_size_trend_words():
    def rec(vocab, gbps, dtype="fp8"):
        case = Case(impl="device", dtype=dtype, dim=128, vocab_size=vocab)
        return {"case_id": case.case_id, "status": "ok", **case.axes(), "gbps": gbps, "median_ms": 1.0,
                "table_bytes": vocab * 128 * (1 if dtype == "fp8" else 2)}
    rising = [rec(1 << 14, 100.0), rec(1 << 18, 150.0), rec(1 << 22, 300.0)]
    flat = [rec(1 << 14, 100.0, "bf16"), rec(1 << 18, 104.0, "bf16"), rec(1 << 22, 95.0, "bf16")]
    run = Run(path=Path("x"), meta={"mode": "gpu"}, records=rising + flat)
    text = " ".join(f.text for f in findings(run) if f.topic == "table size")
    assert "device · torch_masked (fp8) with table size" in text
    assert "GB/s rises from 100 at 2 MiB to 300 at 512 MiB, +200%" in text
    assert "device · torch_masked (bf16) with table size — at 256 tokens, uniform ids: GB/s stays flat" in text
    # Two sizes only: no trend claim.
    run = Run(path=Path("x"), meta={"mode": "gpu"}, records=rising[:2])
    assert not [f for f in findings(run) if f.topic == "table size"]


def test_slice_series_never_mixes_unnamed_axes():
    recs = []
    for impl in ("device", "pinned_uva"):
        for tokens in (16, 64, 256):
            for vocab in (1 << 10, 1 << 12):
                for heads in (1, 2, 4, 8, 16):
                    case = Case(impl=impl, num_tokens=tokens, vocab_size=vocab, num_heads=heads)
                    recs.append({"case_id": case.case_id, **case.axes()})
    sl = slice_series(recs, "num_tokens", ["impl"], max_series=4)
    assert len(sl.series) <= 4 and sl.fixed
    for key, rs in sl.series.items():
        for axis in ("impl", "vocab_size", "num_heads"):
            assert len({r[axis] for r in rs}) == 1, axis
        assert sorted(r["num_tokens"] for r in rs) == [16, 64, 256]


# ------------------------------------------------------------ lookup paths and overlap sections

@pytest.fixture(scope="module")
def paths_report(tmp_path_factory):
    from ._fake_runs import write_paths_run

    base = tmp_path_factory.mktemp("paths")
    run_dir = write_paths_run(base / "results")
    path = build_report(run_dir, base / "reports")
    return run_dir, path.read_text(encoding="utf-8")


def _texts(run_dir, group=None):
    from ple_bench.report.data import load_run

    return [f.text for f in findings(load_run(run_dir)) if group is None or f.group == group]


def test_path_label_resolves_default_kernels():
    from ple_bench.report.data import path_label

    assert path_label({"impl": "pinned_uva", "kernel": ""}) == "pinned_uva · triton_reference"
    assert path_label({"impl": "pinned_uva", "kernel": "triton_tuned"}) == "pinned_uva · triton_tuned"
    assert path_label({"impl": "device", "kernel": None}) == "device · torch_masked"
    assert path_label({"impl": "pinned_cpu_gather", "kernel": ""}) == "pinned_cpu_gather"
    assert path_label({"impl": "my.plugin:Backend", "kernel": ""}) == "my.plugin:Backend"


def test_planted_faster_path_is_named(paths_report):
    run_dir, _ = paths_report
    texts = _texts(run_dir, "paths")
    vs_ref = [t for t in texts if t.startswith("pinned_uva · triton_tuned vs pinned_uva · triton_reference")]
    assert len(vs_ref) == 1, texts
    # planted: 2x faster at 4096 tokens, equal at 256 tokens
    assert "at 4096 tokens × 16 heads 2.0" in vs_ref[0] and "faster (2 workloads)" in vs_ref[0]
    assert "at 256 tokens × 16 heads the same speed within 5% (2 workloads)" in vs_ref[0]
    # kernel "" and kernel "triton_reference" are one path: never compared with itself
    assert not [t for t in texts if t.startswith("pinned_uva · triton_reference vs")]
    # ranking at a 4096-token workload: tuned ahead of the reference, at half its time
    rank = [t for t in texts if "16 GiB table, 4096 tokens × 16 heads, uniform ids: fastest" in t]
    assert rank and rank[0].index("pinned_uva · triton_tuned") < rank[0].index("pinned_uva · triton_reference")
    assert re.search(r"pinned_uva · triton_tuned (\d+\.\d+)×, pinned_uva · triton_reference (\d+\.\d+)×", rank[0])
    m = re.search(r"pinned_uva · triton_tuned (\d+\.\d+)×, pinned_uva · triton_reference (\d+\.\d+)×", rank[0])
    assert abs(float(m.group(2)) / float(m.group(1)) - 2.0) < 0.05


def test_table_size_ids_and_hot_cache_findings(paths_report):
    run_dir, _ = paths_report
    text = " ".join(_texts(run_dir, "paths"))
    # planted: 4x lower GB/s at 16 GiB than at 64 MiB for 4096 tokens, flat at 256 tokens
    m = re.search(r"at 4096 tokens × 16 heads, uniform ids: GB/s falls from ([\d.]+) at 64 MiB \(\d+%\) "
                  r"to ([\d.]+) at 16 GiB \(\d+%\), -7\d%", text)
    assert m and 3.8 < float(m.group(1)) / float(m.group(2)) < 4.2, text
    assert "at 256 tokens × 16 heads, uniform ids: GB/s stays flat" in text
    assert "in brackets: % of the pinned_random_row_gbps_160B ceiling" in text
    assert "zipf:1.1 ids vs uniform — at 256 tokens × 16 heads the same speed within 5%" in text
    assert "at 4096 tokens × 16 heads 1.9" in text or "at 4096 tokens × 16 heads 2.0" in text
    assert "hit rate 37% over 1 lookup case" in text


def test_overlap_findings_name_where_prefetch_hides(paths_report):
    run_dir, _ = paths_report
    texts = _texts(run_dir, "overlap")
    t64 = next(t for t in texts if t.startswith("At 64 tokens"))
    assert "pinned_uva · triton_reference hides at best 100%" in t64 and "compute_us = 400" in t64
    t512 = next(t for t in texts if t.startswith("At 512 tokens"))
    assert "pinned_uva · triton_reference hides nothing" in t512
    assert "slows the main-stream compute by +150% (without prefetch +1%)" in t512


def test_paths_and_overlap_sections_in_the_page(paths_report):
    run_dir, html = paths_report
    paths = section(html, "paths")
    assert 'id="plot-paths"' in paths and 'id="paths-table"' in paths
    for p in ("pinned_uva · triton_reference", "pinned_uva · triton_tuned", "device · torch_masked",
              "pinned_hot_cache · triton_tuned"):
        assert p in paths
    # % of ceiling in the table is the record's pct_of_ceiling, with the ceiling it names
    rec = next(r for r in load_records(run_dir) if r.get("impl") == "pinned_hot_cache")
    assert f"{rec['pct_of_ceiling']:.0f}%" in paths and rec["ceiling"] == "pinned_random_row_gbps_160B"
    assert "37.0%" in paths  # the recorded hit rate
    overlap = section(html, "overlap")
    # the largest token count's overlap plot carries the verdict: it moved to the top of the page
    assert 'id="plot-step_overlap_t64"' in overlap and 'id="plot-step_overlap_t512"' not in overlap
    assert 'id="plot-step_overlap_t512"' in section(html, "key-findings")
    assert 'id="steps-table"' in overlap and "+150%" in overlap
    # findings are grouped by topic, each group a collapsible block that says how many it holds
    found = section(html, "findings")
    groups = dict(re.findall(r'<details class="finding-group" open>\n<summary>([^<]*) \((\d+)\)</summary>', found))
    assert set(groups) == {"Run and backends", "Lookup paths side by side", "Decode-step overlap"}
    overlap_findings = [t for t in _texts(run_dir, "overlap")]
    assert int(groups["Decode-step overlap"]) == len(overlap_findings)


def test_the_page_opens_with_the_verdict_three_plots_and_ten_findings(paths_report):
    """The verdict, then at most three plots and at most ten ranked findings; the full list and the
    tables below, collapsible."""
    from ple_bench.report.data import load_run
    from ple_bench.report.findings import key_findings

    run_dir, html = paths_report
    top = html[html.index('id="verdict"'):html.index('id="findings-details"')]
    assert 1 <= top.count('<img class="plot-img') <= 3  # (the all-series versions are closed details)
    listed = re.findall(r'<ol class="findings" id="key-findings-list">(.*?)</ol>', html, re.S)[0].count("<li")
    found = [f for f in findings(load_run(run_dir)) if f.topic != "answer"]
    assert listed == min(10, len(found)) and len(found) > 10  # condensed: some findings only in the full list
    assert '<details id="findings-details">' in html and html.count('<details open class="section">') >= 2
    keys = key_findings(found)
    assert [f.level for f in keys] == sorted((f.level for f in keys), key=lambda lv: lv != "warn")


def test_the_verdict_plots_carry_step_time_vs_tokens_with_the_resident_baseline():
    """On the archived production-table run (steps at 64/256/512 tokens): the top plots are the
    step time vs tokens (the resident steps among its lines) and the exposed time vs compute."""
    from pathlib import Path

    from ple_bench.report.data import Run, load_run
    from ple_bench.report.html import key_plots
    from ple_bench.report.gallery import make_plots
    from ple_bench.report.plots import plot_step_vs_tokens

    run = load_run(fixture_run("20261201-130202-paths-b4db"))
    plot = plot_step_vs_tokens(run)
    assert plot is not None and plot.data_uri.startswith("data:image/png;base64,")
    top = [p.key for p in key_plots(make_plots(run))]
    assert "step_vs_tokens" in top and len(top) <= 3


# ------------------------------------------------------------ the page as a person reads it

ARCHIVED = FIXTURE_RUNS


@pytest.fixture(scope="module")
def archived_runs():
    from ple_bench.report.data import load_run

    return {name: load_run(ARCHIVED / d) for name, d in (("default", "20261201-123806-default-fa39"),
                                                          ("paths", "20261201-130202-paths-b4db"))}


def test_plot_legends_hold_at_most_eight_entries_and_the_rest_is_one_click_away(archived_runs):
    """The archived paths run has 14 step configurations (the legend had 14 entries): the page's plot
    shows the best of each path and the resident baselines, the all-series plot every one."""
    from ple_bench.report.gallery import make_plots
    from ple_bench.report.plots import MAX_LEGEND

    for name, run in archived_runs.items():
        plots = make_plots(run)
        assert plots, name
        for p in plots:
            assert p.legend_entries <= MAX_LEGEND, (name, p.key, p.legend_entries)
            if p.series_total > MAX_LEGEND:
                assert p.full is not None and p.full.legend_entries == p.series_total, (name, p.key)
            else:
                assert p.full is None and p.legend_entries == p.series_total, (name, p.key)
    by_key = {p.key: p for p in make_plots(archived_runs["paths"])}
    every = by_key["step_vs_tokens_all"]
    assert every.series_total == 14 and every.full.legend_entries == 14 and every.legend_entries == 4
    # the plot under the banner draws the verdict's rows: the HBM reference and the best step of each
    # pinned path on the verdict's timer (the CPU gather, the UVA kernel), all shown
    assert by_key["step_vs_tokens"].series_total == by_key["step_vs_tokens"].legend_entries == 3


def test_the_plot_under_the_banner_is_the_verdicts_table_and_ids():
    """The banner speaks of one table size and id distribution; the plot right under it must show
    that table's steps, not the best of every table (which put 32 GiB lines under a 47.7 GiB answer
    in the paths run b469). The plot of every table is kept beside the other step plots."""
    from ple_bench.report.data import Run, load_run
    from ple_bench.report.html import key_plots
    from ple_bench.report.gallery import make_plots
    from ple_bench.report.plots import plot_step_vs_tokens
    from ple_bench.report.sections import decode_steps
    from ple_bench.report.verdict import candidates, scope

    run = load_run(ARCHIVED / "20261201-221703-paths-b469")
    where = scope(candidates(run.records))
    steps, _shape = decode_steps(run)
    assert len({int(r["table_bytes"]) for r in steps}) > 1  # the run has other tables too
    scoped, every = plot_step_vs_tokens(run), plot_step_vs_tokens(run, scoped=False)
    assert scoped.series_total < every.series_total
    only = Run(run.path, run.meta, [r for r in run.records if int(r.get("table_bytes") or 0)
                                   == where.table_bytes and r.get("ids") == where.ids])
    assert plot_step_vs_tokens(only).series_total == scoped.series_total
    assert key_plots(make_plots(run))[0].key == "step_vs_tokens"


def test_log_axes_are_ticked_at_the_measured_values():
    from matplotlib.figure import Figure

    from ple_bench.report.plots import finish_axes

    ax = Figure().subplots()
    ax.plot([64, 256, 512], [0.21, 0.26, 0.5])
    finish_axes(ax, "tokens", "ms", logx=True, logy=True, xbase=2)
    assert list(ax.get_xticks()) == [64, 256, 512]  # not 2^6, 2^7, 2^8, 2^9
    labels = [ax.xaxis.get_major_formatter()(v, i) for i, v in enumerate(ax.get_xticks())]
    assert labels == ["64", "256", "512"]
    ylabels = [ax.yaxis.get_major_formatter()(v, i) for i, v in enumerate(ax.get_yticks())]
    assert "0.2" in ylabels and "0.5" in ylabels and not any("10^" in t or "times" in t for t in ylabels)
    # crowded sizes (32, 47.7, 100 GiB beside 64 MiB): the ends stay, close neighbours go
    ax = Figure().subplots()
    sizes = [64 << 20, 1 << 30, 8 << 30, 32 << 30, 51_200_245_760, 100 << 30]
    ax.plot(sizes, [1, 2, 3, 4, 5, 6])
    finish_axes(ax, "table", "GB/s", logx=True, xbase=2, bytes_x=True)
    ticks = list(ax.get_xticks())
    assert ticks[0] == sizes[0] and ticks[-1] == sizes[-1] and 51_200_245_760 not in ticks and len(ticks) >= 4


def test_the_step_table_says_the_table_size_where_sizes_differ(archived_runs):
    """The default run's steps ran on an 8 GiB and the 47.7 GiB table: the step table and the step
    plots tell them apart."""
    from ple_bench.report.html import step_table
    from ple_bench.report.plots import plot_step_overlap

    cols, rows, _shape = step_table(archived_runs["default"])
    assert cols[0].key == "table_bytes"
    sizes = {row["cells"][0]["text"] for row in rows}
    assert sizes == {"8 GiB", "47.7 GiB"}
    (overlap,) = plot_step_overlap(archived_runs["default"])
    assert overlap.series_total == 7  # the 47.7 GiB prefetch step is its own line, not merged into the 8 GiB one
    cols, rows, _ = step_table(archived_runs["paths"])  # one table size: no column
    assert "table_bytes" not in [c.key for c in cols]


SIG_DIGITS = re.compile(r"\d[\d,]*\.?\d*(?:e[-+]?\d+)?")


def _significant(number: str) -> int:
    mantissa = number.replace(",", "").split("e")[0].replace(".", "").lstrip("0")
    return len(mantissa.rstrip("0")) if "." not in number.split("e")[0] else len(mantissa)


def test_ceilings_are_tables_of_short_numbers(tmp_path, archived_runs):
    """The default run's meta.json keeps 45 random-row and 6 host-gather ceilings as objects of
    floats (1.5261366649999957): the page shows them as tables, no number longer than 4
    significant digits, the long ones collapsed."""
    from ple_bench.report.html import per_case_ceilings

    tables = {t.name: t for t in per_case_ceilings(archived_runs["default"])}
    assert {n: len(t.rows) for n, t in tables.items()} == {"host_gather": 6, "random_row": 45}
    html = build_report(fixture_run("20261201-123806-default-fa39"), tmp_path / "reports").read_text()
    run_section = section(html, "run")
    assert '<details class="section case-ceilings" id="ceilings-random_row">' in run_section
    ceilings = run_section[run_section.index('id="ceilings"'):]
    texts = re.findall(r'<td class="num"[^>]*>([^<]*)</td>', ceilings)  # every number of the ceiling tables
    assert len(texts) > 45 * 10
    fractions = [n for t in texts for n in SIG_DIGITS.findall(t) if "." in n or "e" in n]  # (counts stay whole)
    assert len(fractions) > 45 * 2
    assert max(_significant(n) for n in fractions) <= 4, [n for n in fractions if _significant(n) > 4][:5]
    stored = archived_runs["default"].meta["ceilings"]
    assert stored["host_gather"]["1073745920:4096:160"]["warm_ms"] == 0.0486355 and ">0.0486<" in run_section
    assert stored["ceilings_seconds"] == 1.5261366649999957 and "ceilings_seconds: 1.53" in run_section
    assert "1.5261366649999957" not in html and "0.0486355" not in re.sub(r'data-v="[^"]*"', "", html)
