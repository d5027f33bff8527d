"""Ids on the host (``ids_on = "host"``) on the CPU, functional mode: every path
looks up host ids bit-exactly (lookup and prefetch), every path's decode step
with host ids matches the reference, host paths gather without a device->host
copy, the axis is validated, the host-gather ceiling reaches records and
``meta.json``, and a host path in a full graph is refused with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ple_bench import results
from ple_bench.backends import get_backend, synthetic_rows
from ple_bench.spec.case import Case
from ple_bench.run.executor import CaseExecutor
from ple_bench.measure import TimingPolicy, host_gather_ceiling
from ple_bench.run.step import DecodeStep, check_step
from ple_bench.spec.suite import SuiteError, load_suite

VOCAB, DIM, HEADS, TOKENS, HIDDEN, SEED = 2048, 16, 2, 6, 24, 77
# every lookup path: (impl, kernel)
PATHS = [("device", ""), ("device", "triton_reference"), ("pinned_uva", "triton_reference"),
         ("pinned_uva", "torch_uva"), ("pinned_uva", "triton_tuned"), ("pinned_uva", "dedup_triton"),
         ("pinned_cpu_gather", ""), ("pinned_copy_engine", ""), ("pinned_hot_cache", "")]


def _backend(impl: str, kernel: str = "", dtype: str = "fp8"):
    kwargs = {"kernel": kernel} if kernel else {}
    if impl == "pinned_hot_cache":
        kwargs["cache_rows"] = 64
    b = get_backend(impl)(VOCAB, DIM, dtype=dtype, num_heads=HEADS, max_tokens=TOKENS, device="cpu", **kwargs)
    b.fill_synthetic(SEED, scale=0.5 if b.format.quantized else None)
    return b


def _host_ids(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    per = VOCAB // HEADS
    return torch.randint(0, per, (TOKENS, HEADS), generator=gen) + torch.arange(HEADS) * per


def _reference(b, ids):
    return synthetic_rows(ids.reshape(-1), DIM, SEED, b.storage_dtype).reshape(ids.shape[0], -1)


@pytest.mark.parametrize("impl,kernel", PATHS, ids=[f"{i}-{k or 'default'}" for i, k in PATHS])
def test_every_path_looks_up_host_ids_exactly(impl, kernel):
    b = _backend(impl, kernel)
    for seed in (1, 2, 3):
        ids = _host_ids(seed)
        got = b.lookup(ids)
        assert torch.equal(got.view(torch.uint8), _reference(b, ids).view(torch.uint8))
        if b.supports_prefetch:
            b.start_prefetch(ids)
            out = torch.full_like(got.view(torch.uint8), 0x7F).view(got.dtype)
            b.finalize(out=out)
            assert torch.equal(out.view(torch.uint8), _reference(b, ids).view(torch.uint8))
    b.close()


@pytest.mark.parametrize("impl", ["pinned_cpu_gather", "pinned_copy_engine"])
def test_host_paths_gather_host_ids_at_once(impl):
    """Host ids go straight to the host thread: no device->host id staging is made."""
    b = _backend(impl)
    assert type(b).blocks_host and type(b).reads_ids_on_host
    b.start_prefetch(_host_ids(5))
    b.finalize()
    assert b._host_ids_buf is None  # the device->host id buffer is only for device ids
    b.close()


def test_capabilities_are_declared_per_path():
    host = {n for n, _ in PATHS if getattr(get_backend(n), "blocks_host")}
    assert host == {"pinned_cpu_gather", "pinned_copy_engine"}
    assert {n for n, _ in PATHS if get_backend(n).reads_ids_on_host} == host


@pytest.mark.parametrize("impl,kernel", PATHS, ids=[f"{i}-{k or 'default'}" for i, k in PATHS])
@pytest.mark.parametrize("prefetch", [False, True])
def test_host_ids_steps_match_the_reference(impl, kernel, prefetch):
    b = _backend(impl, kernel)
    if prefetch and not b.supports_prefetch:
        pytest.skip("no prefetch")
    step = DecodeStep(b, hidden=HIDDEN, num_tokens=TOKENS, compute_layers=2, prefetch=prefetch,
                      ids_on="host")
    assert step.ids.device.type == "cpu"
    check_step(step, [_host_ids(s) for s in (11, 12, 13)], SEED)  # raises StepMismatch on any byte
    b.close()


def test_host_path_in_a_full_graph_is_refused_with_the_reason():
    from ple_bench.run.graphs import BreakableGraph
    from tests.test_graphs import FakeDevice

    dev = FakeDevice()
    factory = lambda mode: BreakableGraph(mode, segment_factory=dev.factory, pool_factory=object)  # noqa: E731
    for ids_on in ("host", "device"):
        with pytest.raises(NotImplementedError, match="on the host"):
            DecodeStep(_backend("pinned_cpu_gather"), hidden=HIDDEN, num_tokens=TOKENS, compute_layers=1,
                       prefetch=True, graph="full", ids_on=ids_on, graph_factory=factory)
    # a kernel path with host ids may be captured whole (the id copy is part of the graph)
    DecodeStep(_backend("pinned_uva"), hidden=HIDDEN, num_tokens=TOKENS, compute_layers=1, prefetch=True,
               graph="full", ids_on="host", graph_factory=factory)


def test_ids_on_axis_case_id_and_validation(tmp_path):
    base = Case(impl="pinned_uva", num_tokens=4)
    assert "idshost" not in base.case_id
    host = Case(impl="pinned_uva", num_tokens=4, ids_on="host")
    assert ".idshost" in host.case_id and host.case_id != base.case_id
    assert ".gt4" in Case(impl="pinned_cpu_gather", gather_threads=4).case_id
    bad = tmp_path / "bad.toml"
    bad.write_text('[suite]\ndescription = "x"\n[[group]]\nimpl = "pinned_uva"\nids_on = "gpu"\n')
    with pytest.raises(SuiteError, match="ids_on"):
        load_suite(bad)
    bad.write_text('[suite]\ndescription = "x"\n[[group]]\nimpl = "pinned_cpu_gather"\ngather_threads = -2\n')
    with pytest.raises(SuiteError, match="gather_threads"):
        load_suite(bad)


def test_cli_exit_2_names_the_key(tmp_path):
    from tests._cli import run_cli

    bad = tmp_path / "bad.toml"
    bad.write_text('[suite]\ndescription = "x"\n[[group]]\nimpl = "pinned_uva"\nids_on = "gpu"\n')
    proc = run_cli("list", "--suite", str(bad), cpu=True)
    assert proc.returncode == 2 and "ids_on" in proc.stderr


def _policy() -> TimingPolicy:
    return TimingPolicy(warmup_ms=0.0, min_samples=2, max_samples=3, min_time_s=0.0, max_time_s=0.2,
                        cold_l2=False, hot=False, graph=False, id_sets=2)


@pytest.mark.parametrize("kind", ["lookup", "step"])
def test_executor_runs_host_ids_and_states_the_host_gather_share(kind):
    ex = CaseExecutor()
    case = Case(kind=kind, impl="pinned_cpu_gather", vocab_size=VOCAB, dim=DIM, dtype="fp8", num_heads=HEADS,
                num_tokens=TOKENS, prefetch=True, ids_on="host", compute_us=0.0)
    rec = ex.run(case, _policy())
    ceiling = rec["host_gather_ceiling"]
    assert ceiling["rows"] == TOKENS * HEADS and ceiling["table_bytes"] == ex.table.backend.table_bytes
    assert rec["host_gather_ceiling_ms"] == ceiling["ms"] > 0
    share = rec["pct_of_host_gather_ceiling" if kind == "lookup" else "lookup_pct_of_host_gather_ceiling"]
    measured = rec["median_ms"] if kind == "lookup" else rec["lookup_ms"]
    assert share == pytest.approx(100.0 * ceiling["ms"] / measured)
    ex.release_table()
    # a kernel path states no host-gather ceiling
    rec = CaseExecutor().run(Case(impl="pinned_uva", vocab_size=VOCAB, dim=DIM, num_heads=HEADS,
                                  num_tokens=TOKENS, ids_on="host"), _policy())
    assert "host_gather_ceiling_ms" not in rec


def test_host_gather_ceiling_on_the_cpu():
    table = torch.arange(4096 * 32, dtype=torch.int32).reshape(4096, 32)
    c = host_gather_ceiling(table, 256, "cpu")
    assert c["rows"] == 256 and c["row_bytes"] == 128 and c["table_bytes"] == table.numel() * 4
    assert c["repeats"] >= 20 and c["rows_per_s"] == pytest.approx(256 / (c["ms"] / 1e3))


SUITE = """
[suite]
description = "host ids"
[suite.timing]
warmup_ms = 0
min_samples = 2
max_samples = 3
max_time_s = 0.2
[defaults]
vocab_size = 1024
dim = 16
num_heads = 2
num_tokens = 4
dtype = "fp8"
ids_on = "host"
[[group]]
impl = ["pinned_cpu_gather", "pinned_uva"]
prefetch = ["off", "on"]
"""


@pytest.mark.slow  # python -m ple_bench run end to end: a new interpreter and its worker process
def test_run_keeps_the_host_gather_ceiling_in_meta(tmp_path):
    from tests.test_cli import run_suite_text

    run_dir, meta = run_suite_text(tmp_path, SUITE)
    table = meta["ceilings"]["host_gather"]
    assert list(table) == [f"{1024 * 16}:8:16"]  # one table, 4 tokens x 2 heads, 16-byte fp8 rows
    recs = results.load_records(run_dir)
    assert {r["status"] for r in recs} == {"ok"} and all(r["ids_on"] == "host" for r in recs)
    gather = [r for r in recs if r["impl"] == "pinned_cpu_gather"]
    assert len(gather) == 2 and all(r["host_gather_ceiling_ms"] == table[f"{1024 * 16}:8:16"]["ms"] for r in gather)


@pytest.mark.parametrize("impl", ["pinned_cpu_gather", "pinned_copy_engine"])
def test_deferred_host_prefetch_does_the_work_in_finalize(impl):
    b = get_backend(impl)(VOCAB, DIM, dtype="fp8", num_heads=HEADS, max_tokens=TOKENS, device="cpu",
                          host_prefetch="deferred")
    b.fill_synthetic(SEED, scale=0.5)
    first, second = _host_ids(21), _host_ids(22)
    b.start_prefetch(first)
    assert b._host_pool is None and b.host_thread_s == 0.0  # nothing handed off, nothing done yet
    b.start_prefetch(second)  # the unfinished first one is dropped
    got = b.finalize()
    assert torch.equal(got.view(torch.uint8), _reference(b, second).view(torch.uint8))
    with pytest.raises(RuntimeError, match="start_prefetch"):
        b.finalize()
    with pytest.raises(ValueError, match="host_prefetch"):
        get_backend(impl)(VOCAB, DIM, dtype="fp8", num_heads=HEADS, device="cpu", host_prefetch="eager")


def test_a_table_is_reused_across_token_counts_and_its_buffers_resized():
    ex = CaseExecutor()
    small = Case(impl="pinned_uva", vocab_size=VOCAB, dim=DIM, dtype="fp8", num_heads=HEADS, num_tokens=4,
                 prefetch=True)
    rec = ex.run(small, _policy())
    backend = ex.table.backend
    assert backend.prefetch_rows == 4
    big = Case(impl="pinned_uva", vocab_size=VOCAB, dim=DIM, dtype="fp8", num_heads=HEADS, num_tokens=16,
               prefetch=True, ids_on="host")
    rec = ex.run(big, _policy())  # the gate checks every id set of the larger batch byte for byte
    assert ex.table.backend is backend and backend.prefetch_rows == 16 and rec["table_reused"] is True
    assert backend.prepare_prefetch().shape[0] == 16
