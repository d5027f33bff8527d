"""The per-backend grid cap (``grid_cap``, set by the ``grid_frac`` axis) on a CUDA GPU
(was scripts/gpu/verify_grid_cap.py): for each grid-capped path (``pinned_uva`` with
``triton_tuned`` and ``dedup_triton``, ``device`` with ``triton_tuned``, ``pinned_hot_cache``),
a 640 MiB fp8 dim-160 table, 16 heads, 512 tokens of random ids:

1. ``lookup`` and ``start_prefetch`` + ``finalize`` (output and prefetch buffer poisoned)
   bit-exact against ``synthetic_rows`` with ``grid_cap`` None, 1, 8 and the ``grid_frac=0.25``
   cap of this GPU;
2. the cap reaches the kernel: a lookup capped at 1 program is > 2x slower than an uncapped one;
3. the engine's ``grid_frac`` sets this backend's ``grid_cap`` and restores it, and never touches
   ``fast_kernels``' process-wide default;
4. a second backend of the same shape is not capped by the first one's cap.

``python -m pytest -m gpu tests/gpu``; skipped with the reason elsewhere."""

from __future__ import annotations

import types

import pytest
import torch

from ple_bench.run import executor
from ple_bench.backends import fast_kernels, get_backend, synthetic_rows
from tests.gpu._helpers import event_ms

pytestmark = pytest.mark.gpu

SEED = 77
VOCAB = 4 << 20
DIM, HEADS, TOKENS = 160, 16, 512
PATHS = [
    ("pinned_uva", "triton_tuned", {}),
    ("pinned_uva", "dedup_triton", {}),
    ("device", "triton_tuned", {}),
    ("pinned_hot_cache", "triton_tuned", {"cache_rows": 1 << 16}),
]


@pytest.mark.parametrize("impl,kernel,kwargs", PATHS, ids=[f"{i}-{k}" for i, k, _ in PATHS])
def test_grid_cap_is_exact_reaches_the_kernel_and_is_restored(impl, kernel, kwargs):
    dev = torch.device("cuda", torch.cuda.current_device())
    quarter = fast_kernels.max_programs_for_grid_frac(0.25, dev)
    gen = torch.Generator(device=dev)
    gen.manual_seed(SEED)
    global_before = fast_kernels.get_max_programs()
    b = get_backend(impl)(VOCAB, DIM, dtype="fp8", num_heads=HEADS, max_tokens=TOKENS, device=dev,
                          kernel=kernel, **kwargs)
    try:
        b.fill_synthetic(SEED, scale=0.5)
        ids = torch.randint(0, VOCAB, (TOKENS, HEADS), device=dev, generator=gen)
        if type(b).warms_cache:
            b.warm_cache(ids[: TOKENS // 2])  # about half the ids hit
        want = synthetic_rows(ids.reshape(-1), DIM, SEED, b.storage_dtype).reshape(TOKENS, -1).to(dev)
        assert b.supports_grid_cap, f"kernel {b.kernel_name}"
        for cap in (None, 1, 8, quarter):
            b.grid_cap = cap
            assert torch.equal(b.lookup(ids).view(torch.uint8), want.view(torch.uint8)), f"lookup, cap {cap}"
            out = torch.empty_like(want)
            out.view(torch.uint8).fill_(0xFF)
            if b.prefetch_buffer is not None:
                b.prefetch_buffer.view(torch.uint8).fill_(0xFF)
            b.start_prefetch(ids)
            b.finalize(out=out)
            torch.cuda.synchronize(dev)
            assert torch.equal(out.view(torch.uint8), want.view(torch.uint8)), f"prefetch, cap {cap}"
        b.grid_cap = None
        free_ms = event_ms(lambda: b.lookup(ids))
        b.grid_cap = 1
        one_ms = event_ms(lambda: b.lookup(ids))
        assert one_ms > 2 * free_ms, f"uncapped {free_ms:.4f} ms, grid_cap=1 {one_ms:.4f} ms"
        b.grid_cap = None
        with executor.case_grid_cap(types.SimpleNamespace(grid_frac=0.25), b):
            inside = (b.grid_cap, fast_kernels.get_max_programs())
        assert inside == (quarter, global_before)
        assert b.grid_cap is None and fast_kernels.get_max_programs() == global_before
    finally:
        b.close()


def test_grid_cap_is_per_backend():
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=dev)
    gen.manual_seed(SEED + 1)
    capped = get_backend("device")(VOCAB, DIM, dtype="fp8", num_heads=HEADS, device=dev, kernel="triton_tuned")
    free = get_backend("device")(VOCAB, DIM, dtype="fp8", num_heads=HEADS, device=dev, kernel="triton_tuned")
    try:
        for x in (capped, free):
            x.fill_synthetic(SEED, scale=0.5)
        ids = torch.randint(0, VOCAB, (TOKENS, HEADS), device=dev, generator=gen)
        capped.grid_cap = 1
        free_ms = event_ms(lambda: free.lookup(ids))
        one_ms = event_ms(lambda: capped.lookup(ids))
        assert one_ms > 2 * free_ms, f"uncapped backend {free_ms:.4f} ms beside a grid_cap=1 backend {one_ms:.4f} ms"
    finally:
        capped.close()
        free.close()
