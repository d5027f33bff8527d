"""GPU checks of the host-offload paths, the host-sync timer and graph replays:
``python -m pytest -m gpu tests/gpu`` on a GPU machine; skipped with the reason elsewhere.

Each test compares against values recomputed from the ids (``synthetic_rows``), byte for byte."""

from __future__ import annotations

import pytest
import torch

from ple_bench.backends import get_backend, synthetic_rows
from ple_bench.spec.case import Case
from ple_bench.run.executor import CaseExecutor
from ple_bench.measure import TimingPolicy, capture_graph, measure, measure_graph
from ple_bench.run.step import DecodeStep, check_step

pytestmark = pytest.mark.gpu

VOCAB, DIM, HEADS, TOKENS, SEED = 1 << 20, 160, 16, 64, 4321
PATHS = [("device", "triton_reference"), ("pinned_uva", "triton_reference"), ("pinned_uva", "triton_tuned"),
         ("pinned_cpu_gather", ""), ("pinned_copy_engine", ""), ("pinned_hot_cache", "")]


def _backend(impl, kernel="", **kw):
    if kernel:
        kw["kernel"] = kernel
    if impl == "pinned_hot_cache":
        kw["cache_rows"] = 4096
    b = get_backend(impl)(VOCAB, DIM, dtype="fp8", num_heads=HEADS, max_tokens=TOKENS, device="cuda", **kw)
    b.fill_synthetic(SEED, scale=0.5)
    return b


def _ids(seed, on_host):
    gen = torch.Generator().manual_seed(seed)
    per = VOCAB // HEADS
    ids = torch.randint(0, per, (TOKENS, HEADS), generator=gen) + torch.arange(HEADS) * per
    return ids.pin_memory() if on_host else ids.cuda()


def _ref(ids):
    return synthetic_rows(ids.reshape(-1).cpu(), DIM, SEED, torch.float8_e4m3fn).reshape(TOKENS, -1).cuda()


@pytest.mark.parametrize("impl,kernel", PATHS)
@pytest.mark.parametrize("on_host", [True, False], ids=["host_ids", "device_ids"])
def test_lookup_and_prefetch_bit_exact(impl, kernel, on_host):
    b = _backend(impl, kernel)
    for seed in range(3):
        ids = _ids(seed, on_host)
        assert torch.equal(b.lookup(ids).view(torch.uint8), _ref(ids).view(torch.uint8))
        if b.supports_prefetch:
            b.start_prefetch(ids)
            out = torch.full((TOKENS, HEADS * DIM), 0x7F, dtype=torch.uint8, device="cuda").view(b.storage_dtype)
            b.finalize(out=out)
            torch.cuda.synchronize()
            assert torch.equal(out.view(torch.uint8), _ref(ids).view(torch.uint8))
    b.close()


@pytest.mark.parametrize("impl,kernel", PATHS)
@pytest.mark.parametrize("graph", ["eager", "breakable", "full"])
def test_host_ids_steps_in_every_graph_mode(impl, kernel, graph):
    b = _backend(impl, kernel)
    prefetch = impl != "device"
    try:
        step = DecodeStep(b, hidden=512, num_tokens=TOKENS, compute_us=50.0, prefetch=prefetch, graph=graph,
                          ids_on="host")
    except NotImplementedError as exc:  # a host path in a full graph: refused with the reason
        assert graph == "full" and type(b).blocks_host and "on the host" in str(exc)
        return
    check_step(step, [_ids(s, True) for s in range(4)], SEED)
    step.close()
    b.close()


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_cpu_gather_direct_path_back_to_back(native):
    """The direct path (one C++ call, or its Python steps) with host ids: eight lookups and
    eight prefetches into poisoned outputs issued without a synchronize, so each gather must
    wait for the copy out of the shared staging before it refills it; then a lookup larger
    than the staging (which grows). Every output equals the rows recomputed from its ids."""
    b = _backend("pinned_cpu_gather")
    b.native = native
    sets = [_ids(s, True) for s in range(8)]
    outs = [b.lookup(ids) for ids in sets]
    fins = []
    for ids in sets:
        b.start_prefetch(ids)
        out = torch.full((TOKENS, HEADS * DIM), 0x7F, dtype=torch.uint8, device="cuda").view(b.storage_dtype)
        fins.append(b.finalize(out=out))
    big = torch.cat([sets[0], sets[1], sets[2]])  # 3 x TOKENS rows: past the staging's capacity
    got_big = b.lookup(big)
    torch.cuda.synchronize()
    for ids, o, f in zip(sets, outs, fins):
        ref = _ref(ids).view(torch.uint8)
        assert torch.equal(o.view(torch.uint8), ref) and torch.equal(f.view(torch.uint8), ref)
    ref_big = torch.cat([_ref(s) for s in sets[:3]]).view(torch.uint8)
    assert torch.equal(got_big.view(torch.uint8), ref_big)
    assert b.stats()["gather_impl"] == ("native" if native else "python")
    assert b.host_thread_s > 0
    b.close()


def test_cpu_gather_fast_lookup_and_its_fall_throughs():
    """The direct path's one-closure lookup (built by the first call) gives the
    reference rows for int64 and int32 host ids; ids it does not take -- on the device, a
    wrong head count, more rows than the staging, a float dtype -- fall through to the
    checked path (the rows, or the same ValueError); turning ``direct`` off drops it."""
    def ref(x):
        return synthetic_rows(x.reshape(-1).cpu().long(), DIM, SEED, torch.float8_e4m3fn).reshape(x.shape[0], -1)

    b = _backend("pinned_cpu_gather")
    ids = _ids(0, True)
    first = b.lookup(ids)
    assert callable(b._fast_lookup)  # built by the first call that takes the direct path
    for x in (ids, _ids(1, True).to(torch.int32), ids.cuda(), torch.cat([ids, ids, ids])):
        got = b.lookup(x)
        torch.cuda.synchronize()
        assert torch.equal(got.view(torch.uint8).cpu(), ref(x).view(torch.uint8))
    assert callable(b._fast_lookup)
    assert torch.equal(first.view(torch.uint8).cpu(), ref(ids).view(torch.uint8))
    with pytest.raises(ValueError, match="one column per head"):
        b.lookup(ids[:, :3])
    with pytest.raises(ValueError, match="int64 or int32"):
        b.lookup(ids.float())
    with pytest.raises(IndexError):
        b.lookup(torch.full_like(ids, b.weight.shape[0]))
    b.direct = False
    assert b._fast_lookup is None
    got = b.lookup(ids)
    assert torch.equal(got.view(torch.uint8).cpu(), ref(ids).view(torch.uint8)) and not b._fast_lookup
    assert b.stats()["gather_impl"] == "native"  # the direct state of the calls before
    b.close()


def test_host_sync_timer_on_a_host_blocking_path():
    b = _backend("pinned_cpu_gather")
    sets = [_ids(s, True) for s in range(8)]
    turn = [0]

    def fn():
        turn[0] += 1
        b.lookup(sets[turn[0] % 8])

    pol = TimingPolicy(warmup_ms=5, min_samples=20, max_samples=200, min_time_s=0.05, max_time_s=1.0)
    m = measure(fn, device="cuda", policy=pol, host_sync=True, label="t")
    assert m.timer == "host_sync" and len(m.event_samples_ms) == len(m.samples_ms) >= 20
    med = sorted(m.samples_ms)[len(m.samples_ms) // 2]
    ev = sorted(m.event_samples_ms)[len(m.event_samples_ms) // 2]
    assert 0 < ev <= med  # the host clock brackets the GPU work of the same call
    b.close()


def test_graph_replays_rotate_their_id_sets():
    """One graph per id set: each replay writes its own set's rows (a single graph would repeat one)."""
    b = _backend("pinned_uva", "triton_reference")
    sets = [_ids(s, False) for s in range(3)]
    outs = [torch.empty(TOKENS, HEADS * DIM, dtype=b.storage_dtype, device="cuda") for _ in sets]
    graphs = [capture_graph(lambda s=s, o=o: o.copy_(b.lookup(s)), torch.device("cuda", 0))
              for s, o in zip(sets, outs)]
    for o in outs:
        o.view(torch.uint8).fill_(0x7F)
    for g in graphs:
        g.replay()
    torch.cuda.synchronize()
    for s, o in zip(sets, outs):
        assert torch.equal(o.view(torch.uint8), _ref(s).view(torch.uint8))
    m = measure_graph([lambda s=s: b.lookup(s) for s in sets], device="cuda",
                      policy=TimingPolicy(warmup_ms=5, min_samples=10, max_samples=50, max_time_s=0.5), cold_l2=True)
    assert m.cold_l2 and len(m.samples_ms) >= 10
    b.close()


@pytest.mark.parametrize("mode", ["torch", "exact"])
def test_pinned_table_modes_through_the_executor(mode):
    ex = CaseExecutor(device=torch.device("cuda", 0))
    pol = TimingPolicy(warmup_ms=5, min_samples=5, max_samples=20, max_time_s=0.3, id_sets=2)
    for impl in ("pinned_uva", "pinned_cpu_gather"):
        rec = ex.run(Case(impl=impl, vocab_size=VOCAB, dim=DIM, dtype="fp8", num_heads=HEADS, num_tokens=TOKENS,
                          prefetch=True, ids_on="host", host_alloc=mode), pol)
        assert rec["median_ms"] > 0  # the gate checked every id set byte for byte first
        table = ex.table.backend.table_bytes
        if mode == "exact":
            assert table <= rec["pinned_bytes"] < table + 4096
        else:
            assert rec["pinned_bytes"] == 1 << (table - 1).bit_length()
    ex.release_table()
