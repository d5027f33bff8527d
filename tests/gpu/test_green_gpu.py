"""The ``sm_limit`` axis, green-context streams, on a CUDA GPU (was scripts/gpu/verify_green.py):
the SMs granted for 8, 16, 32, 66 SMs and the whole device by each way that exists here (torch's
GreenContext, cuda.bindings) are at least the request and at most the device's; work on the stream
is right; a stream with a priority; ``pinned_uva`` lookups on a 16-SM green stream bit-exact with
the output and the prefetch buffer poisoned; and the limit slows a matmul chain on that stream
more than threefold.  Skipped with the reason where no way to make a green context exists.

``python -m pytest -m gpu tests/gpu``; skipped with the reason elsewhere."""

from __future__ import annotations


import pytest
import torch

from ple_bench.backends.cuda import green
from ple_bench.backends.formats import int_view
from ple_bench.backends.pinned_uva import PinnedUVAEmbedding
from ple_bench.backends.synthetic import synthetic_rows
from tests.gpu._helpers import event_ms

pytestmark = pytest.mark.gpu

SEED = 11
DEV = torch.device("cuda", 0)


def _ways() -> list[str]:
    out = []
    if green.load_torch_green() is not None:
        out.append("torch")
    if green.load_driver() is not None:
        out.append("cuda.bindings")
    return out


@pytest.fixture(params=["default", "torch", "cuda.bindings"])
def way(request, monkeypatch):
    """Make ``green_stream`` use one way only (or its default choice), skipped where it is absent."""
    ways = _ways()
    if not ways:
        pytest.skip(f"no way to make a green context here: torch: {green.torch_green_note()}; "
                    "cuda.bindings: not importable or without green-context support")
    if request.param != "default":
        if request.param not in ways:
            pytest.skip(f"green contexts via {request.param} are not available here (found: {ways})")
        if request.param == "cuda.bindings":
            monkeypatch.setattr(green, "load_torch_green", lambda: None)
        else:
            monkeypatch.setattr(green, "load_driver", lambda: None)
    return request.param


def test_grants_are_at_least_the_request_and_the_stream_works(way):
    total = torch.cuda.get_device_properties(DEV).multi_processor_count
    for n in (8, 16, 32, 66, total):
        stream, handle = green.green_stream(DEV, n)
        try:
            x = torch.ones(1 << 20, device=DEV)
            with torch.cuda.stream(stream):
                y = x * 3.0
            torch.cuda.current_stream(DEV).wait_stream(stream)
            assert bool((y == 3.0).all()), f"{n} SMs via {handle.via}: wrong stream work"
        finally:
            handle.close()
        if handle.granted_sms is None:  # the torch way reads the grant back through cuda.bindings only
            assert handle.via == "torch" and green.load_driver() is None, handle.notes
        else:
            assert n <= handle.granted_sms <= total, f"{n} SMs via {handle.via}: granted {handle.granted_sms}"
        if way != "default":
            assert handle.via == way


def test_a_green_stream_with_a_priority():
    if "cuda.bindings" not in _ways():
        pytest.skip("stream priorities on green contexts are made via cuda.bindings, not importable here")
    stream, handle = green.green_stream(DEV, 16, priority=-1)
    handle.close()
    assert handle.via == "cuda.bindings" and handle.granted_sms is not None and handle.granted_sms >= 16


def _backend(kernel: str, sm_limit: int, tokens: int = 512, heads: int = 16, dim: int = 160):
    b = PinnedUVAEmbedding((64 << 20) // dim, dim, dtype="fp8", num_heads=heads, max_tokens=tokens, device=DEV,
                           kernel=kernel, sm_limit=sm_limit)
    b.fill_synthetic(SEED, scale=0.5)
    b.prepare_prefetch()
    return b


@pytest.mark.parametrize("kernel", ["triton_reference", "triton_tuned"])
def test_lookups_on_a_16_sm_green_stream_bit_exact(kernel):
    if not _ways():
        pytest.skip(f"no way to make a green context here: torch: {green.torch_green_note()}")
    gen = torch.Generator(device=DEV).manual_seed(5)
    b = _backend(kernel, 16)
    try:
        assert b.green_via in _ways()
        assert b.sm_limit_granted is None or b.sm_limit_granted >= 16
        out = torch.empty(512, 16 * 160, dtype=b.storage_dtype, device=DEV)
        for rep in range(3):
            ids = torch.randint(0, b.num_embeddings, (512, 16), device=DEV, generator=gen)
            want = synthetic_rows(ids.reshape(-1), 160, SEED, b.storage_dtype).reshape(512, -1).to(DEV)
            out.view(torch.uint8).fill_(0xFF)  # fp8 NaN
            b.prefetch_buffer.view(torch.uint8).fill_(0xFF)
            b.start_prefetch(ids)
            b.finalize(out=out)
            torch.cuda.synchronize(DEV)
            assert torch.equal(int_view(out), int_view(want)), f"id set {rep}"
    finally:
        b.close()



def test_the_limit_slows_a_matmul_chain(way):
    a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16) / 90.0
    bufs = [torch.empty_like(a), torch.empty_like(a)]

    def chain():
        x = a
        for i in range(4):
            torch.mm(x, w, out=bufs[i % 2])
            x = bufs[i % 2]

    gstream, handle = green.green_stream(DEV, 16)
    try:
        t_norm = event_ms(chain, 5, stream=torch.cuda.Stream(device=DEV), warmup=2)
        t_green = event_ms(chain, 3, stream=gstream, warmup=2)
    finally:
        torch.cuda.synchronize(DEV)
        handle.close()
    ratio = t_green / t_norm
    assert ratio > 3, (f"4 x 8192^3 bf16 matmuls: {t_norm:.2f} ms on a normal stream, {t_green:.2f} ms on a "
                       f"16-SM green stream via {handle.via} (granted {handle.granted_sms}): ratio {ratio:.2f}")
