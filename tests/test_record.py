"""The record schema (ple_bench/record.py): every derived figure on hand-computed
records, the ceiling each kind of lookup is held against, the upgrade of older
records, the archived runs (tests/fixtures/runs), and docs/schema.md's generated table."""

from __future__ import annotations

import re
import json
import time
from pathlib import Path

import pytest
import torch

from ple_bench import record, results
from ple_bench.spec.case import Case
from ple_bench.record import SCHEMA_VERSION, Peers, derive, twin_key, twins_of, upgrade
from tests._fixtures import fixture_runs

REPO = Path(__file__).resolve().parents[1]
RUNS = fixture_runs()

CEILINGS = {"h2d_gbps": 55.0, "d2d_gbps": 4000.0, "host_memcpy_gbps": 10.0,
            "pinned_random_row_gbps_160B": 20.0, "pinned_random_row_gbps_512B": 50.0,
            "device_random_row_gbps_160B": 250.0, "device_random_row_gbps_512B": 800.0}


def _lookup(**kw) -> dict:
    case = Case(impl=kw.pop("impl", "device"), dim=kw.pop("dim", 160), dtype="fp8", num_heads=16,
                num_tokens=1024, vocab_size=1 << 20)
    rec = {"case_id": case.case_id, "status": "ok", "mode": "gpu", **case.axes(),
           "rows": 16384, "row_bytes": case.row_bytes, "bytes_moved": 16384 * case.row_bytes, "median_ms": 0.5}
    rec.update(kw)
    return rec


def _step(prefetch: bool, exposed_ms: float, **kw) -> dict:
    axes = dict(kind="step", impl="pinned_uva", dim=160, dtype="fp8", num_heads=16, num_tokens=256,
                vocab_size=1 << 20, compute_us=kw.pop("compute_us", 100.0), prefetch=prefetch,
                stream_priority=kw.pop("stream_priority", 0))
    case = Case(**axes)
    rec = {"case_id": case.case_id, "status": "ok", "mode": "gpu", **case.axes(), "rows": 4096,
           "row_bytes": 160, "bytes_moved": 4096 * 160, "median_ms": 1.0, "step_ms": 1.0,
           "exposed_ms": exposed_ms, "compute_ms": 1.0 - exposed_ms, "lookup_ms": 0.4,
           "compute_in_step_ms": 0.11, "compute_region_alone_ms": 0.10}
    rec.update(kw)
    return rec


# ------------------------------------------------------------ lookups: rates and ceilings

def test_gbps_and_rows_per_s_count_the_rows_read():
    rec = derive(_lookup(median_ms=0.5), CEILINGS)
    # 16384 rows x 160 B in 0.5 ms = 5.24288 GB/s; 16384 / 0.5 ms = 32.768 M rows/s
    assert rec["gbps"] == pytest.approx(5.24288)
    assert rec["rows_per_s"] == pytest.approx(32.768e6)
    assert rec["schema_version"] == SCHEMA_VERSION


def test_device_table_is_held_against_the_device_random_row_ceiling_at_its_row_size():
    rec = derive(_lookup(impl="device", median_ms=0.5), CEILINGS)
    assert rec["ceiling"] == "device_random_row_gbps_160B" and rec["ceiling_gbps"] == 250.0
    assert rec["ceiling_row_bytes"] == 160
    assert rec["pct_of_ceiling"] == pytest.approx(100 * 5.24288 / 250.0)


def test_a_row_size_not_measured_takes_the_nearest_and_says_so():
    rec = derive(_lookup(impl="device", dim=384, median_ms=1.0), CEILINGS)  # 384 B rows: 512 is nearer
    assert rec["ceiling"] == "device_random_row_gbps_512B" and rec["ceiling_row_bytes"] == 512
    assert rec["pct_of_ceiling"] == pytest.approx(100 * (16384 * 384 / 1e6) / 800.0)


def test_pinned_kernel_path_is_held_against_the_pinned_random_row_ceiling():
    rec = derive(_lookup(impl="pinned_uva", median_ms=0.5), CEILINGS)
    assert rec["ceiling"] == "pinned_random_row_gbps_160B"
    assert rec["pct_of_ceiling"] == pytest.approx(100 * 5.24288 / 20.0)


def test_the_declared_capability_decides_where_the_table_is():
    # a plug-in whose table is in device memory, with a name that says nothing
    dev = derive(_lookup(impl="mypkg.mod:Emb", table_in_host_memory=False), CEILINGS)
    assert dev["ceiling"] == "device_random_row_gbps_160B"
    host = derive(_lookup(impl="mypkg.mod:Emb", table_in_host_memory=True), CEILINGS)
    assert host["ceiling"] == "pinned_random_row_gbps_160B"
    # without the capability: impl "device" is device-resident, any other is not
    assert derive(_lookup(impl="mypkg.mod:Emb"), CEILINGS)["ceiling"] == "pinned_random_row_gbps_160B"


def test_host_path_is_held_against_its_host_gather_ceiling():
    rec = derive(_lookup(impl="pinned_cpu_gather", median_ms=0.8, host_gather_ceiling_ms=0.6,
                         pct_of_host_gather_ceiling=75.0), CEILINGS)
    assert rec["ceiling"] == "host_gather"
    assert rec["pct_of_ceiling"] == pytest.approx(75.0) == pytest.approx(rec["pct_of_host_gather_ceiling"])
    # the same bytes in the figure and in its ceiling
    assert rec["ceiling_gbps"] == pytest.approx(16384 * 160 / 0.6e6)
    assert rec["pct_of_ceiling"] == pytest.approx(100 * rec["gbps"] / rec["ceiling_gbps"])


def test_functional_mode_uses_host_memcpy():
    rec = derive(_lookup(mode="functional", median_ms=0.5), CEILINGS)
    assert rec["ceiling"] == "host_memcpy_gbps" and rec["pct_of_ceiling"] == pytest.approx(52.4288)


def test_no_random_row_ceiling_measured_gives_no_share():
    rec = derive(_lookup(), {"h2d_gbps": 55.0, "d2d_gbps": 4000.0})
    assert rec["gbps"] is not None and rec["ceiling"] is None and rec["pct_of_ceiling"] is None


def test_a_lookup_above_its_ceiling_gets_a_warning_not_praise():
    from ple_bench.report.data import Run
    from ple_bench.report.findings import ceiling_findings

    fast = derive(_lookup(impl="pinned_hot_cache", median_ms=0.1), CEILINGS)  # 26 GB/s vs 20: 131%
    slow = derive(_lookup(impl="pinned_hot_cache", median_ms=0.5), CEILINGS)  # 26%
    slow["case_id"] += "-slow"
    found = ceiling_findings(Run(Path("r"), {"mode": "gpu"}, [fast, slow]))
    warn = [f for f in found if f.level == "warn"]
    assert len(warn) == 1 and "ceiling is wrong" in warn[0].text and "131%" in warn[0].text
    assert any("reaches at best 26%" in f.text for f in found)
    assert not any("reaches at best 131%" in f.text for f in found)


# ------------------------------------------------------------ steps

def test_step_records_carry_no_gbps_and_no_ceiling():
    rec = derive(_step(False, 0.4, gbps=3.0, ceiling="h2d_gbps", pct_of_ceiling=5.0), CEILINGS)
    for key in ("gbps", "rows_per_s", "ceiling", "ceiling_gbps", "pct_of_ceiling"):
        assert rec[key] is None, key


def test_overlap_efficiency_against_the_prefetch_off_twin():
    off = _step(False, 0.40)
    on = _step(True, 0.10)
    rec = derive(on, CEILINGS, twins_of([off]))
    assert rec["overlap_efficiency"] == pytest.approx(1 - 0.10 / 0.40)  # 0.75
    assert rec["overlap_twin"] == off["case_id"]
    # the twin itself has no overlap figure
    assert derive(dict(off), CEILINGS, twins_of([off]))["overlap_efficiency"] is None


def test_overlap_efficiency_is_negative_when_the_prefetch_slows_the_step():
    off = _step(False, 0.40)
    rec = derive(_step(True, 0.50), CEILINGS, twins_of([off]))
    assert rec["overlap_efficiency"] == pytest.approx(-0.25)


def test_overlap_efficiency_without_a_twin_is_none():
    rec = derive(_step(True, 0.10), CEILINGS, {})
    assert rec["overlap_efficiency"] is None and rec["overlap_twin"] is None
    other = _step(False, 0.40, compute_us=200.0)  # another compute: not the twin
    assert derive(_step(True, 0.10), CEILINGS, twins_of([other]))["overlap_efficiency"] is None


def test_prefetch_only_settings_share_the_twin():
    off = _step(False, 0.40)
    rec = derive(_step(True, 0.20, stream_priority=-1), CEILINGS, twins_of([off]))
    assert rec["overlap_twin"] == off["case_id"] and rec["overlap_efficiency"] == pytest.approx(0.5)
    assert twin_key(off) == twin_key(_step(True, 0.2, stream_priority=-1))


def test_compute_slowdown():
    rec = derive(_step(False, 0.4), CEILINGS)
    assert rec["compute_slowdown"] == pytest.approx(0.11 / 0.10 - 1)
    none = derive(_step(False, 0.4, compute_us=0.0, compute_slowdown=0.3), CEILINGS)
    assert none["compute_slowdown"] is None  # no compute, nothing to slow down
    host = derive(_step(False, 0.4, compute_slowdown_note="host path, eager compute"), CEILINGS)
    assert host["compute_slowdown"] is None  # the regions are there, but launches could be what is late
    graph = derive(_step(False, 0.4, compute_slowdown_note=None), CEILINGS)
    assert graph["compute_slowdown"] == pytest.approx(0.1)


def test_host_path_eager_steps_carry_the_compute_slowdown_note():
    """A host path's eager step says why it has no compute_slowdown; its breakable step has one."""
    from ple_bench.spec.case import Case
    from ple_bench.run.step import run_step_case
    from ple_bench.backends import get_backend
    from ple_bench.measure import TimingPolicy

    pol = TimingPolicy(warmup_ms=0.0, min_samples=2, max_samples=3, min_time_s=0.0, max_time_s=0.2)
    got = {}
    for graph in ("eager", "breakable"):
        case = Case(kind="step", impl="pinned_cpu_gather", vocab_size=4096, dim=16, dtype="fp8", num_heads=2,
                    num_tokens=4, compute_us=20.0, prefetch=True, graph=graph, ids_on="host")
        b = get_backend("pinned_cpu_gather")(4096, 16, dtype="fp8", num_heads=2, max_tokens=4, device="cpu")
        b.fill_synthetic(5, scale=0.5)
        try:
            ids = torch.randint(0, 4096, (4, 2))
            rec = run_step_case(case, b, ids, None, pol, "cpu", table_seed=5)
        except NotImplementedError as exc:  # e.g. breakable graphs need CUDA
            got[graph] = ("skipped", str(exc))
            continue
        finally:
            b.close()
        rec.update(case_id=f"step-{graph}", kind="step", status="ok", impl=case.impl, compute_us=20.0,
                   prefetch=True, graph=graph)
        got[graph] = derive(rec, CEILINGS)
    assert "host thread" in got["eager"]["compute_slowdown_note"] and got["eager"]["compute_slowdown"] is None
    if isinstance(got["breakable"], dict):
        assert got["breakable"]["compute_slowdown_note"] is None


def test_the_runner_puts_prefetch_off_first():
    from ple_bench.run.loop import order_cases

    base = dict(kind="step", impl="pinned_uva", vocab_size=1 << 20, dim=160, dtype="fp8", compute_us=50.0)
    cases = [Case(prefetch=True, **base), Case(prefetch=False, **base),
             Case(prefetch=True, stream_priority=-1, **base)]
    ordered = order_cases(cases)
    assert ordered[0].prefetch is False


def test_build_keeps_twins_for_later_steps():
    twins = Peers()
    context = record.RunContext({"mode": "gpu", "ceilings": CEILINGS}, twins)
    off, on = _step(False, 0.4), _step(True, 0.1)
    built = []
    for rec in (off, on):
        case = Case(**{k: rec[k] for k in Case().axes() if k in rec})
        result = record.CaseResult(measurement={k: v for k, v in rec.items() if k not in case.axes()},
                                   lookup_mechanism="kernel", table_in_host_memory=True)
        built.append(record.build(case, result, context))
        twins.add(built[-1])
    assert built[0]["table_in_host_memory"] is True  # the worker's result declares it
    assert built[1]["overlap_efficiency"] == pytest.approx(0.75) and built[1]["overlap_twin"] == built[0]["case_id"]


# ------------------------------------------------------------ the resident baseline (offload_overhead)

def _resident(step_ms: float, **kw) -> dict:
    """A resident step of _step's workload: the device table, ids on the device."""
    timer = kw.pop("timer", "cuda_event")
    rec = _step(kw.pop("prefetch", False), 0.05, impl="device", step_ms=step_ms, median_ms=step_ms, timer=timer,
                **kw)
    return {**rec, "case_id": Case.from_axes({k: rec[k] for k in Case().axes() if k in rec}).case_id}


def _pinned(step_ms: float, **kw) -> dict:
    rec = _step(kw.pop("prefetch", False), 0.1, step_ms=step_ms, median_ms=step_ms,
                timer=kw.pop("timer", "cuda_event"), **kw)
    return {**rec, "case_id": Case.from_axes({k: rec[k] for k in Case().axes() if k in rec}).case_id}


def _offload(pinned: dict, *others: dict) -> dict:
    peers = Peers.of(others)
    return derive(dict(pinned), CEILINGS, peers)


def test_baseline_is_the_resident_step_of_the_same_id_distribution():
    # two resident steps sharing every setting but the id distribution: each pinned step gets its own
    uniform, ngram = _resident(0.2547), _resident(0.2000, ids="ngram")
    rec = _offload(_pinned(0.2654), uniform, ngram)
    assert rec["offload_baseline"] == uniform["case_id"]
    assert rec["offload_overhead"] == pytest.approx(0.2654 / 0.2547 - 1)
    rec = _offload(_pinned(0.2654, ids="ngram"), uniform, ngram)
    assert rec["offload_baseline"] == ngram["case_id"]


def test_baseline_is_the_best_prefetch_setting_and_the_like_for_like_figure_keeps_its_own():
    # a resident lookup on a side stream is slower: a server would not prefetch it
    off, on = _resident(0.20, prefetch=False), _resident(0.30, prefetch=True)
    rec = _offload(_pinned(0.33, prefetch=True), on, off)
    assert rec["offload_baseline"] == off["case_id"] and rec["offload_overhead"] == pytest.approx(0.33 / 0.20 - 1)
    assert rec["offload_baseline_same_graph"] == on["case_id"]
    assert rec["offload_overhead_same_graph"] == pytest.approx(0.1)


def test_host_ids_pinned_step_is_held_against_the_device_ids_resident_step_on_the_host_timer():
    # the resident step with ids copied inside the step is slower: never the baseline
    copied = _resident(0.40, ids_on="host", timer="host_sync")
    device_ids = _resident(0.20, step_host_sync_ms=0.25)  # events 0.20, host-sync 0.25
    rec = _offload(_pinned(0.30, ids_on="host", impl="pinned_cpu_gather", timer="host_sync"), copied, device_ids)
    assert rec["offload_baseline"] == device_ids["case_id"] and rec["offload_baseline_timer"] == "host_sync"
    assert rec["offload_baseline_ms"] == 0.25 and rec["offload_overhead"] == pytest.approx(0.30 / 0.25 - 1)
    # an event-timed pinned step reads the event figure of the same resident step
    rec = _offload(_pinned(0.22), copied, device_ids)
    assert rec["offload_baseline_ms"] == 0.20 and rec["offload_baseline_timer"] == "cuda_event"


def test_baseline_is_the_best_graph_mode_and_the_same_graph_figure_is_apart():
    eager = _resident(0.30, step_host_sync_ms=0.33)
    breakable = _resident(0.28, graph="breakable", step_host_sync_ms=0.31, full_step_ms=0.24,
                          full_step_host_sync_ms=0.27)
    rec = _offload(_pinned(0.33, impl="pinned_cpu_gather", timer="host_sync", graph="breakable"), eager, breakable)
    assert (rec["offload_baseline"], rec["offload_baseline_graph"]) == (breakable["case_id"], "full")
    assert rec["offload_overhead"] == pytest.approx(0.33 / 0.27 - 1)
    assert rec["offload_baseline_same_graph_ms"] == 0.31
    assert rec["offload_overhead_same_graph"] == pytest.approx(0.33 / 0.31 - 1)


def test_resident_steps_carry_no_overhead_and_a_missing_baseline_says_why():
    res = _resident(0.2)
    assert _offload(res, _resident(0.1, ids="zipf:1.1"))["offload_overhead"] is None
    rec = _offload(_pinned(0.3), _resident(0.2, ids="zipf:1.1"), _resident(0.2, timer="host_sync"))
    assert rec["offload_overhead"] is None and rec["offload_baseline"] is None
    assert "id distribution" in rec["offload_baseline_note"] and "cuda_event" in rec["offload_baseline_note"]


def test_upgrade_derives_the_offload_figures_again_and_keeps_the_stored_one():
    res = {**_resident(0.25), "schema_version": 4}
    other = {**_resident(0.10, ids="ngram"), "schema_version": 4}
    old = {**_pinned(0.2654), "schema_version": 4, "offload_overhead": 0.004}  # held against the n-gram step
    out = upgrade([res, other, old], {"ceilings": CEILINGS})
    assert out[2]["legacy_offload_overhead"] == 0.004 and out[2]["upgraded_from"] == 4
    assert out[2]["offload_overhead"] == pytest.approx(0.2654 / 0.25 - 1)


def test_suites_carry_the_baselines_of_their_pinned_steps():
    from ple_bench.spec.case import resident_baselines
    from ple_bench.spec.suite import load_suite

    for name in ("paths", "default", "smoke"):
        suite = load_suite(name)
        ids = {c.case_id for c in suite.cases}
        for case in suite.cases:
            for base in resident_baselines(case):
                assert base.case_id in ids, (name, case.case_id)


# ------------------------------------------------------------ upgrades

def test_upgrade_of_a_version_1_run():
    old_step_on = _step(True, 0.1, overlap_efficiency=0.0, gbps=2.0, pct_of_random_row_ceiling=3.0)
    old_step_off = _step(False, 0.4, overlap_efficiency=0.0, gbps=2.0)
    old_lookup = _lookup(gbps=5.24288, ceiling="d2d_gbps", ceiling_gbps=4000.0, pct_of_ceiling=0.13)
    del old_lookup["row_bytes"]
    out = upgrade([old_lookup, old_step_off, old_step_on], {"ceilings": CEILINGS})
    lk, off, on = out
    assert all(r["upgraded_from"] == 1 and r["schema_version"] == SCHEMA_VERSION for r in out)
    assert lk["row_bytes"] == 160 and lk["ceiling"] == "device_random_row_gbps_160B"
    assert "samples_ms" in lk["missing_fields"] and "row_bytes" not in lk["missing_fields"]
    assert off["gbps"] is None and off["overlap_efficiency"] is None
    assert on["overlap_efficiency"] == pytest.approx(0.75) and on["legacy_overlap_efficiency"] == 0.0
    assert "pct_of_random_row_ceiling" not in on
    assert old_step_on["overlap_efficiency"] == 0.0  # the stored records are not changed
    current = derive(_lookup(), CEILINGS)
    assert upgrade([current], {"ceilings": CEILINGS})[0] is current


def test_upgrade_of_a_version_3_host_path_names_its_index_select_ceiling():
    """Schema 3 held host paths against torch's index_select alone; upgraded, the record says so.
    A record without a host-gather ceiling gets no gather name; a current one is left as it is."""
    held = _lookup(impl="pinned_cpu_gather", median_ms=0.8, host_gather_ceiling_ms=0.6, schema_version=3)
    kernel = _lookup(impl="pinned_uva", schema_version=3)
    up_held, up_kernel = upgrade([held, kernel], {"ceilings": CEILINGS})
    assert up_held["host_gather_ceiling_gather"] == "index_select" and up_held["upgraded_from"] == 3
    assert "host_gather_ceiling_gather" not in up_held["missing_fields"]
    assert up_kernel.get("host_gather_ceiling_gather") is None
    assert "host_gather_ceiling_gather" not in held  # the stored record is not changed
    current = derive(_lookup(impl="pinned_cpu_gather", host_gather_ceiling_ms=0.6,
                             host_gather_ceiling_gather="row_loop", schema_version=SCHEMA_VERSION), CEILINGS)
    assert upgrade([current], {"ceilings": CEILINGS})[0] is current


def test_the_archived_runs_load_upgrade_and_report(tmp_path):
    from ple_bench.report import build_report

    assert len(RUNS) >= 10
    assert any(results.load(run).attrs["upgraded"] for run in RUNS)  # an older schema among them
    started = time.perf_counter()
    for run in RUNS:
        df = results.load(run)
        assert len(df) > 0 and (df["schema_version"] == SCHEMA_VERSION).all(), run.name
        import gzip

        raw = [json.loads(line) for line in gzip.open(run / "records.jsonl.gz", "rt") if line.strip()]
        # records of an older schema (none: version 1) are upgraded; current ones are as written
        assert df.attrs["upgraded"] == sum(r.get("schema_version", 1) < SCHEMA_VERSION for r in raw), run.name
        steps = df[df["kind"] == "step"]
        assert steps["gbps"].isna().all() and steps["pct_of_ceiling"].isna().all(), run.name
        assert steps[steps["prefetch"] == False]["overlap_efficiency"].isna().all(), run.name  # noqa: E712
        ok = df[(df["kind"] == "lookup") & (df["status"] == "ok") & (df["mode"] == "gpu")]
        assert ok["ceiling"].notna().all(), run.name  # every lookup names its ceiling
        # and says whether that ceiling binds it: the flag is the share's
        shares = ok[ok["pct_of_ceiling"].notna()]
        assert (shares["ceiling_exceeded"] == (shares["pct_of_ceiling"] > record.CEILING_SLACK_PCT)).all(), run.name
    # two runs (one with decode steps) re-reported in full
    for run in (RUNS[0], next(r for r in RUNS if "overlap" in r.name)):
        html = build_report(run, tmp_path / "reports").read_text()
        assert 'id="findings"' in html
    assert time.perf_counter() - started < 120


def test_the_run_overlap_figures_of_an_archived_run():
    run = next(r for r in RUNS if "overlap" in r.name)
    recs = results.load_records(run)
    on = [r for r in recs if r.get("kind") == "step" and r.get("prefetch") and r.get("overlap_twin")]
    assert on, "no prefetch step found its twin"
    by_id = {r["case_id"]: r for r in recs}
    for r in on:
        twin = by_id[r["overlap_twin"]]
        assert twin["prefetch"] is False and twin_key(twin) == twin_key(r)


# ------------------------------------------------------------ the schema and its documentation

def test_record_keys_come_from_the_schema():
    assert results.RECORD_KEYS == record.RECORD_KEYS
    assert len(set(record.RECORD_KEYS)) == len(record.RECORD_KEYS)
    for f in record.FIELDS:
        assert f.kinds in record.KINDS and f.definition, f.name


def test_docs_schema_table_is_the_generated_schema():
    text = (REPO / "docs" / "schema.md").read_text()
    m = re.search(r"<!-- record-schema:begin -->\n(.*?)<!-- record-schema:end -->", text, re.S)
    assert m, "docs/schema.md has no generated record-schema block"
    assert m.group(1) == record.markdown(), "docs/schema.md's record table differs: paste `python -m ple_bench schema`"


def test_schema_command_prints_the_table(capsys):
    from ple_bench.cli import main

    assert main(["schema"]) == 0
    assert capsys.readouterr().out == record.markdown()
