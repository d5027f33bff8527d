"""Topology validation, and both backends on real gloo process groups: each
(TP, ETP, DP) runs in one spawn of TP x DP processes (tests._dist) that checks
every dtype, the synchronous lookup and start_prefetch/finalize, with different
token counts per DP rank, against the full-table lookup of each rank's own ids."""

from __future__ import annotations

import pytest
import torch

from ple_bench.backends import DTYPES, get_backend, synthetic_rows
from ple_bench.parallel import Groups, Topology, TopologyError

from ._dist import RankFailure, run_ranks
from ._reference import assert_bytes_equal, bytes_of, full_lookup, poisoned, random_ids, random_table

# ----------------------------------------------------------------- topology


@pytest.mark.parametrize(
    "tp, etp, dp, match",
    [
        (1, 4, 2, "larger than the world size"),  # ETP > TP x DP
        (2, 8, 2, "larger than the world size"),
        (2, 3, 3, "divisible by TP"),  # ETP not a multiple of TP
        (4, 2, 1, "divisible by TP"),
        (1, 2, 3, "not a multiple of ETP/TP"),  # DP not whole ETP groups
        (2, 4, 3, "not a multiple of ETP/TP"),
        (0, 1, 1, "positive integer"),
        (1, 1, -1, "positive integer"),
        (1.0, 1, 1, "positive integer"),
        (True, 1, 1, "positive integer"),
    ],
)
def test_impossible_topologies_are_refused(tp, etp, dp, match):
    with pytest.raises(TopologyError, match=match):
        Topology(tp=tp, etp=etp, dp=dp)


def test_topology_error_is_a_value_error():
    assert issubclass(TopologyError, ValueError)


@pytest.mark.parametrize("tp, etp, dp", [(2, 2, 1), (1, 2, 2), (2, 4, 2), (1, 4, 4), (1, 2, 4), (2, 2, 3)])
def test_rank_layout(tp, etp, dp):
    topo = Topology(tp, etp, dp)
    world = tp * dp
    assert topo.world_size == world and topo.replicas == etp // tp
    seen_etp = set()
    for g in range(topo.num_etp_groups):
        ranks = topo.etp_group_ranks(g)
        assert len(ranks) == etp and not seen_etp & set(ranks)
        seen_etp |= set(ranks)
        for r in ranks:
            c = topo.coords(r)
            assert c.etp_group_index == g and c.rank == r
            assert r == c.dp_rank * tp + c.tp_rank
            assert ranks[c.etp_rank] == r
            # the gather group: same tp_rank, the group's DP ranks, in slot order
            gather = topo.gather_group_ranks(g, c.tp_rank)
            assert gather[c.slot] == r
            assert [topo.coords(x).dp_rank for x in gather] == topo.group_dp_ranks(g)
            assert all(topo.coords(x).tp_rank == c.tp_rank for x in gather)
    assert seen_etp == set(range(world))
    with pytest.raises(TopologyError):
        topo.coords(world)


def test_groups_single_process():
    g = Groups.single()
    assert g.topology == Topology(1, 1, 1) and g.etp_group is None and g.gather_group is None
    assert Groups.build(Topology()).topology.world_size == 1


def test_groups_build_without_distributed_is_refused():
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a default process group exists in this process")
    with pytest.raises(RuntimeError, match="not initialised"):
        Groups.build(Topology(1, 2, 2))


def _wrong_world_main(rank, world, tp, etp, dp):
    try:
        Groups.build(Topology(tp, etp, dp))
    except TopologyError as exc:
        return str(exc)
    return None


@pytest.mark.slow
def test_groups_build_with_wrong_world_size_is_refused():
    messages = run_ranks(
        "tests.test_parallel:_wrong_world_main", 2, args={"tp": 1, "etp": 2, "dp": 4}, timeout_s=60
    )
    for msg in messages:
        assert msg is not None and "needs world size 4" in msg and "has 2 ranks" in msg


# ----------------------------------------------------------------- multi-rank lookups

DIM = 37  # not a power of two
HEADS = 3


def _check(what, actual, expected):
    assert_bytes_equal(actual, expected, what)


def _rank_main(rank, world, tp, etp, dp, num_embeddings, padding_size, dtypes, steps):
    """One rank: every dtype x backend x step; raises on the first wrong byte."""
    topo = Topology(tp, etp, dp)
    groups = Groups.build(topo)
    me = topo.coords(rank)
    max_tokens = max(max(step) for step in steps)
    checks = 0
    shards = {}
    for d, dtype_name in enumerate(dtypes):
        dtype = DTYPES[dtype_name]
        full = random_table(num_embeddings, DIM, dtype, seed=1000 + d)
        for backend in ("device", "pinned_uva"):
            emb = get_backend(backend)(
                num_embeddings, DIM, dtype=dtype_name, num_heads=HEADS, max_tokens=max_tokens,
                padding_size=padding_size, groups=groups,
            )
            shards[backend] = [emb.shard.vocab_start, emb.shard.vocab_end]
            for source in ("random", "synthetic"):
                if source == "random":
                    emb.load_full_table(full, scale=0.5 if dtype_name == "fp8" else None)
                    reference = full
                else:
                    emb.fill_synthetic(seed=7 + d)
                    reference = synthetic_rows(torch.arange(num_embeddings), DIM, 7 + d, dtype)
                for s, counts in enumerate(steps):
                    n = counts[me.dp_rank]
                    # same ids on the TP ranks of one DP rank (the model's contract)
                    ids = random_ids(n, HEADS, num_embeddings, seed=97 * s + me.dp_rank,
                                     dtype=torch.int32 if s % 2 else torch.int64)
                    expected = full_lookup(reference, ids)
                    tag = (f"tp{tp}-etp{etp}-dp{dp} rank {rank} {backend} {dtype_name} {source} step {s} "
                           f"counts {counts}")
                    _check(f"{tag} lookup", emb.lookup(ids, counts), expected)
                    emb.start_prefetch(ids, counts)
                    out = poisoned(expected.shape, expected.dtype)
                    result = emb.finalize(out=out)
                    assert result is out, f"{tag}: finalize(out=) must return out"
                    _check(f"{tag} prefetch", out, expected)
                    emb.start_prefetch(ids, list(counts))
                    _check(f"{tag} prefetch (no out)", emb.finalize(), expected)
                    checks += 3
            emb.close()
    return {"rank": rank, "checks": checks, "shards": shards, "etp_rank": me.etp_rank,
            "group": me.etp_group_index}


TOPOLOGY_CASES = [
    # (tp, etp, dp), num_embeddings, padding_size, dtypes, per-step DP token counts
    pytest.param((2, 2, 1), 1001, 64, ["fp8", "bf16", "fp32"], [[5], [1], [9]], id="tp2-etp2-dp1"),
    pytest.param((1, 2, 2), 999, 10, ["fp8", "bf16"], [[5, 3], [0, 4], [2, 2]], id="tp1-etp2-dp2"),
    pytest.param((2, 4, 2), 1001, 64, ["fp8", "fp16"], [[4, 6], [3, 1]], id="tp2-etp4-dp2"),
    # 70 rows padded to 128, 32 per rank: the last ETP rank owns no row at all
    pytest.param((1, 4, 4), 70, 64, ["fp8", "bf16"], [[3, 2, 4, 1], [2, 3, 0, 1]], id="tp1-etp4-dp4"),
    # DP larger than ETP/TP: two independent ETP groups of 2 DP replicas each
    pytest.param((1, 2, 4), 1001, 64, ["fp8", "bf16"], [[5, 3, 1, 7], [2, 6, 4, 0]], id="tp1-etp2-dp4"),
]


def _topologies_main(rank, world, cases):
    """One rank of every topology of this world size, one after the other in the same processes
    (each builds its own groups on the one default group): a process start is most of a
    topology's cost on a CPU."""
    return [_rank_main(rank, world, **case) for case in cases]


@pytest.fixture(scope="module")
def multi_rank_results():
    """``(tp, etp, dp) -> every rank's result``: the topologies of one world size in one launch of
    its ranks, launched when a test first asks for one of them (two launches in all, not five)."""
    done: dict[tuple, list] = {}

    def results_of(topo: tuple[int, int, int]) -> list:
        if topo not in done:
            world = topo[0] * topo[2]
            params = [p.values for p in TOPOLOGY_CASES if p.values[0][0] * p.values[0][2] == world]
            cases = [dict(tp=t[0], etp=t[1], dp=t[2], num_embeddings=n, padding_size=pad, dtypes=d, steps=st)
                     for t, n, pad, d, st in params]
            ranks = run_ranks("tests.test_parallel:_topologies_main", world, args=dict(cases=cases),
                              timeout_s=240 * len(cases))
            for i, (t, *_) in enumerate(params):
                done[tuple(t)] = [r[i] for r in ranks]
        return done[topo]

    return results_of


@pytest.mark.slow
@pytest.mark.parametrize("topo, num_embeddings, padding_size, dtypes, steps", TOPOLOGY_CASES)
def test_multi_rank_lookup_matches_full_table(multi_rank_results, topo, num_embeddings, padding_size, dtypes,
                                              steps):
    tp, etp, dp = topo
    world = tp * dp
    results = multi_rank_results(tuple(topo))
    expected_checks = len(dtypes) * 2 * 2 * len(steps) * 3
    assert [r["rank"] for r in results] == list(range(world))
    assert all(r["checks"] == expected_checks for r in results), results
    # the shards of each ETP group tile the vocabulary exactly once
    for backend in ("device", "pinned_uva"):
        for g in range(world // etp):
            members = sorted((r["etp_rank"], tuple(r["shards"][backend])) for r in results if r["group"] == g)
            assert [m[0] for m in members] == list(range(etp))
            covered = []
            for _, (start, end) in members:
                covered.extend(range(start, end))
            assert covered == list(range(num_embeddings))


def _empty_everywhere_main(rank, world, tp, etp, dp):
    groups = Groups.build(Topology(tp, etp, dp))
    full = random_table(100, DIM, torch.bfloat16, seed=3)
    shapes = []
    for backend in ("device", "pinned_uva"):
        emb = get_backend(backend)(100, DIM, dtype="bf16", num_heads=HEADS, max_tokens=4, groups=groups)
        emb.load_full_table(full)
        ids = torch.empty(0, HEADS, dtype=torch.int64)
        shapes.append(list(emb.lookup(ids, [0] * dp).shape))
        emb.start_prefetch(ids, [0] * dp)
        shapes.append(list(emb.finalize().shape))
    return shapes


@pytest.mark.slow
def test_multi_rank_empty_batch_on_every_rank():
    results = run_ranks("tests.test_parallel:_empty_everywhere_main", 2,
                        args={"tp": 1, "etp": 2, "dp": 2}, timeout_s=120)
    for shapes in results:
        assert shapes == [[0, HEADS * DIM]] * 4


def _failing_main(rank, world):
    if rank == 1:
        raise RuntimeError("rank 1 fails on purpose")
    import torch.distributed as dist

    dist.barrier()  # rank 0 would wait here forever without the harness
    return rank


@pytest.mark.slow
def test_dist_harness_reports_a_failing_rank_instead_of_hanging():
    with pytest.raises(RankFailure, match="rank 1 fails on purpose"):
        run_ranks("tests.test_parallel:_failing_main", 2, timeout_s=60, collective_timeout_s=30)


# ----------------------------------------------------------------- byte-exact ETP reduce


def _reduce_main(rank, world):
    """Each rank owns alternate rows of a [13, dim] block (odd element counts: the int8 path) (zero bytes for the
    others); after the backend's ETP reduce every rank must hold the union,
    byte for byte: -0.0 and NaN payloads included (a float sum would turn
    -0.0 + 0.0 into +0.0 and may canonicalise NaNs)."""
    topo = Topology(tp=1, etp=2, dp=2)
    groups = Groups.build(topo)
    emb = get_backend("device")(16, 8, dtype="bf16", groups=groups)
    report = {}
    for dtype, dim in [(torch.float8_e4m3fn, 5), (torch.bfloat16, 3), (torch.bfloat16, 4),
                       (torch.float16, 7), (torch.float32, 3)]:
        full = random_table(13, dim, dtype, seed=dim)
        raw = full.view(torch.uint8).view(13, -1)
        raw[0, : dtype.itemsize] = 0x80 if dtype.itemsize == 1 else 0   # -0.0 (high byte below)
        raw[0, dtype.itemsize - 1] = 0x80
        raw[1, : dtype.itemsize] = 0xFF                                   # a negative NaN
        mine = full.clone()
        mine.view(torch.uint8).view(13, -1)[(torch.arange(13) % 2) != rank] = 0
        rows = mine.reshape(13, 1, dim).clone()
        reduced = emb.reduce_rows(rows)
        assert reduced.data_ptr() == rows.data_ptr(), "the reduce is in place"
        assert_bytes_equal(reduced.reshape(13, dim), full, f"rank {rank} reduce {dtype} dim {dim}")
        theirs = full.clone()
        theirs.view(torch.uint8).view(13, -1)[(torch.arange(13) % 2) == rank] = 0
        float_sum = (mine.float() + theirs.float()).to(dtype)  # what a float reduce gives
        report[f"{dtype}-{dim}"] = bool(torch.equal(bytes_of(float_sum), bytes_of(full)))
    return report


@pytest.mark.slow
def test_etp_reduce_is_byte_exact():
    results = run_ranks("tests.test_parallel:_reduce_main", 2, timeout_s=60)
    # the data was chosen so that a float sum would not have been byte-exact
    assert len(results) == 2 and len(results[0]) == 5
    assert not any(results[0].values()) and not any(results[1].values())


def _hanging_main(rank, world):
    if rank == 1:
        import time

        time.sleep(600)  # never answers
    return rank


@pytest.mark.slow
def test_dist_harness_fails_a_hung_rank_by_deadline():
    import time

    t0 = time.monotonic()
    with pytest.raises(RankFailure, match=r"timed out after 8s \(rank\(s\) \[(0, )?1\] still running"):
        run_ranks("tests.test_parallel:_hanging_main", 2, timeout_s=8)
    assert time.monotonic() - t0 < 30
