"""The two storage backends (device, pinned_uva) on a CUDA GPU (was scripts/gpu/verify_backends.py):
lookups and start_prefetch/finalize bit-exact against ``synthetic_rows`` and a random full table,
poisoned outputs, int32 and int64 ids, every ETP rank's masked shard, the compiled Triton kernel
against ``torch_masked``, a pinned table past 4 GiB (byte offsets beyond 32 bits), prefetch
ordering under load, the prefetch buffer refused during graph capture, and the UVA view aliasing
the pinned host bytes.

``python -m pytest -m gpu tests/gpu``; skipped with the reason elsewhere."""

from __future__ import annotations

import gc
import math
import time

import pytest
import torch

from ple_bench.backends import DTYPES, get_backend, get_kernel, synthetic_rows
from ple_bench.backends.formats import int_view
from ple_bench.parallel import Groups, Topology
from tests._reference import assert_bytes_equal, bytes_of, full_lookup, masked_lookup, poisoned, random_table

pytestmark = pytest.mark.gpu

BACKENDS = ("device", "pinned_uva")
DTYPE_NAMES = ("fp32", "bf16", "fp16", "fp8")
DEV = torch.device("cuda", 0)


def ids_on(tokens: int, heads: int, num_rows: int, seed: int, dtype=torch.int64) -> torch.Tensor:
    """[tokens, heads] ids on the GPU, head h in its own range of the table, first and last rows included."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    bounds = [h * num_rows // heads for h in range(heads + 1)]
    cols = [torch.randint(bounds[h], max(bounds[h + 1], bounds[h] + 1), (tokens,), generator=gen, device=DEV)
            for h in range(heads)]
    ids = torch.stack(cols, 1) if tokens else torch.empty(0, heads, dtype=torch.int64, device=DEV)
    if tokens * heads >= 2:
        ids[0, 0] = 0
        ids[-1, -1] = num_rows - 1
    return ids.to(dtype)


def synthetic_expected(ids, dim, seed, dtype):
    return synthetic_rows(ids.reshape(-1).long(), dim, seed, dtype).reshape(ids.shape[0], ids.shape[1] * dim)


@pytest.mark.parametrize("dtype_name", DTYPE_NAMES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_lookup_and_prefetch_bit_exact(backend, dtype_name):
    dtype = DTYPES[dtype_name]
    for num, dim, heads, padding in [(100_003, 160, 1, 64), (20_011, 37, 3, 7)]:
        emb = get_backend(backend)(num, dim, dtype=dtype_name, num_heads=heads, max_tokens=512,
                                   padding_size=padding, device=DEV)
        assert emb.table_for_kernel().device.type == "cuda"
        emb.fill_synthetic(seed=3, scale=0.5 if dtype_name == "fp8" else None)
        emb.check_loaded()
        for step, tokens in enumerate([1, 7, 512, 100, 0]):
            ids = ids_on(tokens, heads, num, seed=step, dtype=torch.int32 if step % 2 else torch.int64)
            expected = synthetic_expected(ids, dim, 3, dtype)
            assert_bytes_equal(emb.lookup(ids), expected, f"synthetic lookup {tokens} tokens")
            emb.start_prefetch(ids)
            out = poisoned(expected.shape, dtype, DEV)
            assert emb.finalize(out=out) is out
            assert_bytes_equal(out, expected, f"synthetic prefetch {tokens} tokens")
            emb.start_prefetch(ids)
            assert_bytes_equal(emb.finalize(), expected, f"synthetic prefetch (no out) {tokens}")
        # random content (-0.0 included), loaded from a host table
        full = random_table(num, dim, dtype, seed=num)
        emb.load_full_table(full, scale=0.25 if dtype_name == "fp8" else None)
        full_dev = full.to(DEV)
        for step, tokens in enumerate([300, 5]):
            ids = ids_on(tokens, heads, num, seed=10 + step)
            expected = full_lookup(full_dev, ids)
            assert_bytes_equal(emb.lookup(ids), expected, f"random lookup {tokens}")
            emb.start_prefetch(ids)
            out = poisoned(expected.shape, dtype, DEV)
            assert_bytes_equal(emb.finalize(out=out), expected, f"random prefetch {tokens}")
        if dtype_name == "fp8":
            acts = emb.dequantize(expected, torch.bfloat16)
            assert_bytes_equal(acts, (expected.double() * 0.25).to(torch.bfloat16), "fp8 dequantize")
        emb.close()


@pytest.mark.parametrize("dtype_name", ["fp8", "bf16"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_etp_rank_looks_up_its_shard(backend, dtype_name):
    """Each rank of an ETP group, built for its rank in this one process: its masked lookup is its
    shard of the full table, zero bytes elsewhere, and the integer sum over the ranks is the full lookup."""
    dtype = DTYPES[dtype_name]
    num, dim, heads = 70_001, 24, 2
    full = random_table(num, dim, dtype, seed=5)
    full_dev = full.to(DEV)
    for topo in (Topology(1, 4, 4), Topology(2, 4, 2), Topology(1, 8, 8)):
        ids = ids_on(257, heads, num, seed=topo.etp)
        total = torch.zeros(ids.numel() * dim * dtype.itemsize, dtype=torch.int8, device=DEV)
        for rank in topo.etp_group_ranks(0):
            emb = get_backend(backend)(num, dim, dtype=dtype_name, num_heads=heads, device=DEV,
                                       groups=Groups(topology=topo, rank=rank))
            emb.load_full_table(full)
            s = emb.shard
            out = poisoned((ids.shape[0], heads, dim), dtype, DEV)
            emb.local_lookup(ids, out=out)
            assert_bytes_equal(out, masked_lookup(full_dev, ids, s.vocab_start, s.vocab_end),
                               f"{topo.as_dict()} rank {rank}")
            total += bytes_of(out).view(torch.int8)
            emb.close()
        assert torch.equal(total, bytes_of(full_lookup(full_dev, ids)).view(torch.int8)), \
            f"{topo.as_dict()}: integer sum over ETP ranks differs from the full lookup"


@pytest.mark.parametrize("dtype_name", DTYPE_NAMES)
def test_compiled_triton_kernel_equals_torch_masked(dtype_name):
    dtype = DTYPES[dtype_name]
    for dim in (1, 37, 160, 1280):
        rows, start = 1000, 3000
        shard = random_table(rows, dim, dtype, seed=dim).to(DEV)
        ids = torch.cat([torch.randint(0, 6000, (4000,), device=DEV),
                         torch.tensor([0, start - 1, start, start + rows - 1, start + rows], device=DEV)])
        ref = masked_lookup(shard, ids.reshape(-1, 1) - start, 0, rows).reshape(-1, dim)
        for name in ("torch_masked", "triton_reference"):
            out = poisoned((ids.numel(), dim), dtype, DEV)
            get_kernel(name)(int_view(shard), ids, int_view(out), start, start + rows)
            assert_bytes_equal(out, ref, f"{name} {dtype_name} dim {dim}")


def _free_host_cache():
    gc.collect()
    torch.cuda.empty_cache()
    empty_host = getattr(torch._C, "_host_emptyCache", None)
    if empty_host is not None:
        empty_host()


@pytest.mark.parametrize("backend", BACKENDS)
def test_table_past_4_gib_reads_its_last_rows(backend):
    """Byte offsets beyond 32 bits: a 4.5 GiB fp8 table, its first and last 64 rows looked up."""
    gib, dim, heads, seed = 4.5, 160, 16, 21
    rows = math.ceil(gib * 2**30 / dim)
    emb = get_backend(backend)(rows, dim, dtype="fp8", num_heads=heads, max_tokens=4096, device=DEV)
    try:
        assert emb.table_bytes >= gib * 2**30
        if backend == "pinned_uva":
            assert emb.weight.is_pinned() and emb.table_for_kernel().device.type == "cuda"
        emb.fill_synthetic(seed, scale=1.0)
        for step, tokens in enumerate([4096, 1, 333]):
            ids = ids_on(tokens, heads, rows, seed=step)
            if tokens > 64:
                ids[:64, -1] = torch.arange(rows - 64, rows, device=DEV)
                ids[:64, 0] = torch.arange(64, device=DEV)
            expected = synthetic_expected(ids, dim, seed, torch.float8_e4m3fn)
            assert_bytes_equal(emb.lookup(ids), expected, f"{backend} lookup {tokens}")
            emb.start_prefetch(ids)
            out = poisoned(expected.shape, torch.float8_e4m3fn, DEV)
            assert_bytes_equal(emb.finalize(out=out), expected, f"{backend} prefetch {tokens}")
    finally:
        emb.close()
        del emb
        _free_host_cache()


def test_prefetch_sees_ids_written_by_the_main_stream_under_load():
    """ids written by the main stream after a long matmul chain; the side-stream lookup must see
    them (it waits for the main stream), also when the caller drops its ids tensor at once."""
    num, dim, heads, seed = 1_000_003, 160, 4, 9
    emb = get_backend("pinned_uva")(num, dim, dtype="fp8", num_heads=heads, max_tokens=4096, device=DEV)
    emb.fill_synthetic(seed, scale=1.0)
    a = torch.randn(4096, 4096, device=DEV, dtype=torch.bfloat16) / 128.0

    def busy(n):
        x = a
        for _ in range(n):
            x = x @ a
        return x

    busy(2)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    busy(20)
    torch.cuda.synchronize()
    per = (time.perf_counter() - t0) / 20
    chain = max(20, int(0.040 / max(per, 1e-6)))  # ~40 ms of main-stream work
    for rep, tokens in enumerate([1, 7, 64, 256, 1000, 4096, 33, 2048]):
        truth = ids_on(tokens, heads, num, seed=100 + rep)
        stale = (truth + 1) % num  # every stale id names another row
        ids_buf = stale.clone()
        torch.cuda.synchronize()
        busy(chain)
        ids_buf.copy_(truth)  # on the main stream, after the busy work
        if rep % 2:
            temp = ids_buf.clone()  # a temporary the caller drops right away
            emb.start_prefetch(temp)
            del temp
            junk = torch.empty_like(ids_buf)
            junk.copy_(stale)  # may reuse the block if the prefetch did not keep it
        else:
            emb.start_prefetch(ids_buf)
        busy(chain // 4)
        out = poisoned((tokens, heads * dim), torch.float8_e4m3fn, DEV)
        emb.finalize(out=out)
        assert_bytes_equal(out, synthetic_expected(truth, dim, seed, torch.float8_e4m3fn),
                           f"prefetch under load, rep {rep}, {tokens} tokens")
    emb.close()


def test_prefetch_buffer_allocation_refused_during_graph_capture():
    emb = get_backend("pinned_uva")(1000, 16, dtype="bf16", max_tokens=8, device=DEV)
    emb.fill_synthetic(1)
    ids = ids_on(4, 1, 1000, seed=0)
    graph = torch.cuda.CUDAGraph()
    x = torch.zeros(4, device=DEV)
    errors = []
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        x.add_(1)
        for call in (emb.prepare_prefetch, lambda: emb.start_prefetch(ids)):
            with pytest.raises(RuntimeError) as info:
                call()
            errors.append(str(info.value))
    assert all("before cudagraph capture" in msg for msg in errors), errors
    assert emb.prefetch_buffer is None, "a buffer was allocated during capture"
    emb.prepare_prefetch()  # eagerly it works, and the lookup is right
    emb.start_prefetch(ids)
    assert_bytes_equal(emb.finalize(), synthetic_expected(ids, 16, 1, torch.bfloat16), "after capture")
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(x, torch.ones_like(x)), "the captured work replays once"
    emb.close()


def test_uva_view_aliases_the_pinned_host_bytes():
    from ple_bench.backends.cuda.uva import cuda_view_of_pinned

    host = torch.randint(1, 100, (1 << 20,), dtype=torch.int32).pin_memory()
    view = cuda_view_of_pinned(host, DEV)
    assert view.device.type == "cuda" and view.data_ptr() == host.data_ptr() and view.shape == host.shape
    host[12345] = -77  # host write, GPU read
    assert int(view[12345].item()) == -77
    assert torch.equal(view.cpu(), host)
    view[54321:54330].fill_(-5)  # GPU write, host read
    torch.cuda.synchronize()
    assert bool((host[54321:54330] == -5).all())
    emb = get_backend("pinned_uva")(5000, 32, dtype="fp16", device=DEV)
    emb.fill_synthetic(2)
    uva = emb.table_for_kernel()
    assert uva.device.type == "cuda" and uva.data_ptr() == emb.weight.data_ptr() and emb.weight.is_pinned()
    emb.weight[4321].fill_(3.5)
    ids = torch.tensor([[4321], [4320]], device=DEV)
    rows = emb.lookup(ids)
    assert bool((rows[0] == 3.5).all()), "a host write was not seen by the UVA lookup"
    assert_bytes_equal(rows[1:], synthetic_expected(ids[1:], 32, 2, torch.float16), "untouched row")
    emb.close()
