"""pinned_copy_engine against the full-table reference, on the CPU: every copy
mechanism x dtype x shard position, poisoned outputs, lookup and
prefetch/finalize.  ``memcpy_batch`` / ``memcpy_loop`` run through a fake
``cuda.bindings.runtime`` whose copies are real host ``memmove``s of the
addresses the backend computed, so the address lists, the call signatures
(12.8-style ``(err, failIdx)`` and 13.x-style ``(err,)`` results) and the
dispatch are checked without a GPU; the real bindings and copy engines are
checked by tests/gpu/test_copy_engine_gpu.py."""

from __future__ import annotations

import ctypes
import types

import pytest
import torch

from ple_bench.backends import pinned_copy_engine as ce
from ple_bench.backends.pinned_copy_engine import PinnedCopyEngineEmbedding
from ple_bench.backends.formats import DTYPES
from ple_bench.backends.registry import backend_names, get_backend
from ple_bench.parallel import Groups, Topology
from tests._reference import assert_bytes_equal, masked_lookup, poisoned, random_table

VOCAB = 1000  # padded to 1024: the last ETP=4 shard is partial (rows 768..999)
DIM = 40
HEADS = 2
SHARDS = [
    ("single", Topology(), 0),
    ("etp4_r0", Topology(tp=1, etp=4, dp=4), 0),
    ("etp4_r2", Topology(tp=1, etp=4, dp=4), 2),
    ("etp4_r3", Topology(tp=1, etp=4, dp=4), 3),
]
MECHS = ["cpu_functional", "torch_row_copies", "memcpy_batch", "memcpy_loop", "memcpy_batch_v12",
         "memcpy_batch_raw"]


class FakeRawBatch:
    """The raw ``cudaMemcpyBatchAsync(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs,
    stream)``: reads the address arrays from memory as the C function would, copies
    with memmove, and checks the attributes struct."""

    def __init__(self):
        self.calls: list[int] = []

    def __call__(self, dsts, srcs, sizes, count, attrs, idxs, num_attrs, stream):
        a = ce.MemcpyAttributes.from_address(attrs)
        assert (a.srcAccessOrder, a.flags, num_attrs) == (1, 1, 1)
        assert ctypes.c_size_t.from_address(idxs).value == 0
        d = (ctypes.c_int64 * count).from_address(dsts)
        s = (ctypes.c_int64 * count).from_address(srcs)
        n = (ctypes.c_int64 * count).from_address(sizes)
        for i in range(count):
            ctypes.memmove(d[i], s[i], n[i])
        self.calls.append(count)
        return 0


class FakeRuntime(types.SimpleNamespace):
    """The parts of ``cuda.bindings.runtime`` the backend uses; copies are host memmoves."""

    def __init__(self, version: int = 13000, batch: bool = True, fail: bool = False):
        ok = 0
        super().__init__(
            cudaError_t=types.SimpleNamespace(cudaSuccess=ok, cudaErrorInvalidValue=1),
            cudaMemcpyKind=types.SimpleNamespace(cudaMemcpyHostToDevice=1),
            cudaMemcpySrcAccessOrder=types.SimpleNamespace(cudaMemcpySrcAccessOrderStream=1),
            cudaMemcpyFlags=types.SimpleNamespace(cudaMemcpyFlagPreferOverlapWithCompute=1),
            cudaMemcpyAttributes=lambda: types.SimpleNamespace(srcAccessOrder=0, flags=0),
            cudaStream_t=lambda handle: ("stream", int(handle)),
            cudaRuntimeGetVersion=lambda: (ok, version),
            cudaDriverGetVersion=lambda: (ok, version),
        )
        self.version, self.fail = version, fail
        self.batch_calls: list[int] = []
        self.loop_calls = 0
        if batch:
            self.cudaMemcpyBatchAsync = self._batch

    def _batch(self, dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, stream):
        assert count == len(dsts) == len(srcs) == len(sizes) > 0
        assert (len(attrs), list(attrs_idxs), num_attrs) == (1, [0], 1)
        assert attrs[0].srcAccessOrder == 1 and attrs[0].flags == 1 and stream[0] == "stream"
        if self.fail:
            return (1, 3) if self.version < 13000 else (1,)
        self.batch_calls.append(count)
        for d, s, n in zip(dsts, srcs, sizes):
            ctypes.memmove(d, s, n)
        return (0, 0) if self.version < 13000 else (0,)

    def cudaMemcpyAsync(self, dst, src, nbytes, kind, stream):
        assert kind == 1 and stream[0] == "stream"
        if self.fail:
            return (1,)
        self.loop_calls += 1
        ctypes.memmove(dst, src, nbytes)
        return (0,)


def build(mech: str, dtype: str, topo: Topology = Topology(), rank: int = 0, monkeypatch=None, **kw):
    forced = {"memcpy_batch_v12": "memcpy_batch"}.get(mech, mech)
    rt = None
    if forced == "memcpy_batch_raw":
        rt = FakeRawBatch()
        monkeypatch.setattr(ce, "load_raw_batch", lambda: (rt, ""))
    elif forced.startswith("memcpy"):
        rt = FakeRuntime(version=12080 if mech.endswith("v12") else 13000)
        monkeypatch.setattr(ce, "load_runtime", lambda: rt)
    b = PinnedCopyEngineEmbedding(VOCAB, DIM, dtype=dtype, num_heads=HEADS, max_tokens=24, padding_size=64,
                                  groups=Groups(topology=topo, rank=rank), device="cpu",
                                  copy_mechanism=forced, **kw)
    assert b.copy_mechanism == forced and b.functional
    return b, rt


def make_ids(n_tokens: int, start: int, end: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (n_tokens, HEADS), generator=g)
    edges = [0, VOCAB - 1, start, max(start, end - 1), min(end, VOCAB - 1)]
    ids.view(-1)[: len(edges)] = torch.tensor(edges)
    ids.view(-1)[-3:] = ids.view(-1)[5]  # a few repeats
    return ids


@pytest.mark.parametrize("shard", SHARDS, ids=[s[0] for s in SHARDS])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("mech", MECHS)
def test_local_lookup_matches_reference(mech, dtype, shard, monkeypatch):
    _, topo, rank = shard
    b, rt = build(mech, dtype, topo, rank, monkeypatch)
    full = random_table(VOCAB, DIM, b.storage_dtype, seed=11 + rank)
    b.load_full_table(full)
    s = b.shard
    ids = make_ids(24, s.vocab_start, s.vocab_end, seed=rank + 7)
    out = poisoned((24, HEADS, DIM), b.storage_dtype)
    before = b.host_thread_s
    assert b.local_lookup(ids, out=out) is out
    assert_bytes_equal(out, masked_lookup(full, ids, s.vocab_start, s.vocab_end), f"{mech} {dtype} {shard[0]}")
    owned = int(((ids >= s.vocab_start) & (ids < s.vocab_end)).sum())
    assert b.last_copies == owned  # one copy per owned id, none for the others
    assert owned > 0 and (owned < ids.numel() or topo.etp == 1)
    if isinstance(rt, FakeRawBatch):  # the copies really went through the raw call
        assert sum(rt.calls) == owned
    elif rt is not None:  # the copies really went through the bindings
        assert sum(rt.batch_calls) + rt.loop_calls == owned
    assert b.host_thread_s >= before


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("mech", MECHS)
def test_lookup_and_prefetch_full_api(mech, dtype, monkeypatch):
    """lookup and start_prefetch/finalize on a single rank and a TP=ETP=4 rank
    (no DP replicas: no process group needed, the reduce is skipped)."""
    for topo, rank in ((Topology(), 0), (Topology(tp=4, etp=4, dp=1), 1)):
        b, _ = build(mech, dtype, topo, rank, monkeypatch)
        full = random_table(VOCAB, DIM, b.storage_dtype, seed=5)
        b.load_full_table(full)
        s = b.shard
        ids = make_ids(20, s.vocab_start, s.vocab_end, seed=3)
        want = masked_lookup(full, ids, s.vocab_start, s.vocab_end).reshape(20, HEADS * DIM)
        assert_bytes_equal(b.lookup(ids), want, "lookup")
        b.start_prefetch(make_ids(20, s.vocab_start, s.vocab_end, seed=4))
        b.start_prefetch(ids)  # the unfinished first prefetch is dropped, not mixed in
        out = poisoned((20, HEADS * DIM), b.storage_dtype)
        assert b.finalize(out) is out
        assert_bytes_equal(out, want, "prefetch/finalize")
        with pytest.raises(RuntimeError):
            b.finalize()
        b.start_prefetch(ids[:7])
        assert_bytes_equal(b.finalize(), want[:7], "shorter prefetch")
        with pytest.raises(ValueError):
            b.start_prefetch(make_ids(25, 0, VOCAB, seed=3))  # larger than max_tokens
        b.close()


def test_prefetch_rewrites_a_poisoned_buffer_and_counts_host_time(monkeypatch):
    b, _ = build("memcpy_batch", "fp8", Topology(tp=4, etp=4, dp=1), 3, monkeypatch)
    full = random_table(VOCAB, DIM, b.storage_dtype, seed=2)
    b.load_full_table(full)
    s = b.shard
    ids = make_ids(24, s.vocab_start, s.vocab_end, seed=9)
    b.prepare_prefetch().view(torch.uint8).fill_(0x7F)
    before = b.host_thread_s
    b.start_prefetch(ids)
    got = b.finalize()
    assert_bytes_equal(got, masked_lookup(full, ids, s.vocab_start, s.vocab_end).reshape(24, -1), "poisoned buffer")
    assert b.host_thread_s > before  # the worker's address list and issue are counted


def test_all_owned_ids_skip_the_memset_and_chunk_the_batch(monkeypatch):
    monkeypatch.setattr(ce, "BATCH_CHUNK", 7)
    b, rt = build("memcpy_batch", "bf16", monkeypatch=monkeypatch)
    full = random_table(VOCAB, DIM, b.storage_dtype, seed=8)
    b.load_full_table(full)
    ids = make_ids(12, 0, VOCAB, seed=1)  # 24 ids, all owned on a single rank
    out = poisoned((12, HEADS, DIM), b.storage_dtype)
    zeroed = []
    real_zero = torch.Tensor.zero_
    monkeypatch.setattr(torch.Tensor, "zero_", lambda t: zeroed.append(t.shape) or real_zero(t))
    b.local_lookup(ids, out=out)
    assert_bytes_equal(out, masked_lookup(full, ids, 0, VOCAB), "chunked batch")
    assert rt.batch_calls == [7, 7, 7, 3] and not zeroed


def test_no_owned_ids_copy_nothing(monkeypatch):
    b, rt = build("memcpy_loop", "fp32", Topology(tp=4, etp=4, dp=1), 0, monkeypatch)
    b.load_full_table(random_table(VOCAB, DIM, b.storage_dtype, seed=1))
    ids = torch.tensor([[300, 999], [500, 256]])  # none in rows 0..255
    out = b.local_lookup(ids, out=poisoned((2, HEADS, DIM), b.storage_dtype))
    assert bool((out.view(torch.uint8) == 0).all()) and rt.loop_calls == 0 and b.last_copies == 0


@pytest.mark.parametrize("version", [12080, 13000])
@pytest.mark.parametrize("mech", ["memcpy_batch", "memcpy_loop"])
def test_binding_errors_surface(mech, version, monkeypatch):
    rt = FakeRuntime(version=version, fail=True)
    monkeypatch.setattr(ce, "load_runtime", lambda: rt)
    b = PinnedCopyEngineEmbedding(VOCAB, 8, dtype="fp16", max_tokens=4, device="cpu", copy_mechanism=mech)
    b.load_full_table(random_table(VOCAB, 8, b.storage_dtype, seed=1))
    with pytest.raises(RuntimeError, match="cudaMemcpy"):
        b.lookup(torch.tensor([[1], [2]]))
    b.start_prefetch(torch.tensor([[1], [2]]))
    with pytest.raises(RuntimeError, match="cudaMemcpy"):
        b.finalize()


def test_mechanism_choice(monkeypatch):
    assert ce.candidate_mechanisms(None)[0] == ["torch_row_copies"]
    assert "cuda-bindings" in ce.candidate_mechanisms(None)[1][0]
    assert ce.candidate_mechanisms(FakeRuntime(13000))[0] == ["memcpy_batch", "memcpy_loop", "torch_row_copies"]
    assert ce.candidate_mechanisms(FakeRuntime(12080))[0][0] == "memcpy_batch"
    old, notes = ce.candidate_mechanisms(FakeRuntime(12060))
    assert old == ["memcpy_loop", "torch_row_copies"] and "12.8" in notes[0]
    nobatch, notes = ce.candidate_mechanisms(FakeRuntime(13000, batch=False))
    assert nobatch[0] == "memcpy_loop" and "no cudaMemcpyBatchAsync" in notes[0]
    info = ce.bindings_info(FakeRuntime(12090))
    assert info["runtime_version"] == info["driver_version"] == 12090 and info["has_memcpy_batch"]
    assert ce.bindings_info(FakeRuntime(12090, batch=False))["has_memcpy_batch"] is False
    # on the CPU "auto" is the functional mechanism; a bad name or missing bindings are refused
    b = PinnedCopyEngineEmbedding(VOCAB, 8, dtype="bf16", device="cpu")
    assert b.copy_mechanism == "cpu_functional"
    with pytest.raises(ValueError, match="copy_mechanism"):
        PinnedCopyEngineEmbedding(VOCAB, 8, device="cpu", copy_mechanism="dma")
    monkeypatch.setattr(ce, "load_runtime", lambda: None)
    with pytest.raises(RuntimeError, match="cuda-bindings"):
        PinnedCopyEngineEmbedding(VOCAB, 8, device="cpu", copy_mechanism="memcpy_batch")
    monkeypatch.setattr(ce, "load_runtime", lambda: FakeRuntime(13000, batch=False))
    with pytest.raises(RuntimeError, match="cudaMemcpyBatchAsync"):
        PinnedCopyEngineEmbedding(VOCAB, 8, device="cpu", copy_mechanism="memcpy_batch")


def test_raw_batch_is_chosen_first_and_splits_large_batches(monkeypatch):
    assert ce.candidate_mechanisms(FakeRuntime(13000), "")[0][:2] == ["memcpy_batch_raw", "memcpy_batch"]
    lst, notes = ce.candidate_mechanisms(None, "no libcudart loaded in this process")
    assert lst == ["torch_row_copies"] and "memcpy_batch_raw: no libcudart" in notes[0]
    monkeypatch.setattr(ce, "BATCH_CHUNK", 7)
    b, raw = build("memcpy_batch_raw", "fp8", monkeypatch=monkeypatch)
    full = random_table(VOCAB, DIM, b.storage_dtype, seed=4)
    b.load_full_table(full)
    ids = make_ids(10, 0, VOCAB, seed=8)
    assert_bytes_equal(b.lookup(ids), masked_lookup(full, ids, 0, VOCAB).reshape(10, -1))
    assert raw.calls == [7, 7, 6]  # 20 copies in chunks of 7
    monkeypatch.setattr(ce, "load_raw_batch", lambda: (None, "no libcudart loaded in this process"))
    with pytest.raises(RuntimeError, match="memcpy_batch_raw"):
        PinnedCopyEngineEmbedding(VOCAB, 8, device="cpu", copy_mechanism="memcpy_batch_raw")


def test_copy_addresses():
    positions, local = ce.copy_plan(torch.tensor([5, 100, 7, 99, 5]), 5, 100)
    assert positions.tolist() == [0, 2, 3, 4] and local.tolist() == [0, 2, 94, 0]
    dsts, srcs = ce.copy_addresses(positions, local, 160, table_ptr=1 << 40, dest_ptr=4096)
    assert dsts == [4096, 4096 + 320, 4096 + 480, 4096 + 640]
    assert srcs == [1 << 40, (1 << 40) + 320, (1 << 40) + 94 * 160, 1 << 40]


def test_worker_errors_surface_and_registry():
    b = PinnedCopyEngineEmbedding(VOCAB, 8, dtype="fp32", max_tokens=4, device="cpu")
    b.load_full_table(random_table(VOCAB, 8, torch.float32, seed=1))

    def boom(*a, **k):
        raise RuntimeError("issue failed")

    b._issue = boom
    b.start_prefetch(torch.tensor([[1], [2]]))
    with pytest.raises(RuntimeError, match="issue failed"):
        b.finalize()
    assert "pinned_copy_engine" in backend_names()
    assert get_backend("pinned_copy_engine") is PinnedCopyEngineEmbedding
