"""Ceilings that bind and one timing loop, on the CPU:

* each lookup is held against the random-row ceiling of its own memory, table, row
  size and id distribution (hand-built records), bytes counted alike in both;
* a lookup above 105 % of its ceiling is flagged and the finding says the ceiling is
  wrong, not that the lookup is fast;
* the executor measures a random-row ceiling once per key (a counting fake), on the
  case's own table, with the case's id distribution, timed through ``measure`` as
  the case is; the host-gather ceiling goes through the ``host_sync`` path;
* a functional run keeps ``ceilings["random_row"]`` in meta.json and every lookup
  record names its entry.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ple_bench import results
from ple_bench.spec.case import Case
from ple_bench.run.executor import CaseExecutor
from ple_bench.measure import TimingPolicy, ceilings as ceil
from ple_bench.measure import timer as timer_mod
from ple_bench.record import CEILING_SLACK_PCT, derive, upgrade
from tests._fixtures import fixture_run

RUN_CEILINGS = {"pinned_random_row_gbps_160B": 20.0, "device_random_row_gbps_160B": 250.0,
                "host_memcpy_gbps": 10.0}


def _lookup(impl: str, ids: str, median_ms: float, ceiling_gbps: float | None, *, memory: str,
            table_bytes: int = 1 << 30, dim: int = 160, mode: str = "gpu") -> dict:
    case = Case(impl=impl, dim=dim, dtype="fp8", num_heads=16, num_tokens=1024, vocab_size=table_bytes // dim,
                ids=ids)
    rows = 1024 * 16
    rec = {"case_id": case.case_id, "status": "ok", "mode": mode, **case.axes(), "rows": rows,
           "row_bytes": case.row_bytes, "table_bytes": case.table_bytes, "bytes_moved": rows * case.row_bytes,
           "median_ms": median_ms}
    if ceiling_gbps is not None:
        rec["random_row_ceiling"] = ceil.random_row_key(memory, case.table_bytes, case.row_bytes, ids, 16, 1 << 18)
        rec["random_row_ceiling_gbps"] = ceiling_gbps
    return rec


# ------------------------------------------------------------ which ceiling, on records

def test_each_lookup_is_held_against_its_own_random_row_ceiling():
    # the same bytes in 0.5 ms: 16384 x 160 B / 0.5 ms = 5.24288 GB/s
    dev_uniform = derive(_lookup("device", "uniform", 0.5, 400.0, memory="device"), RUN_CEILINGS)
    dev_zipf = derive(_lookup("device", "zipf:1.1", 0.5, 900.0, memory="device"), RUN_CEILINGS)
    pinned_zipf = derive(_lookup("pinned_uva", "zipf:1.1", 0.5, 30.0, memory="pinned"), RUN_CEILINGS)
    small = derive(_lookup("pinned_uva", "uniform", 0.5, 45.0, memory="pinned", table_bytes=1 << 26), RUN_CEILINGS)
    assert dev_uniform["ceiling"] == dev_zipf["ceiling"] == "device_random_row"
    assert pinned_zipf["ceiling"] == small["ceiling"] == "pinned_random_row"
    # not the run-wide figure of the memory: each record's own, per distribution and table
    assert [r["ceiling_gbps"] for r in (dev_uniform, dev_zipf, pinned_zipf, small)] == [400.0, 900.0, 30.0, 45.0]
    assert dev_zipf["random_row_ceiling"].startswith("device:") and ":zipf:1.1:" in dev_zipf["random_row_ceiling"]
    assert f":{small['table_bytes']}:" in small["random_row_ceiling"] and small["table_bytes"] < 1 << 26
    for rec in (dev_uniform, dev_zipf, pinned_zipf, small):
        assert rec["gbps"] == pytest.approx(5.24288)  # rows x row bytes / median, as the ceiling counts
        assert rec["pct_of_ceiling"] == pytest.approx(100 * 5.24288 / rec["ceiling_gbps"])
        assert rec["ceiling_row_bytes"] == 160 and rec["ceiling_exceeded"] is False


def test_without_its_own_ceiling_a_lookup_falls_back_to_the_run_wide_one():
    rec = derive(_lookup("pinned_uva", "uniform", 0.5, None, memory="pinned"), RUN_CEILINGS)
    assert rec["ceiling"] == "pinned_random_row_gbps_160B" and rec["ceiling_gbps"] == 20.0
    functional = derive(_lookup("device", "uniform", 0.5, None, memory="host", mode="functional"), RUN_CEILINGS)
    assert functional["ceiling"] == "host_memcpy_gbps"
    # a functional lookup with its own ceiling is held against that
    own = derive(_lookup("device", "uniform", 0.5, 8.0, memory="host", mode="functional"), RUN_CEILINGS)
    assert own["ceiling"] == "host_random_row" and own["ceiling_gbps"] == 8.0


def test_host_path_keeps_its_host_gather_ceiling_over_a_random_row_one():
    rec = _lookup("pinned_cpu_gather", "uniform", 0.8, 30.0, memory="pinned")
    rec.update(host_gather_ceiling_ms=0.6)
    rec = derive(rec, RUN_CEILINGS)
    assert rec["ceiling"] == "host_gather" and rec["pct_of_ceiling"] == pytest.approx(75.0)
    assert rec["ceiling_exceeded"] is False


def test_a_lookup_at_120_pct_of_its_ceiling_is_flagged_and_called_a_wrong_ceiling():
    from ple_bench.report.data import Run
    from ple_bench.report.findings import ceiling_findings

    gbps = 5.24288
    fast = derive(_lookup("pinned_uva", "zipf:1.1", 0.5, gbps / 1.2, memory="pinned"), RUN_CEILINGS)
    slow = derive(_lookup("pinned_uva", "uniform", 0.5, 4 * gbps, memory="pinned"), RUN_CEILINGS)
    assert fast["pct_of_ceiling"] == pytest.approx(120.0) and fast["ceiling_exceeded"] is True
    assert slow["ceiling_exceeded"] is False and fast["pct_of_ceiling"] > CEILING_SLACK_PCT
    found = ceiling_findings(Run(Path("r"), {"mode": "gpu"}, [fast, slow]))
    warn = [f for f in found if f.level == "warn"]
    assert len(warn) == 1
    text = warn[0].text
    assert f"The ceiling pinned_random_row [{fast['random_row_ceiling']}] does not bind" in text
    assert "(120% of it" in text and "the ceiling is wrong" in text
    # the bound lookup is the one praised; the one above its ceiling is not presented as fast
    assert any("reaches at best 25%" in f.text for f in found)
    assert not any("reaches at best 120%" in f.text for f in found)


def test_a_version_2_record_is_upgraded_with_the_flag():
    old = _lookup("pinned_uva", "zipf:1.1", 0.1, None, memory="pinned")  # 26 GB/s vs 20: 131%
    old["schema_version"] = 2
    (rec,) = upgrade([old], {"ceilings": RUN_CEILINGS})
    assert rec["upgraded_from"] == 2 and rec["ceiling"] == "pinned_random_row_gbps_160B"
    assert rec["ceiling_exceeded"] is True
    assert "random_row_ceiling" in rec["missing_fields"]


# ------------------------------------------------------------ measured by the executor

def _policy(**kw) -> TimingPolicy:
    base = dict(warmup_ms=0.0, min_samples=2, max_samples=3, min_time_s=0.0, max_time_s=0.2,
                cold_l2=False, hot=False, graph=False, id_sets=2)
    base.update(kw)
    return TimingPolicy(**base)


def _case(**kw) -> Case:
    axes = dict(impl="pinned_uva", vocab_size=4096, dim=16, dtype="fp8", num_heads=2, num_tokens=4)
    axes.update(kw)
    return Case(**axes)


def test_the_random_row_ceiling_is_measured_once_per_key(monkeypatch):
    calls = []
    real = ceil.random_row_ceiling

    def counting(table, id_sets, device, **kw):
        calls.append((table.data_ptr(), kw["ids"], kw["memory"], [s.numel() for s in id_sets]))
        return real(table, id_sets, device, **kw)

    monkeypatch.setattr(ceil, "random_row_ceiling", counting)
    ex = CaseExecutor()
    recs = [ex.run(c, _policy()) for c in (
        _case(), _case(num_tokens=8), _case(prefetch=True),  # one table, one distribution: one ceiling
        _case(ids="zipf:1.1"), _case(ids="zipf:1.1", num_tokens=8),  # another distribution: a second
    )]
    # per distribution: the bandwidth-bound batch once, and each row count the cases read once
    n = ceil.random_row_rows(8, 16, 2, cpu=True)
    assert sorted((c[1], c[3][0]) for c in calls) == sorted(
        (ids, rows) for ids in ("uniform", "zipf:1.1") for rows in (8, 16, n))
    assert {c[2] for c in calls} == {"host"}
    # on the case's own table: the tensor its kernel reads
    assert calls[0][0] == ex.table.backend.table_for_kernel().data_ptr()
    assert all(len(c[3]) == 2 and len(set(c[3])) == 1 for c in calls)  # one id set per policy id set
    keys = [r["random_row_ceiling"] for r in recs]
    assert keys[0] == keys[1] == keys[2] != keys[3] == keys[4]
    assert keys[0] == ceil.random_row_key("host", ex.table.backend.table_bytes, 16, "uniform", 2, n)
    at_rows = [r["random_row_ceiling_at_rows"] for r in recs]
    assert at_rows[0] == at_rows[2] != at_rows[1] and at_rows[3] != at_rows[4]
    assert at_rows[0] == ceil.random_row_key("host", ex.table.backend.table_bytes, 16, "uniform", 2, 8)
    for r in recs:
        entries = {e["key"]: e for e in r["random_row_ceiling_entry"]}
        for key, gbps in ((r["random_row_ceiling"], r["random_row_ceiling_gbps"]),
                          (r["random_row_ceiling_at_rows"], r["random_row_ceiling_at_rows_gbps"])):
            entry = entries[key]
            assert gbps == entry["gbps"] > 0
            # bytes counted as the lookup counts them: rows x row bytes over the median
            assert entry["gbps"] == pytest.approx(entry["rows"] * entry["row_bytes"] / (entry["ms"] * 1e6))
    ex.release_table()
    # a new table (another row size) is another ceiling
    ex.run(_case(dim=32), _policy())
    assert len(calls) == 8 and calls[6][1] == calls[7][1] == "uniform"


def test_the_random_row_ceiling_draws_the_cases_distribution(monkeypatch):
    seen = {}
    real = ceil.random_row_ceiling

    def spy(table, id_sets, device, **kw):
        seen[kw["ids"]] = torch.cat([s.reshape(-1) for s in id_sets])
        return real(table, id_sets, device, **kw)

    monkeypatch.setattr(ceil, "random_row_ceiling", spy)
    ex = CaseExecutor()
    for ids in ("uniform", "zipf:1.5"):
        ex.run(_case(ids=ids, vocab_size=1 << 16), _policy())
    share_of_top = {k: torch.unique(v, return_counts=True)[1].max().item() / v.numel() for k, v in seen.items()}
    # Zipf(1.5) ids repeat their hot rows; uniform ids over 32 K rows per head hardly repeat
    assert share_of_top["zipf:1.5"] > 0.05 > share_of_top["uniform"]


def test_ceilings_are_timed_through_measure_as_their_cases(monkeypatch):
    import ple_bench.measure as measure_pkg

    calls = []
    real = timer_mod.measure

    def spy(fn, **kw):
        calls.append(kw)
        return real(fn, **kw)

    monkeypatch.setattr(ceil, "measure", spy)  # what the ceilings call
    monkeypatch.setattr(measure_pkg, "measure", spy)  # what the executor calls for the cases
    ex = CaseExecutor()
    pol = _policy(cold_l2=True, max_time_s=5.0)
    ex.run(_case(impl="pinned_cpu_gather", ids_on="host"), pol)
    host_calls, calls[:] = list(calls), []
    ex.release_table()
    ex.run(_case(), pol)
    kernel_calls = list(calls)
    (host_case,) = [c for c in host_calls if c["label"] == "lookup"]
    gathers = [c for c in host_calls if c["label"].startswith("ceiling_host_gather_")]
    assert gathers and gathers[0]["label"] == "ceiling_host_gather_index_select"
    (kernel_case,) = [c for c in kernel_calls if c["label"] == "lookup"]
    rrs = [c for c in kernel_calls if c["label"] == "ceiling_host_random_row"]
    assert len(rrs) == 2  # at the case's own rows and at the bandwidth-bound batch
    # the host-gather ceiling's gathers on the path its host-path case is timed on: host_sync, same L2
    for gather in gathers:
        assert gather["host_sync"] is host_case["host_sync"] is True
        assert gather["cold_l2"] is host_case["cold_l2"] is True
    # the random-row ceiling as its kernel-path case: no host_sync, the same L2 setting
    for rr in rrs:
        assert rr.get("host_sync", False) is kernel_case["host_sync"] is False
        assert rr["cold_l2"] is kernel_case["cold_l2"] is True
    # a bounded copy of the case's policy
    for c in (*gathers, *rrs):
        assert c["policy"].max_time_s == ceil.CEILING_MAX_TIME_S and c["policy"].min_samples == pol.min_samples
        assert c["policy"].max_noise == pol.max_noise and c["policy"].warmup_ms == pol.warmup_ms
        assert c["policy"].min_time_s == min(pol.min_time_s, ceil.CEILING_MIN_TIME_S)


def test_a_ceiling_samples_at_least_its_own_floor_not_the_cases():
    """A ceiling keeps the case's noise target, minimum samples, warm-up and L2 setting, with a
    floor of CEILING_MIN_TIME_S (a case's shorter floor is kept) and the cap CEILING_MAX_TIME_S."""
    from ple_bench.measure import TimingPolicy

    case = TimingPolicy(warmup_ms=50.0, min_samples=10, max_samples=1000, min_time_s=0.15, max_time_s=1.5,
                        max_noise=0.02, cold_l2=True, hot=True)
    b = ceil.bounded_policy(case)
    assert (b.min_time_s, b.max_time_s) == (ceil.CEILING_MIN_TIME_S, ceil.CEILING_MAX_TIME_S) == (0.05, 0.5)
    assert (b.warmup_ms, b.min_samples, b.max_noise, b.cold_l2, b.hot, b.graph) == (50.0, 10, 0.02, True, False, False)
    short = ceil.bounded_policy(TimingPolicy(min_time_s=0.01, max_time_s=0.02))
    assert (short.min_time_s, short.max_time_s) == (0.01, 0.02)


def test_host_gather_ceiling_is_the_faster_plain_gather(monkeypatch):
    """Both plain gathers are timed; the lower median binds and is named, the other is kept
    beside it; both gathers give index_select's rows (the row loop is the path's own)."""
    from ple_bench.backends.cuda.native import host_gather_module

    if host_gather_module() is None:
        pytest.skip("the native row loop is not built here")
    table = torch.randint(0, 1 << 30, (4096, 32), dtype=torch.int32, generator=torch.Generator().manual_seed(1))
    view = table.view(torch.uint8).view(4096, -1)
    ids = torch.randint(0, 4096, (300,), generator=torch.Generator().manual_seed(2))
    out = torch.full((300, view.shape[1]), 0x7F, dtype=torch.uint8)
    ceil._row_loop(view)(ids, out)
    assert torch.equal(out, torch.index_select(view, 0, ids))
    real = timer_mod.measure
    for fast in ("index_select", "row_loop"):
        def fake(fn, *, label, **kw):
            m = real(fn, label=label, **kw)  # the gather runs; its median is set
            m.samples_ms = [1.0 if label.endswith(fast) else 2.0] * len(m.samples_ms)
            return m

        monkeypatch.setattr(ceil, "measure", fake)
        c = ceil.host_gather_ceiling(table, 256, "cpu", policy=_policy(), warm=False)
        assert c["gather"] == fast and c["ms"] == 1.0
        assert (c["torch_ms"], c["row_loop_ms"]) == ((1.0, 2.0) if fast == "index_select" else (2.0, 1.0))
    c = ceil.host_gather_ceiling(table, 256, "cpu", policy=_policy(), warm=False, row_loop=False)
    assert c["gather"] == "index_select" and c["row_loop_ms"] is None and c["ms"] == c["torch_ms"] == 2.0


def test_host_gather_ceiling_keeps_the_warm_figure_too():
    table = torch.arange(4096 * 32, dtype=torch.int32).reshape(4096, 32)
    c = ceil.host_gather_ceiling(table, 256, "cpu", policy=_policy())
    assert c["ms"] > 0 and c["warm_ms"] > 0 and c["warm_repeats"] >= ceil.HOST_GATHER_MIN_REPEATS
    assert c["timer"] == "host_monotonic" and c["id_sets"] == ceil.HOST_GATHER_ID_SETS


SUITE = """
[suite]
description = "random-row ceilings in a functional run"
[suite.timing]
min_samples = 2
max_samples = 3
max_time_s = 0.2
[[group]]
vocab_size = 1024
dim = 16
dtype = "fp8"
num_heads = 2
num_tokens = 4
impl = ["device", "pinned_uva", "pinned_cpu_gather"]
ids = ["uniform", "zipf:1.1"]
"""


@pytest.mark.slow  # python -m ple_bench run end to end: a new interpreter and its worker process
def test_a_functional_run_keeps_its_random_row_ceilings_in_meta(tmp_path):
    from tests.test_cli import run_suite_text

    run_dir, meta = run_suite_text(tmp_path, SUITE)
    table = meta["ceilings"]["random_row"]
    assert meta["ceilings"]["host_memcpy_gbps"] > 0 and meta["ceilings"]["host_gather"]
    # one per (memory, table, row, distribution): in functional mode the device and pinned tables
    # are both CPU tensors ("host") of one size, so they share theirs
    assert {v["ids"] for v in table.values()} == {"uniform", "zipf:1.1"}
    recs = results.load_records(run_dir)
    assert {r["status"] for r in recs} == {"ok"}
    for r in recs:
        if r["impl"] == "pinned_cpu_gather":
            assert r["ceiling"] == "host_gather" and r["random_row_ceiling"] is None
            continue
        entry = table[r["random_row_ceiling"]]
        assert entry["ids"] == r["ids"] and entry["row_bytes"] == r["row_bytes"] and entry["memory"] == "host"
        own = table[r["random_row_ceiling_at_rows"]]
        assert own["rows"] == r["rows"] and own["ids"] == r["ids"]
        assert r["ceiling"] == "host_random_row_at_rows" and r["ceiling_gbps"] == own["gbps"]
        assert r["pct_of_bandwidth_ceiling"] == pytest.approx(100 * r["gbps"] / entry["gbps"])
        assert r["ceiling_exceeded"] == (r["pct_of_ceiling"] > CEILING_SLACK_PCT)


def test_a_pinned_table_on_other_pages_has_a_ceiling_of_its_own():
    torch_key = ceil.random_row_key("pinned", 1 << 30, 160, "uniform", 16, 1 << 18)
    huge_key = ceil.random_row_key("pinned", 1 << 30, 160, "uniform", 16, 1 << 18, host_alloc="exact_huge")
    assert torch_key == "pinned:1073741824:160:uniform:h16:n262144"
    assert huge_key == torch_key + ":exact_huge"
    # and a record holding one is named by its memory, whatever the allocation
    rec = _lookup("pinned_uva", "uniform", 0.5, 30.0, memory="pinned")
    rec["random_row_ceiling"] = huge_key
    assert derive(rec, RUN_CEILINGS)["ceiling"] == "pinned_random_row"


def test_a_ceiling_opens_no_profiler_or_trace_window(monkeypatch):
    """Under ``--profile-window`` / ``--torch-trace`` only the case's sampling phases are
    windows: a ceiling measured inside the case opens none."""
    from ple_bench.measure import profiler

    seen = []
    real = timer_mod.measure

    def spy(fn, **kw):
        seen.append((kw["label"], profiler.profiler_window_enabled(), profiler.torch_trace() is not None))
        return real(fn, **kw)

    monkeypatch.setattr(ceil, "measure", spy)
    profiler.set_profiler_window(True)
    trace = profiler.set_torch_trace(3)
    try:
        ceil.random_row_ceiling(torch.zeros(64, 4, dtype=torch.int64), [torch.arange(8)], "cpu", memory="host",
                                policy=_policy())
        ceil.host_gather_ceiling(torch.zeros(64, 4, dtype=torch.int64), 8, "cpu", policy=_policy(), warm=False)
        # restored for the case's own measurements
        assert profiler.profiler_window_enabled() and profiler.torch_trace() is trace
    finally:
        profiler.set_profiler_window(False)
        profiler.set_torch_trace(None)
    assert [s[0] for s in seen][:2] == ["ceiling_host_random_row", "ceiling_host_gather_index_select"]
    assert set(s[0] for s in seen[2:]) <= {"ceiling_host_gather_row_loop"}
    assert all(not window and not traced for _, window, traced in seen)


def test_the_archived_h200_run_presents_no_lookup_above_its_ceiling_as_fast():
    """Run ...-fa39 (an H200 run of the default suite): every finding that quotes a share above 105 %
    of a ceiling says in the same sentence that the ceiling does not bind."""
    import re

    from ple_bench.report.data import load_run
    from ple_bench.report.findings import findings

    run = load_run(fixture_run("20261201-123806-default-fa39"))
    texts = [f.text for f in findings(run)]
    above = [t for t in texts if any(float(m) > CEILING_SLACK_PCT for m in re.findall(r"(\d+(?:\.\d+)?)% of", t))]
    assert above, "the run has two lookups above their ceiling (dedup, hot cache); the findings name them"
    for t in above:
        assert "does not bind" in t or "is wrong" in t, t


# ------------------------------------------------- kernels that read their rows sorted

def test_a_kernel_declared_sorted_reads_is_known_by_its_declaration_not_its_name(monkeypatch):
    from ple_bench.backends import get_backend, kernels
    from ple_bench.backends.kernels import get_kernel, kernel_names, sorted_reads

    def plain(table, flat_ids, out, vocab_start, vocab_end):
        get_kernel("torch_masked")(table, flat_ids, out, vocab_start, vocab_end)

    kernel_names()  # the registry complete before two kernels of this test's own join it (and leave)
    monkeypatch.setitem(kernels._KERNELS, "test_plain_reader", plain)
    monkeypatch.setitem(kernels._KERNELS, "test_sorting_reader", sorted_reads(lambda *a: plain(*a)))
    b = get_backend("pinned_uva")(64, 16, dtype=torch.float32, device="cpu")
    try:
        seen = {}
        for name in ("torch_masked", "triton_tuned", "dedup_triton", "dedup_torch", "dedup:torch_index",
                     "test_plain_reader", "test_sorting_reader"):
            b.set_kernel(name)
            seen[name] = b.reads_sorted
    finally:
        b.close()
    assert seen == {"torch_masked": False, "triton_tuned": False, "dedup_triton": True, "dedup_torch": True,
                    "dedup:torch_index": True, "test_plain_reader": False, "test_sorting_reader": True}
    # every dedup variant declares it (its plan sorts the ids); no other built-in does
    assert {k for k in kernel_names() if not k.startswith("test_")
            and getattr(get_kernel(k), "reads_sorted", False)} == {
        k for k in kernel_names() if k.startswith("dedup")}


def test_the_sorted_ceiling_gathers_the_same_rows_in_ascending_order(monkeypatch):
    gathered = []
    real = torch.index_select

    def spy(table, dim, index, *, out=None):
        gathered.append(index.clone())
        return real(table, dim, index, out=out)

    ids = [torch.tensor([[9, 3], [3, 40], [7, 1]]), torch.tensor([[5, 63], [0, 2], [2, 11]])]
    table = torch.arange(64 * 4, dtype=torch.int32).reshape(64, 4)
    monkeypatch.setattr(torch, "index_select", spy)
    entry = ceil.random_row_ceiling(table, ids, "cpu", memory="host", policy=_policy(), num_heads=2,
                                    order="sorted")
    random = ceil.random_row_ceiling(table, ids, "cpu", memory="host", policy=_policy(), num_heads=2)
    monkeypatch.setattr(torch, "index_select", real)
    assert entry["order"] == "sorted" and entry["key"].endswith(":sorted")
    assert random["order"] == "random" and not random["key"].endswith(":sorted")
    assert entry["key"] == random["key"] + ":sorted"
    want = {tuple(sorted(s.reshape(-1).tolist())) for s in ids}  # the same rows, duplicates kept
    sorted_calls = {tuple(g.tolist()) for g in gathered[:len(gathered) // 2]}
    assert sorted_calls == want
    assert {tuple(g.tolist()) for g in gathered[len(gathered) // 2:]} == {tuple(s.reshape(-1).tolist()) for s in ids}
    with pytest.raises(ValueError, match="row order"):
        ceil.random_row_key("host", 1, 16, "uniform", 2, 8, order="shuffled")


def test_a_sorted_kernel_case_is_held_against_the_sorted_ceiling(monkeypatch):
    orders = []
    real = ceil.random_row_ceiling

    def spy(table, id_sets, device, **kw):
        orders.append(kw.get("order", "random"))
        return real(table, id_sets, device, **kw)

    monkeypatch.setattr(ceil, "random_row_ceiling", spy)
    ex = CaseExecutor()
    try:
        dedup = derive({**ex.run(_case(kernel="dedup_torch"), _policy()), "status": "ok", "mode": "functional"}, {})
        plain = derive({**ex.run(_case(kernel="torch_masked"), _policy()), "status": "ok", "mode": "functional"}, {})
    finally:
        ex.release_table()
    # the dedup case's two ceilings (its own rows, the bandwidth-bound batch) are sorted, the plain one's not
    assert orders == ["sorted", "sorted", "random", "random"]
    assert dedup["random_row_ceiling"].endswith(":sorted") and dedup["random_row_ceiling_at_rows"].endswith(":sorted")
    assert dedup["ceiling"] == "host_sorted_random_row_at_rows"
    assert {e["order"] for e in dedup["random_row_ceiling_entry"]} == {"sorted"}
    assert plain["ceiling"] == "host_random_row_at_rows" and not plain["random_row_ceiling"].endswith(":sorted")


def test_a_sorted_ceiling_is_named_so_and_its_finding_names_the_kernel():
    from ple_bench.record import random_row_ceiling_name
    from ple_bench.report.data import Run
    from ple_bench.report.findings import ceiling_findings

    key = ceil.random_row_key("pinned", 1 << 30, 160, "uniform", 16, 1 << 18, order="sorted")
    assert random_row_ceiling_name(key) == "pinned_sorted_random_row"
    assert random_row_ceiling_name(key, at_rows=True) == "pinned_sorted_random_row_at_rows"
    assert random_row_ceiling_name(key[: -len(":sorted")]) == "pinned_random_row"
    exact = ceil.random_row_key("pinned", 1 << 30, 160, "uniform", 16, 8, host_alloc="exact", order="sorted")
    assert random_row_ceiling_name(exact) == "pinned_sorted_random_row"
    assert random_row_ceiling_name(exact[: -len(":sorted")]) == "pinned_random_row"  # ends with its host_alloc

    gbps = 5.24288
    rec = _lookup("pinned_uva", "uniform", 0.5, gbps / 1.37, memory="pinned")
    rec["random_row_ceiling"] = key
    rec["kernel"] = rec["kernel_ran"] = "dedup_triton"
    rec = derive(rec, RUN_CEILINGS)
    assert rec["ceiling"] == "pinned_sorted_random_row" and rec["ceiling_exceeded"] is True
    warn = [f.text for f in ceiling_findings(Run(Path("r"), {"mode": "gpu"}, [rec])) if f.level == "warn"]
    assert len(warn) == 1 and "this pinned_uva (kernel dedup_triton) case" in warn[0]
    assert f"pinned_sorted_random_row [{key}]" in warn[0]
