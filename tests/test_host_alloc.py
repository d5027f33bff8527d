"""The ``host_alloc`` axis: how a pinned table's host memory is allocated (torch's
caching allocator, or exactly with cudaHostRegister over an anonymous mapping),
what it costs in the record, the memory check's arithmetic per mode and the skip
reasons.  On a CPU both modes run in functional mode; the registration runtime
is faked to check the exact path's register / unregister calls."""

from __future__ import annotations

import mmap
import re

import pytest
import torch

from ple_bench import results
from ple_bench.backends import synthetic_rows
from ple_bench.backends.cuda import host_alloc
from ple_bench.backends.pinned_cpu_gather import PinnedCPUGatherEmbedding
from ple_bench.backends.pinned_uva import PinnedUVAEmbedding
from ple_bench.spec.case import HOST_ALLOC_MODES, Case
from ple_bench.run.executor import CaseExecutor
from ple_bench.run.outcome import SkipCase
from ple_bench.measure import TimingPolicy
from ple_bench.spec.suite import SuiteError, load_suite

GiB, MiB = 1 << 30, 1 << 20
PAGE = mmap.PAGESIZE
QWEN_BYTES = 320_001_536 * 160  # the 47.7 GiB table


def policy() -> TimingPolicy:
    return TimingPolicy(warmup_ms=0.0, min_samples=1, max_samples=2, min_time_s=0.0, max_time_s=0.05,
                        id_sets=2)


class FakeRuntime:
    """Stands in for cudaHostRegister / cudaHostUnregister; records every call."""

    def __init__(self, register_code: int = 0) -> None:
        self.register_code = register_code
        self.registered: list[tuple[int, int, int]] = []
        self.unregistered: list[int] = []

    def register(self, ptr: int, nbytes: int, flags: int) -> int:
        self.registered.append((ptr, nbytes, flags))
        return self.register_code

    def unregister(self, ptr: int) -> int:
        self.unregistered.append(ptr)
        return 0


# ------------------------------------------------------------------ arithmetic
def test_bytes_per_mode():
    # torch pins a power-of-two block; exact the page-rounded bytes; exact_huge 2 MiB-rounded
    assert host_alloc.host_table_bytes(QWEN_BYTES, "torch") == 64 * GiB
    assert host_alloc.host_table_bytes(QWEN_BYTES, "exact") == -(-QWEN_BYTES // PAGE) * PAGE
    assert host_alloc.host_table_bytes(QWEN_BYTES, "exact") - QWEN_BYTES < PAGE
    assert host_alloc.host_table_bytes(150 * GiB, "torch") == 256 * GiB
    assert host_alloc.host_table_bytes(150 * GiB, "exact") == 150 * GiB
    assert host_alloc.host_table_bytes(PAGE + 1, "exact") == 2 * PAGE
    assert host_alloc.host_table_bytes(3 * MiB + 1, "exact_huge") == 4 * MiB
    assert host_alloc.host_table_bytes(32 * GiB, "torch") == 32 * GiB
    assert host_alloc.host_table_bytes(32 * GiB + 1, "torch") == 64 * GiB
    # without a GPU nothing is pinned: torch's CPU allocator takes the bytes as they are
    assert host_alloc.host_table_bytes(QWEN_BYTES, "torch", pinned=False) == QWEN_BYTES
    with pytest.raises(ValueError, match="host_alloc must be one of"):
        host_alloc.host_table_bytes(1, "numa")


def test_fit_per_mode_with_the_real_numbers():
    available = 125 * GiB
    # 47.7 GiB: torch needs 64 GiB, exact 47.7 GiB; both fit in 125 GiB
    assert host_alloc.host_fit(QWEN_BYTES, 1, "torch", pinned=True, available=available) is None
    assert host_alloc.host_fit(QWEN_BYTES, 1, "exact", pinned=True, available=available) is None
    # 100 GiB: torch needs a 128 GiB block and cannot; exact fits
    reason = host_alloc.host_fit(100 * GiB, 1, "torch", pinned=True, available=available)
    assert reason is not None
    assert "host_alloc=torch" in reason and "128.0 GiB" in reason and "125.0 GiB available" in reason
    assert "power-of-two" in reason
    assert host_alloc.host_fit(100 * GiB, 1, "exact", pinned=True, available=available) is None
    # the headroom: a table that takes everything does not fit
    assert host_alloc.host_fit(124 * GiB, 1, "exact", pinned=True, available=available) is not None
    # two ranks on one host: 2 x 64 GiB for torch
    reason = host_alloc.host_fit(QWEN_BYTES, 2, "torch", pinned=True, available=available)
    assert reason is not None and "2 ranks x 64.00 GiB" in reason and "128.0 GiB" in reason
    assert host_alloc.host_fit(QWEN_BYTES, 2, "exact", pinned=True, available=available) is None
    # functional mode: the old rule (at most half of the host), no power-of-two rounding
    assert host_alloc.host_fit(40 * GiB, 1, "torch", pinned=False, available=100 * GiB) is None
    assert "functional" in host_alloc.host_fit(60 * GiB, 1, "exact", pinned=False, available=100 * GiB)


def test_memory_check_on_a_gpu_path_uses_the_mode(monkeypatch):
    """The executor's check before a pinned case (the GPU branch, its device query faked)."""
    monkeypatch.setenv("PLE_BENCH_HOST_MEM_BYTES", str(125 * GiB))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (100 * GiB, 141 * GiB))
    ex = CaseExecutor(device=torch.device("cuda", 0))
    case = Case(impl="pinned_uva", vocab_size=100 * GiB // 160, dim=160, dtype="fp8", host_alloc="torch")
    with pytest.raises(SkipCase) as info:
        ex._check_memory(case, PinnedUVAEmbedding, case.table_bytes)
    assert re.search(r"host_alloc=torch: the table needs 128\.0 GiB .* 125\.0 GiB available", str(info.value))
    ex._check_memory(Case(**{**case.axes(), "extra": {}, "host_alloc": "exact"}), PinnedUVAEmbedding,
                     case.table_bytes)  # fits: no exception
    # the device table's own check is unchanged: it needs device memory, not host memory
    from ple_bench.backends.device import DeviceResidentEmbedding

    ex._check_memory(Case(impl="device", vocab_size=1 << 20), DeviceResidentEmbedding, 1 << 30)


# ------------------------------------------------------------------ functional mode, both modes
@pytest.mark.parametrize("mode", HOST_ALLOC_MODES)
@pytest.mark.parametrize("cls", [PinnedUVAEmbedding, PinnedCPUGatherEmbedding])
def test_each_mode_gives_a_correct_table(mode, cls):
    b = cls(3000, 64, dtype="fp8", num_heads=2, max_tokens=8, host_alloc=mode, device="cpu")
    alloc = b.host_allocation
    assert alloc.mode == mode and alloc.pinned_bytes == 0 and "functional mode" in alloc.note
    nbytes = 3008 * 64  # rows padded to 64
    assert alloc.nbytes == nbytes
    assert alloc.host_bytes == host_alloc.host_table_bytes(nbytes, mode, pinned=False)
    b.fill_synthetic(7)
    ids = torch.tensor([[0, 2999], [1500, 17], [42, 42]], dtype=torch.int64)
    out = b.lookup(ids)
    want = synthetic_rows(ids.reshape(-1), 64, 7, b.storage_dtype).reshape(3, 128)
    assert torch.equal(out.view(torch.uint8), want.view(torch.uint8))
    if mode != "torch":
        mapping = alloc._mapping
        start = b.weight.data_ptr()
        if mode == "exact_huge":
            assert start % (2 * MiB) == 0
        b.close()
        assert alloc.freed and mapping.closed  # unmapped exactly on close
    else:
        b.close()


def test_executor_records_the_allocation_per_mode():
    ex = CaseExecutor(device=torch.device("cpu"))
    base = dict(impl="pinned_uva", vocab_size=4096, dim=160, dtype="fp8", num_heads=4, num_tokens=8)
    recs = {}
    for mode in ("torch", "exact"):
        # the executor's gate checks every output byte against the reference before timing
        recs[mode] = ex.run(Case(**base, host_alloc=mode), policy())
        # same table, another kernel: reused, the same allocation's figures
        again = ex.run(Case(**base, host_alloc=mode, kernel="torch_uva"), policy())
        assert again["table_reused"] is True and recs[mode]["table_reused"] is False
        assert again["table_alloc_s"] == recs[mode]["table_alloc_s"]
    alloc = ex.table.backend.host_allocation
    mapping = alloc._mapping
    ex.release_table()
    assert alloc.freed and mapping.closed  # the run's own references are gone: unmapped at once
    for mode, rec in recs.items():
        assert set(results.HOST_ALLOC_KEYS) <= set(rec)
        assert rec["median_ms"] > 0 and rec["pinned_bytes"] == 0  # nothing pinned without CUDA
        assert rec["table_alloc_s"] >= 0 and rec["table_fill_s"] > 0
        assert rec["host_mem_free_before_bytes"] > 0 and rec["host_mem_free_after_bytes"] > 0
        assert "functional mode" in rec["host_alloc_note"]
    assert recs["exact"]["host_table_bytes"] == host_alloc.host_table_bytes(4096 * 160, "exact")
    assert "anonymous mapping" in recs["exact"]["host_alloc_note"]
    assert "torch.empty" in recs["torch"]["host_alloc_note"]
    device = CaseExecutor(device=torch.device("cpu")).run(Case(**{**base, "impl": "device"}), policy())
    assert "pinned_bytes" not in device  # only tables in host memory carry the fields


def test_device_backend_skips_exact_with_the_reason():
    ex = CaseExecutor(device=torch.device("cpu"))
    with pytest.raises(SkipCase, match="host_alloc=exact applies to tables in pinned host memory"):
        ex.run(Case(impl="device", vocab_size=4096, dim=16, host_alloc="exact"), policy())


def test_functional_memory_check_names_the_mode(monkeypatch):
    monkeypatch.setenv("PLE_BENCH_HOST_MEM_BYTES", str(1 * MiB))
    ex = CaseExecutor(device=torch.device("cpu"))
    with pytest.raises(SkipCase, match=r"host_alloc=exact: the table needs .* GiB of host memory"):
        ex.run(Case(impl="pinned_uva", vocab_size=1 << 16, dim=160, dtype="fp8", host_alloc="exact"), policy())


def test_unknown_mode_is_refused_by_the_backend():
    with pytest.raises(ValueError, match="host_alloc must be one of torch, exact, exact_huge"):
        PinnedUVAEmbedding(64, 16, host_alloc="mmap", device="cpu")


# ------------------------------------------------------------------ the exact path's registration
@pytest.mark.parametrize("mode", ["exact", "exact_huge"])
def test_exact_registers_the_table_and_unregisters_on_close(mode):
    fake = FakeRuntime()
    with host_alloc.use_runtime(fake):
        b = PinnedUVAEmbedding(5000, 64, dtype="bf16", host_alloc=mode, device="cpu")
    alloc = b.host_allocation
    ptr = b.weight.data_ptr()
    length = host_alloc.host_table_bytes(5056 * 64 * 2, mode)
    assert fake.registered == [(ptr, length, host_alloc.REGISTER_FLAGS)]
    assert alloc.pinned_bytes == length and "FakeRuntime" in alloc.note
    assert fake.unregistered == []
    mapping = alloc._mapping
    b.close()
    assert fake.unregistered == [ptr] and mapping.closed


def test_torch_mode_never_registers():
    fake = FakeRuntime()
    with host_alloc.use_runtime(fake):
        b = PinnedUVAEmbedding(5000, 64, dtype="bf16", host_alloc="torch", device="cpu")
        b.close()
    assert fake.registered == [] and fake.unregistered == []


def test_failed_registration_skips_the_case_and_frees_the_mapping(monkeypatch):
    fake = FakeRuntime(register_code=2)  # cudaErrorMemoryAllocation
    mappings = []
    real_mmap = mmap.mmap

    def spy(*args, **kwargs):
        m = real_mmap(*args, **kwargs)
        mappings.append(m)
        return m

    monkeypatch.setattr(host_alloc.mmap, "mmap", spy)
    ex = CaseExecutor(device=torch.device("cpu"))
    with host_alloc.use_runtime(fake), pytest.raises(SkipCase) as info:
        ex.run(Case(impl="pinned_uva", vocab_size=4096, dim=64, host_alloc="exact"), policy())
    assert "host_alloc=exact: cudaHostRegister" in str(info.value) and "cudaError 2" in str(info.value)
    assert len(fake.registered) == 1 and fake.unregistered == []  # nothing registered to undo
    assert len(mappings) == 1 and mappings[0].closed
    assert ex.table is None


def test_a_view_alive_at_close_keeps_the_mapping_until_dropped():
    fake = FakeRuntime()
    with host_alloc.use_runtime(fake):
        b = PinnedUVAEmbedding(1000, 32, dtype="fp32", host_alloc="exact", device="cpu")
    kept = b.weight  # e.g. a caller still holding the table
    alloc, mapping = b.host_allocation, b.host_allocation._mapping
    b.close()
    assert fake.unregistered == [kept.data_ptr()]  # unpinned at close either way
    assert not mapping.closed and "last tensor" in alloc.note
    kept.fill_(1.0)  # still valid host memory
    del kept


# ------------------------------------------------------------------ the axis
def test_case_id_gains_a_token_only_when_not_default():
    base = Case(impl="pinned_uva", vocab_size=1000)
    assert Case(impl="pinned_uva", vocab_size=1000, host_alloc="torch").case_id == base.case_id
    assert "host_alloc" not in base.changed_axes() and ".exact" not in base.case_id
    exact = Case(impl="pinned_uva", vocab_size=1000, host_alloc="exact")
    assert exact.case_id != base.case_id and ".exact-" in exact.case_id
    assert ".exact_huge-" in Case(impl="pinned_uva", vocab_size=1000, host_alloc="exact_huge").case_id


def _suite(tmp_path, value: str):
    path = tmp_path / "s.toml"
    path.write_text(f'[suite]\ndescription = "t"\n[[group]]\nimpl = "pinned_uva"\nhost_alloc = {value}\n')
    return path


def test_suite_axis_values(tmp_path):
    cases = load_suite(_suite(tmp_path, '["torch", "exact", "exact_huge"]')).cases
    assert [c.host_alloc for c in cases] == ["torch", "exact", "exact_huge"]
    with pytest.raises(SuiteError) as info:
        load_suite(_suite(tmp_path, '"cudaHostAlloc"'))
    msg = str(info.value)
    assert "key 'host_alloc'" in msg and "cudaHostAlloc" in msg and "torch, exact, exact_huge" in msg


def test_cli_exit_2_on_an_unknown_mode(tmp_path):
    from tests._cli import run_cli

    proc = run_cli("run", "--suite", str(_suite(tmp_path, '"pinned"')), "--results-dir", str(tmp_path / "res"),
                   cpu=True)
    assert proc.returncode == 2
    assert "host_alloc" in proc.stderr and "exact" in proc.stderr
    assert not (tmp_path / "res").exists()


def test_every_new_record_field_is_documented_with_a_unit():
    from ple_bench.record import BY_NAME

    for key in results.HOST_ALLOC_KEYS:  # documented in the record schema, with a unit where it has one
        assert key in BY_NAME and BY_NAME[key].definition, key
        if key.endswith(("_bytes", "_s")):
            assert BY_NAME[key].unit in ("B", "s"), key
    assert set(results.HOST_ALLOC_KEYS) <= set(results.RECORD_KEYS)
    # what the executor writes is exactly the documented set
    ex = CaseExecutor(device=torch.device("cpu"))
    ex.backend_for(Case(impl="pinned_uva", vocab_size=512, dim=16), *_single())
    assert set(ex.table_cost_fields()) == set(results.HOST_ALLOC_KEYS)
    ex.release_table()


def _single():
    from ple_bench.parallel import Groups, Topology

    return Topology(1, 1, 1), Groups.single()


def test_memory_check_uses_free_memory_for_one_rank_and_the_host_size_for_several(monkeypatch):
    import ple_bench.run.executor as executor_mod

    monkeypatch.delenv("PLE_BENCH_HOST_MEM_BYTES", raising=False)
    monkeypatch.setattr(executor_mod, "host_memory_bytes", lambda: 125 * GiB)
    monkeypatch.setattr(host_alloc, "mem_available_bytes", lambda: 10 * GiB)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (100 * GiB, 141 * GiB))
    case = Case(impl="pinned_uva", vocab_size=320_001_536, dim=160, dtype="fp8", host_alloc="exact")
    one = CaseExecutor(device=torch.device("cuda", 0))
    with pytest.raises(SkipCase, match=r"host_alloc=exact: the table needs 47\.7 GiB .* 10\.0 GiB available"):
        one._check_memory(case, PinnedUVAEmbedding, QWEN_BYTES)
    # two ranks decide on the same figure (the host's size), never on what one of them sees free
    two = CaseExecutor(world_size=2, device=torch.device("cuda", 0))
    two._check_memory(case, PinnedUVAEmbedding, QWEN_BYTES // 2)


# ------------------------------------------------------------------ torch's cached table block
TABLE_32G = 34_359_746_560  # the 32 GiB table's allocation (its padded rows): a 64 GiB block, as the 47.7 GiB one's


def _closed_torch_table(nbytes: int) -> None:
    """A pinned torch-mode table's allocation closed: its block goes back to torch's cache."""
    block = host_alloc.host_table_bytes(nbytes, "torch")
    assert block == 64 * GiB or nbytes != TABLE_32G
    host_alloc.HostAllocation("torch", nbytes, block, block).close()


@pytest.fixture
def torch_cache(monkeypatch):
    """torch's host statistics, faked: ``state['cached']`` bytes allocated and not active."""
    state = {"cached": 0, "active": 0, "known": True}

    def stats():
        if not state["known"]:
            return {}
        return {"allocated_bytes.current": state["cached"] + state["active"],
                "active_bytes.current": state["active"]}

    monkeypatch.setattr(host_alloc, "_torch_host_stats", stats)
    host_alloc._CACHED_TABLE_BLOCKS.clear()
    yield state
    host_alloc._CACHED_TABLE_BLOCKS.clear()


def test_a_closed_torch_tables_block_serves_a_table_of_its_size_class(torch_cache):
    """The 32 GiB table's 64 GiB block, closed and still cached, serves the 47.7 GiB table (the
    same power-of-two class); not a 100 GiB one, not when torch no longer holds it, not when
    its statistics are unknown, and not after the cached blocks are released."""
    assert not host_alloc.cached_table_block(QWEN_BYTES)  # nothing closed yet
    _closed_torch_table(TABLE_32G)
    torch_cache["cached"] = 64 * GiB
    assert host_alloc.cached_table_block(QWEN_BYTES)
    assert not host_alloc.cached_table_block(100 * GiB)  # a 128 GiB class
    assert not host_alloc.cached_table_block(20 * GiB)  # a 32 GiB class
    # freed with pending stream uses (the fill's non-blocking copies): active in torch's statistics
    # until torch retires the completed events, which it does before it looks for a free block
    torch_cache["cached"], torch_cache["active"] = 0, 64 * GiB
    assert host_alloc.cached_table_block(QWEN_BYTES)
    torch_cache["active"] = 0  # given back to the system behind the executor's back
    assert not host_alloc.cached_table_block(QWEN_BYTES)
    torch_cache.update(cached=64 * GiB, active=0, known=False)
    assert not host_alloc.cached_table_block(QWEN_BYTES)
    torch_cache["known"] = True
    assert host_alloc.cached_table_block(QWEN_BYTES)
    host_alloc.release_cached_pinned_blocks()
    assert not host_alloc.cached_table_block(QWEN_BYTES)


def test_exact_and_unpinned_closes_leave_no_cached_block(torch_cache):
    torch_cache["cached"] = 128 * GiB
    host_alloc.HostAllocation("exact", QWEN_BYTES, QWEN_BYTES, QWEN_BYTES).close()
    host_alloc.HostAllocation("torch", QWEN_BYTES, QWEN_BYTES, 0).close()  # functional mode: nothing pinned
    assert not host_alloc.cached_table_block(QWEN_BYTES)


def test_a_table_served_from_the_cache_takes_the_block(torch_cache, monkeypatch):
    """An allocation torch served from its cache (no new host block) takes the closed table's
    block: a second table of that class finds none left."""
    _closed_torch_table(TABLE_32G)
    torch_cache["cached"] = 64 * GiB
    real_empty = torch.empty
    monkeypatch.setattr(host_alloc.torch, "empty",
                        lambda *a, pin_memory=False, **k: real_empty(*a, **k))  # no CUDA to pin here
    monkeypatch.setattr(host_alloc, "_torch_host_stats",
                        lambda: {"num_host_alloc": 3, "allocated_bytes.current": 64 * GiB, "active_bytes.current": 0})
    _table, alloc = host_alloc._allocate_torch(4, 8, torch.uint8, QWEN_BYTES, pinned=True)
    assert alloc.from_cache is True
    assert not host_alloc.cached_table_block(QWEN_BYTES)


def test_memory_check_takes_the_cached_block_instead_of_releasing_it(torch_cache, monkeypatch):
    """One rank, the 32 GiB table's 64 GiB block cached, 58 GiB free: the 47.7 GiB torch table
    passes the check without giving the block back (it is pinned once for both tables); the
    exact table, a 100 GiB torch table, or two ranks go the old way (release, look again)."""
    import ple_bench.run.executor as executor_mod

    monkeypatch.delenv("PLE_BENCH_HOST_MEM_BYTES", raising=False)
    monkeypatch.setattr(executor_mod, "host_memory_bytes", lambda: 125 * GiB)
    monkeypatch.setattr(host_alloc, "mem_available_bytes", lambda: 58 * GiB)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (100 * GiB, 141 * GiB))
    released = []
    monkeypatch.setattr(host_alloc, "release_cached_pinned_blocks", lambda: released.append(1) or 0)
    _closed_torch_table(TABLE_32G)
    torch_cache["cached"] = 64 * GiB
    ex = CaseExecutor(device=torch.device("cuda", 0))
    torch_case = Case(impl="pinned_uva", vocab_size=320_001_536, dim=160, dtype="fp8", host_alloc="torch")
    ex._check_memory(torch_case, PinnedUVAEmbedding, QWEN_BYTES)  # fits: the cached block
    assert released == []
    big = Case(impl="pinned_uva", vocab_size=100 * GiB // 160, dim=160, dtype="fp8", host_alloc="torch")
    with pytest.raises(SkipCase, match="host_alloc=torch"):
        ex._check_memory(big, PinnedUVAEmbedding, big.table_bytes)
    assert released == [1]  # another size class: released, looked again, still too big
    two = CaseExecutor(world_size=2, device=torch.device("cuda", 0))
    monkeypatch.setattr(executor_mod, "host_memory_bytes", lambda: 60 * GiB)
    with pytest.raises(SkipCase):
        two._check_memory(torch_case, PinnedUVAEmbedding, QWEN_BYTES)
    assert released == [1, 1]
