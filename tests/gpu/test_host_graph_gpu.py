"""GPU checks of ``pinned_host_graph``: the host gather as a host node of a CUDA graph.
``python -m pytest -m gpu tests/gpu/test_host_graph_gpu.py`` on a GPU machine; skipped elsewhere.

Every check compares bytes with ``synthetic_rows`` of the ids, after poisoning the outputs."""

from __future__ import annotations

import pytest
import torch

from ple_bench.backends import get_backend, synthetic_rows
from ple_bench.run.step import DecodeStep, StepMismatch, check_step

pytestmark = pytest.mark.gpu

VOCAB, DIM, HEADS, TOKENS, SEED = 1 << 20, 160, 16, 64, 2468


def _backend(**kw):
    b = get_backend("pinned_host_graph")(VOCAB, DIM, dtype="fp8", num_heads=HEADS, max_tokens=TOKENS,
                                         device="cuda", **kw)
    b.fill_synthetic(SEED, scale=0.5)
    return b


def _ids(seed, on_host=True):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (TOKENS, HEADS), generator=gen)
    return ids.pin_memory() if on_host else ids.cuda()


def _ref(ids):
    return synthetic_rows(ids.reshape(-1).cpu(), DIM, SEED, torch.float8_e4m3fn).reshape(TOKENS, -1).cuda()


@pytest.mark.parametrize("on_host", [True, False], ids=["host_ids", "device_ids"])
def test_eager_lookup_and_prefetch_bit_exact(on_host):
    b = _backend()
    for seed in range(3):
        ids = _ids(seed, on_host)
        assert torch.equal(b.lookup(ids).view(torch.uint8), _ref(ids).view(torch.uint8))
        b.start_prefetch(ids)
        out = torch.full((TOKENS, HEADS * DIM), 0x7F, dtype=torch.uint8, device="cuda").view(b.storage_dtype)
        b.finalize(out=out)
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.uint8), _ref(ids).view(torch.uint8))
    b.check_deferred_errors()
    b.close()


@pytest.mark.parametrize("ids_on", ["host", "device"])
def test_full_graph_step_is_one_graph_and_bit_exact(ids_on):
    """The whole step captured as one graph (no eager break), replayed with fresh ids each time."""
    b = _backend()
    step = DecodeStep(b, hidden=1024, num_tokens=TOKENS, compute_layers=4, prefetch=True, graph="full",
                      ids_on=ids_on)
    sets = [_ids(s, on_host=True).cpu() for s in range(4)]
    check_step(step, sets, SEED)
    graph = step.graphs[("step", "full")]
    assert graph.captured and not graph.eager_calls and len(graph.segments) == 1  # one graph, no break
    before = [t["runs"] for t in b.host_node_timing()]
    check_step(step, sets, SEED)  # replays of the same graph
    after = [t["runs"] for t in b.host_node_timing()]
    assert sum(after) - sum(before) >= len(sets)  # the host node ran once per replay
    assert b.host_thread_s > 0  # the callback thread's CPU time is the path's host work
    step.close()
    b.close()


def test_full_graph_id_past_the_table_is_reported_not_crashed():
    b = _backend()
    step = DecodeStep(b, hidden=1024, num_tokens=TOKENS, compute_layers=2, prefetch=True, graph="full",
                      ids_on="host")
    good = _ids(7).cpu()
    check_step(step, [good], SEED)
    bad = good.clone()
    bad[3, 5] = VOCAB + 12
    with pytest.raises(IndexError, match=str(VOCAB + 12)):
        check_step(step, [bad], SEED)
    check_step(step, [good], SEED)  # the flag was cleared: the next good step passes
    step.close()
    b.close()


def test_breakable_and_full_agree_and_replay_after_close_is_harmless():
    b = _backend(gather_threads=4)
    step = DecodeStep(b, hidden=1024, num_tokens=TOKENS, compute_layers=2, prefetch=True, graph="breakable",
                      ids_on="host")
    sets = [_ids(s).cpu() for s in range(3)]
    check_step(step, sets, SEED)
    check_step(step, sets, SEED, mode="full")
    graph = step.graphs[("step", "full")]
    b.close()  # retires the tasks: a replay now touches no freed table
    graph.replay()
    torch.cuda.synchronize()
    step.close()


def test_poisoned_rows_are_caught_by_the_step_gate():
    """The gate compares bytes: a table refilled with other rows under a captured step fails it."""
    b = _backend()
    step = DecodeStep(b, hidden=1024, num_tokens=TOKENS, compute_layers=2, prefetch=True, graph="full",
                      ids_on="host")
    sets = [_ids(1).cpu()]
    check_step(step, sets, SEED)
    b.fill_synthetic(SEED + 1, scale=0.5)  # other rows: the gate must see it
    with pytest.raises(StepMismatch):
        check_step(step, sets, SEED)
    step.close()
    b.close()
