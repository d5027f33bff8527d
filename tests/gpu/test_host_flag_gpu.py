"""GPU checks of ``pinned_host_flag``: the host gather posted right after the step's graph is launched,
the graph polling a flag per piece of rows. ``python -m pytest -m gpu tests/gpu/test_host_flag_gpu.py``
on a GPU machine; skipped elsewhere.

Every check compares bytes with ``synthetic_rows`` of the ids, after poisoning the outputs."""

from __future__ import annotations

import time

import pytest
import torch

from ple_bench.backends import get_backend, synthetic_rows
from ple_bench.backends.pinned_host_flag import MAX_POLLS
from ple_bench.run.step import DecodeStep, StepMismatch, check_step

pytestmark = pytest.mark.gpu

VOCAB, DIM, HEADS, TOKENS, SEED = 1 << 20, 160, 16, 64, 8642


def _backend(**kw):
    b = get_backend("pinned_host_flag")(VOCAB, DIM, dtype="fp8", num_heads=HEADS, max_tokens=TOKENS,
                                        device="cuda", **kw)
    b.fill_synthetic(SEED, scale=0.5)
    return b


def _ids(seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (TOKENS, HEADS), generator=gen).pin_memory()


def _ref(ids):
    return synthetic_rows(ids.reshape(-1).cpu(), DIM, SEED, torch.float8_e4m3fn).reshape(TOKENS, -1).cuda()


@pytest.mark.parametrize("chunks", [1, 4])
def test_eager_lookup_and_prefetch_bit_exact(chunks):
    b = _backend(chunks=chunks)
    for seed in range(3):
        ids = _ids(seed)
        assert torch.equal(b.lookup(ids).view(torch.uint8), _ref(ids).view(torch.uint8))
        b.start_prefetch(ids)
        out = torch.full((TOKENS, HEADS * DIM), 0x7F, dtype=torch.uint8, device="cuda").view(b.storage_dtype)
        b.finalize(out=out)
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.uint8), _ref(ids).view(torch.uint8))
    b.check_deferred_errors()
    b.close()


def test_device_ids_are_refused():
    b = _backend()
    with pytest.raises(NotImplementedError, match="host ids"):
        b.lookup(_ids(1).cuda())
    b.close()


@pytest.mark.parametrize("chunks", [1, 4])
def test_full_graph_step_is_one_graph_and_bit_exact(chunks):
    """The whole step captured as one graph (no eager break), replayed after each post of fresh ids."""
    b = _backend(chunks=chunks)
    step = DecodeStep(b, hidden=1024, num_tokens=TOKENS, compute_layers=4, prefetch=True, graph="full",
                      ids_on="host")
    sets = [_ids(s).cpu() for s in range(4)]
    check_step(step, sets, SEED)
    graph = step.graphs[("step", "full")]
    assert graph.captured and not graph.eager_calls and len(graph.segments) == 1  # one graph, no break
    posts = b.host_node_timing()[0]["runs"]
    check_step(step, sets, SEED)  # replays of the same graph, each after set_inputs posted its ids
    assert b.host_node_timing()[0]["runs"] - posts >= len(sets)
    assert b.host_thread_s > 0  # the team's CPU time is the path's host work
    step.close()
    b.close()


def test_the_step_posts_right_after_the_launch():
    """A replay of the full graph is followed by the step's post: the team starts after the launch
    call returned, and the rows are the ids'."""
    b = _backend()
    step = DecodeStep(b, hidden=1024, num_tokens=TOKENS, compute_layers=4, prefetch=True, graph="full",
                      ids_on="host")
    sets = [_ids(s).cpu() for s in range(2)]
    check_step(step, sets, SEED)
    run = step.runner("step")
    step.set_inputs(sets[1])
    posts = b.host_node_timing()[0]["runs"]
    t_launch = time.monotonic_ns()
    run()
    torch.cuda.synchronize()
    timing = b.host_node_timing()[0]
    assert timing["runs"] == posts + 1 and timing["last_start_ns"] > t_launch
    assert torch.equal(step.rows.view(torch.uint8), _ref(sets[1]).view(torch.uint8))
    step.close()
    b.close()


def test_full_graph_id_past_the_table_is_reported_not_crashed():
    b = _backend(chunks=2)
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


@pytest.mark.parametrize("chunks", [1, 3])
def test_a_replay_without_a_post_gives_up_and_is_reported(chunks):
    """The graph alone (no post after it): every poll gives up after MAX_POLLS reads, the rows are
    stale, and check_deferred_errors says so; the next posted step is right again."""
    b = _backend(gather_threads=4, chunks=chunks)
    step = DecodeStep(b, hidden=1024, num_tokens=TOKENS, compute_layers=2, prefetch=True, graph="breakable",
                      ids_on="host")
    sets = [_ids(s).cpu() for s in range(3)]
    check_step(step, sets, SEED)
    check_step(step, sets, SEED, mode="full")  # breakable and full agree
    graph = step.graphs[("step", "full")]
    step.set_inputs(_ids(9).cpu())
    graph.replay()  # the graph without the step's post
    torch.cuda.synchronize()
    assert not torch.equal(step.rows.view(torch.uint8), _ref(_ids(9)).view(torch.uint8))
    with pytest.raises(RuntimeError, match=f"timed out after {MAX_POLLS}"):
        b.check_deferred_errors()
    check_step(step, sets, SEED, mode="full")
    step.close()
    b.close()


def test_poisoned_rows_are_caught_by_the_step_gate():
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
