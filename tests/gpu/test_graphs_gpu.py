"""The breakable CUDA graph and the synthetic decode step on a CUDA GPU (was
scripts/gpu/verify_graphs.py): breakable replays of the step give the reference embeddings and the
eager output for fresh ids copied into the static input; two tables in one breakable graph each
read their own table; the prefetch buffer's allocation during a capture is refused and leaves no
capture open; full-graph steps on one rank; a short step measurement gives finite figures.

``python -m pytest -m gpu tests/gpu``; skipped with the reason elsewhere."""

from __future__ import annotations

import math

import pytest
import torch

from ple_bench.backends import get_backend, synthetic_rows
from ple_bench.spec.case import Case
from ple_bench.run.graphs import BreakableGraph, eager_break
from ple_bench.run.step import DecodeStep, check_step, run_step_case

pytestmark = pytest.mark.gpu

DIM, HEADS, TOKENS = 160, 16, 256
FP8_SCALE = 0.5
DEV = torch.device("cuda", 0)


def make_backend(impl: str, vocab: int, seed: int):
    b = get_backend(impl)(vocab, DIM, dtype="fp8", num_heads=HEADS, max_tokens=TOKENS, device=DEV)
    b.fill_synthetic(seed, scale=FP8_SCALE)
    b.check_loaded()
    return b


def random_ids(vocab: int, gen: torch.Generator) -> torch.Tensor:
    per = vocab // HEADS
    return torch.randint(0, per, (TOKENS, HEADS), generator=gen, device=DEV) + torch.arange(HEADS, device=DEV) * per


def ref_rows(ids: torch.Tensor, seed: int) -> torch.Tensor:
    return synthetic_rows(ids.reshape(-1), DIM, seed, torch.float8_e4m3fn).reshape(ids.shape[0], -1)


def bytes_differ(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((a.contiguous().view(torch.uint8) != b.contiguous().view(torch.uint8)).sum())


@pytest.mark.parametrize("impl,prefetch", [("pinned_uva", True), ("pinned_uva", False), ("device", False)])
def test_breakable_replay_with_fresh_ids_equals_eager_and_the_reference(impl, prefetch):
    vocab, seed = 1 << 20, 4242
    gen = torch.Generator(device=DEV).manual_seed(1)
    backend = make_backend(impl, vocab, seed)
    step = DecodeStep(backend, hidden=1024, num_tokens=TOKENS, compute_layers=4, prefetch=prefetch,
                      graph="breakable", device=DEV)
    for i in range(6):
        ids = random_ids(vocab, gen)
        step.set_inputs(ids)
        eager_out = step.run("eager").clone()
        step.rows.view(torch.uint8).fill_(0x7F)
        step.out.fill_(float("nan"))
        if backend.prefetch_buffer is not None:
            backend.prefetch_buffer.view(torch.uint8).fill_(0x7F)
        step.set_inputs(ids)  # fresh ids into the static input, then replay
        out = step.run("breakable")
        torch.cuda.synchronize(DEV)
        assert bytes_differ(step.rows, ref_rows(ids, seed)) == 0, f"step {i}: wrong embedding bytes"
        err = (out.float() - eager_out.float()).abs().max().item()
        rel = err / max(eager_out.float().abs().max().item(), 1.0)
        assert math.isfinite(rel) and rel < 2e-2, f"step {i}: replay differs from eager by {rel:.2e}"
    kinds = [k for k, _ in step.graphs[("step", "breakable")].steps]
    assert kinds.count("eager") == (2 if prefetch else 1), kinds
    check_step(step, [random_ids(vocab, gen) for _ in range(3)], seed)  # raises on a mismatch
    backend.close()
    step.close()


def test_two_tables_in_one_breakable_graph_read_their_own_tables():
    vocab = 1 << 18
    a, b = make_backend("pinned_uva", vocab, 11), make_backend("pinned_uva", vocab, 99)
    a.prepare_prefetch()
    b.prepare_prefetch()
    ids = torch.zeros(TOKENS, HEADS, dtype=torch.int64, device=DEV)
    out_a = torch.empty(TOKENS, HEADS * DIM, dtype=torch.float8_e4m3fn, device=DEV)
    out_b = torch.empty_like(out_a)
    total = torch.empty(TOKENS, HEADS * DIM, dtype=torch.bfloat16, device=DEV)
    layers = {"layer1": a, "layer14": b}
    w = torch.randn(1024, 1024, device=DEV, dtype=torch.bfloat16)
    x = torch.randn(256, 1024, device=DEV, dtype=torch.bfloat16)

    def body():
        l1, l14 = layers["layer1"], layers["layer14"]  # the breaks are bound at capture
        eager_break(l1.start_prefetch)(ids)
        eager_break(l14.start_prefetch)(ids)
        x @ w  # something captured between the breaks
        eager_break(l1.finalize)(out=out_a)
        eager_break(l14.finalize)(out=out_b)
        total.copy_(l1.dequantize(out_a, torch.bfloat16) + l14.dequantize(out_b, torch.bfloat16))

    g = BreakableGraph("breakable", device=DEV)
    g.capture(body, warmup=1)
    layers["layer1"], layers["layer14"] = b, a  # a registry rebound after capture must not matter
    gen = torch.Generator(device=DEV).manual_seed(2)
    for rep in range(5):
        fresh = random_ids(vocab, gen)
        ids.copy_(fresh)
        for t in (out_a, out_b):
            t.view(torch.uint8).fill_(0x7F)
        total.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize(DEV)
        ra, rb = ref_rows(fresh, 11), ref_rows(fresh, 99)
        assert bytes_differ(out_a, ra) == 0 and bytes_differ(out_b, rb) == 0, f"replay {rep}"
        want = ra.to(torch.bfloat16) * FP8_SCALE + rb.to(torch.bfloat16) * FP8_SCALE
        assert int((total.float() - want.float()).abs().gt(1e-2 * want.float().abs() + 1e-2).sum()) == 0
    a.close()
    b.close()


def test_prefetch_allocation_in_a_capture_is_refused_and_leaves_no_capture_open():
    backend = make_backend("pinned_uva", 1 << 16, 5)  # prepare_prefetch never called
    ids = torch.zeros(TOKENS, HEADS, dtype=torch.int64, device=DEV)
    g = BreakableGraph("full", device=DEV)
    with pytest.raises(RuntimeError) as info:
        g.capture(lambda: backend.start_prefetch(ids))
    assert "eagerly" in str(info.value) and "capture" in str(info.value)
    assert not torch.cuda.is_current_stream_capturing()
    assert float(torch.ones(4, device=DEV).sum().item()) == 4.0  # the stream is usable
    assert backend.prefetch_buffer is None and not g.captured
    backend.close()


@pytest.mark.parametrize("impl,prefetch", [("pinned_uva", True), ("device", False)])
def test_full_graph_step_on_one_rank(impl, prefetch):
    vocab, seed = 1 << 20, 777
    gen = torch.Generator(device=DEV).manual_seed(3)
    backend = make_backend(impl, vocab, seed)
    step = DecodeStep(backend, hidden=1024, num_tokens=TOKENS, compute_layers=4, prefetch=prefetch,
                      graph="full", device=DEV)
    check_step(step, [random_ids(vocab, gen) for _ in range(5)], seed)  # fresh ids, equal the reference
    graph = step.graphs[("step", "full")]
    assert len(graph.segments) == 1 and graph.eager_calls == []
    backend.close()
    step.close()


def test_step_measurement_gives_finite_figures():
    from ple_bench.measure import TimingPolicy

    policy = TimingPolicy(warmup_ms=10.0, min_samples=10, max_samples=100, min_time_s=0.05, max_time_s=0.5,
                          max_noise=0.02, cold_l2=False, hot=False, graph=False)
    vocab, seed = (256 << 20) // DIM, 1234
    gen = torch.Generator(device=DEV).manual_seed(4)
    id_sets = torch.stack([random_ids(vocab, gen) for _ in range(8)])
    resident: dict[str, float] = {}
    for impl, modes in (("device", [(False, "eager"), (False, "breakable")]),
                        ("pinned_uva", [(False, "eager"), (True, "eager"), (True, "breakable"), (True, "full")])):
        backend = make_backend(impl, vocab, seed)
        for prefetch, mode in modes:
            case = Case(kind="step", impl=impl, vocab_size=vocab, dim=DIM, dtype="fp8", num_heads=HEADS,
                        num_tokens=TOKENS, prefetch=prefetch, graph=mode, compute_us=100.0, hidden=4096)
            rec = run_step_case(case, backend, id_sets, None, policy, DEV, table_seed=seed)
            if impl == "device":
                resident[mode] = rec["step_ms"]
            for key in ("step_ms", "lookup_ms", "compute_ms"):
                assert math.isfinite(rec[key]) and rec[key] > 0, (impl, prefetch, mode, key, rec[key])
            assert rec["compute_matmuls"] >= 1 and rec["n_samples"] >= 10
            assert rec["compute_region_graph"] == ("breakable" if mode == "breakable" else "eager")
            assert rec["unstable"] in (True, False)
        backend.close()
