"""The alternative lookup paths (fast_kernels, pinned_cpu_gather, pinned_hot_cache) against a full-table
reference: every path x dtype x shard position, random never-zero tables,
poisoned outputs; dedup with many repeats; hot-cache hit rates on constructed
cases; the CPU-gather prefetch."""

from __future__ import annotations

import zlib

import pytest
import torch

from ple_bench.backends import fast_kernels as fk
from ple_bench.backends.pinned_cpu_gather import PinnedCPUGatherEmbedding
from ple_bench.backends.pinned_hot_cache import PinnedHotCacheEmbedding
from ple_bench.backends.formats import DTYPES, int_view
from ple_bench.backends.kernels import get_kernel, kernel_names
from ple_bench.backends.registry import backend_names, get_backend
from ple_bench.parallel import Groups, Topology

VOCAB = 1000  # padded to 1024 by padding_size 64: the last ETP=4 shard is partial
DIM = 80
HEADS = 2

PATHS = {
    "triton_reference": ("pinned_uva", {"kernel": "triton_reference"}),
    "torch_uva": ("pinned_uva", {"kernel": "torch_uva"}),
    "triton_tuned": ("pinned_uva", {"kernel": "triton_tuned"}),
    "dedup_triton": ("pinned_uva", {"kernel": "dedup:triton_tuned"}),
    "dedup_torch": ("pinned_uva", {"kernel": "dedup_torch"}),
    "cpu_gather": ("pinned_cpu_gather", {}),
    "cpu_gather_threads": ("pinned_cpu_gather", {"gather_threads": 3}),
    "hot_cache": ("pinned_hot_cache", {"cache_rows": 40}),
    "hot_cache_torch": ("pinned_hot_cache", {"cache_rows": 40, "kernel": "torch_masked"}),
}
# (label, Topology, rank): single rank and ETP=4 shards, first, middle and the partial last.
SHARDS = [
    ("single", Topology(), 0),
    ("etp4_r0", Topology(tp=1, etp=4, dp=4), 0),
    ("etp4_r2", Topology(tp=1, etp=4, dp=4), 2),
    ("etp4_r3", Topology(tp=1, etp=4, dp=4), 3),
]


def random_table(rows: int, dim: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random values in ``dtype``, none of them zero."""
    g = torch.Generator().manual_seed(seed)
    values = (torch.randn(rows, dim, generator=g) * 3).to(dtype).to(torch.float32)
    values[values == 0] = 0.75  # exact in every dtype
    full = values.to(dtype)
    assert not bool((full.to(torch.float32) == 0).any())
    return full


def reference(full: torch.Tensor, ids: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Rows of ``full`` for the owned ids, zero rows elsewhere: ``[n, dim]`` int view."""
    flat = ids.reshape(-1)
    owned = (flat >= start) & (flat < end)
    rows = int_view(full)[flat.clamp(0, full.shape[0] - 1)].clone()
    rows[~owned] = 0
    return rows


def make_ids(n_tokens: int, start: int, end: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (n_tokens, HEADS), generator=g)
    edges = [0, VOCAB - 1, start, max(start, end - 1), min(end, VOCAB - 1)]
    ids.view(-1)[: len(edges)] = torch.tensor(edges)
    ids.view(-1)[-3:] = ids.view(-1)[5]  # a few repeats
    return ids


def build(path: str, dtype: str, topo: Topology, rank: int, **extra):
    backend, kwargs = PATHS[path]
    cls = get_backend(backend)
    return cls(VOCAB, DIM, dtype=dtype, num_heads=HEADS, max_tokens=24, padding_size=64,
               groups=Groups(topology=topo, rank=rank), device="cpu", **kwargs, **extra)


def poison(shape, dtype: torch.dtype) -> torch.Tensor:
    out = torch.empty(shape, dtype=dtype)
    int_view(out).fill_(-3)  # a non-zero bit pattern in every width
    return out


@pytest.mark.parametrize("shard", SHARDS, ids=[s[0] for s in SHARDS])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("path", list(PATHS))
def test_local_lookup_matches_reference(path, dtype, shard):
    _, topo, rank = shard
    b = build(path, dtype, topo, rank)
    full = random_table(VOCAB, DIM, b.storage_dtype, seed=zlib.crc32(f"{path}/{dtype}".encode()) % 1000)
    b.load_full_table(full)
    if isinstance(b, PinnedHotCacheEmbedding):
        b.warm_cache(torch.arange(b.shard.vocab_start, b.shard.vocab_end, 3))
    s = b.shard
    ids = make_ids(24, s.vocab_start, s.vocab_end, seed=rank + 7)
    out = poison((24, HEADS, DIM), b.storage_dtype)
    got = b.local_lookup(ids, out=out)
    assert got is out
    want = reference(full, ids, s.vocab_start, s.vocab_end)
    assert torch.equal(int_view(got).reshape(-1, DIM), want)
    owned = ((ids >= s.vocab_start) & (ids < s.vocab_end)).reshape(-1)
    assert bool(owned.any()) and bool((~owned).any()) or topo.etp == 1


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("path", list(PATHS))
def test_lookup_and_prefetch_full_api(path, dtype):
    """lookup and start_prefetch/finalize on a TP=ETP=4 rank (no DP replicas:
    no process group needed, the reduce is skipped) and on a single rank."""
    for topo, rank in ((Topology(), 0), (Topology(tp=4, etp=4, dp=1), 1)):
        b = build(path, dtype, topo, rank)
        full = random_table(VOCAB, DIM, b.storage_dtype, seed=5)
        b.load_full_table(full)
        s = b.shard
        ids = make_ids(20, s.vocab_start, s.vocab_end, seed=3)
        want = reference(full, ids, s.vocab_start, s.vocab_end).reshape(20, HEADS * DIM)
        assert torch.equal(int_view(b.lookup(ids)), want)
        b.start_prefetch(ids)
        out = poison((20, HEADS * DIM), b.storage_dtype)
        assert b.finalize(out) is out
        assert torch.equal(int_view(out), want)
        b.close()


@pytest.mark.parametrize("dim", [1, 3, 100, 160, 1280])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_tuned_and_dedup_kernels_any_dim(dim, dtype):
    """Kernels directly: rows that are not a power of two, and rows that do
    (and do not) widen to int64 words."""
    storage = DTYPES[dtype]
    full = random_table(300, dim, storage, seed=dim)
    start, end = 64, 250
    table = int_view(full[start:end].contiguous())
    ids = torch.randint(0, 300, (40,))
    ids[:4] = torch.tensor([start, end - 1, end, start - 1])
    want = reference(full, ids, start, end)
    for name in ("triton_tuned", "dedup:triton_tuned", "dedup_torch", "torch_uva"):
        out = int_view(poison((40, dim), storage))
        get_kernel(name)(table, ids, out, start, end)
        assert torch.equal(out, want), name


def test_tuned_every_config_and_grid_cap():
    full = random_table(200, 20, torch.bfloat16, seed=1)  # 40 B rows: int64 words, 5 per row
    table = int_view(full)
    ids = torch.randint(0, 200, (37,))  # not a multiple of any rows-per-program
    want = reference(full, ids, 0, 200)
    configs = fk.candidate_configs(5)
    assert {c.rows for c in configs} >= {1, 2, 4, 8, 16}
    for cfg in configs[:: max(1, len(configs) // 6)]:
        for cap in (None, 1, 3):
            out = int_view(poison((37, 20), torch.bfloat16))
            used = fk.tuned_lookup(table, ids, out, 0, 200, config=cfg, max_programs=cap)
            assert used == cfg
            assert torch.equal(out, want), (cfg, cap)
    fk.set_max_programs(2)
    try:
        assert fk.get_max_programs() == 2
        out = int_view(poison((37, 20), torch.bfloat16))
        get_kernel("triton_tuned")(table, ids, out, 0, 200)
        assert torch.equal(out, want)
    finally:
        fk.set_max_programs(None)
    bound = fk.make_tuned_kernel(max_programs=1, config=fk.TunedConfig(rows=2, num_warps=1))
    out = int_view(poison((37, 20), torch.bfloat16))
    bound(table, ids, out, 0, 200)
    assert torch.equal(out, want)
    with pytest.raises(ValueError):
        fk.set_max_programs(0)
    assert fk.max_programs_for_grid_frac(1.0) is None
    assert fk.max_programs_for_grid_frac(0.5) >= 1


def test_tuned_kernel_widens_words_and_chunks_columns():
    assert fk._widest_word(160, torch.empty(4, dtype=torch.int64)) == torch.int64
    assert fk._widest_word(12, torch.empty(4, dtype=torch.int64)) == torch.int32
    assert fk._widest_word(3, torch.empty(4, dtype=torch.int64)) == torch.int8
    assert fk.block_words(20) == 8  # 3 chunks of 8 words: a sixth of the lanes idle
    assert fk.block_words(32) == 32
    assert fk.block_words(320) == 128  # 3 chunks, 64 of 384 lanes idle
    assert fk.block_words(3) == 4
    for words in (1, 3, 5, 20, 32, 100, 320, 640):
        assert fk.default_config(words) in fk.candidate_configs(words)
        for cfg in fk.candidate_configs(words):
            tile = cfg.rows * fk.block_words(words)
            assert tile <= cfg.num_warps * 32 * fk.MAX_WORDS_PER_THREAD
        b = fk.block_words(words)
        chunks = -(-words // b)
        assert (chunks * b - words) * 4 <= chunks * b


def test_tuned_kernel_with_cache_reads_hits_from_cache():
    full = random_table(100, 16, torch.float16, seed=2)
    table = int_view(full)
    cache = int_view(random_table(3, 16, torch.float16, seed=9))  # deliberately NOT the table's rows
    ids = torch.tensor([5, 6, 7, 8, 120, 5])
    slots = torch.tensor([2, -1, 0, -1, -1, 2])
    out = int_view(poison((6, 16), torch.float16))
    fk.tuned_lookup(table, ids, out, 0, 100, cache=cache, slots=slots)
    want = reference(full, ids, 0, 100)
    want[0], want[2], want[5] = cache[2], cache[0], cache[2]
    assert torch.equal(out, want)


# ----------------------------------------------------------------- dedup


def test_dedup_plan_and_many_repeats():
    ids = torch.tensor([7, 3, 7, 7, 900, 3, 3, 7, 15, 900] * 5)
    unique, inverse = fk.dedup_plan(ids)
    distinct = torch.unique(ids)
    assert torch.equal(unique[: distinct.numel()], distinct)
    assert bool((unique[distinct.numel():] == -1).all())
    assert torch.equal(unique[inverse], ids)
    full = random_table(VOCAB, 24, torch.bfloat16, seed=4)
    for start, end in ((0, VOCAB), (0, 10), (10, 500)):
        table = int_view(full[start:end].contiguous())
        want = reference(full, ids, start, end)
        for name in ("dedup_triton", "dedup_torch", "dedup:triton_reference"):
            out = int_view(poison((ids.numel(), 24), torch.bfloat16))
            get_kernel(name)(table, ids, out, start, end)
            assert torch.equal(out, want), (name, start)


def test_dedup_looks_up_each_distinct_id_once():
    seen = []

    def spy(table, flat_ids, out, vocab_start, vocab_end):
        seen.append(flat_ids.clone())
        get_kernel("torch_masked")(table, flat_ids, out, vocab_start, vocab_end)

    kernel = fk.make_dedup_kernel(spy)
    full = random_table(50, 8, torch.float32, seed=6)
    ids = torch.tensor([4, 4, 4, 9, 4, 9, 1] * 6)
    out = int_view(poison((ids.numel(), 8), torch.float32))
    kernel(int_view(full), ids, out, 0, 50)
    assert torch.equal(out, reference(full, ids, 0, 50))
    looked_up = seen[0][seen[0] >= 0]
    assert sorted(looked_up.tolist()) == [1, 4, 9]


# ----------------------------------------------------------------- hot cache


def _hot(cache_rows: int, topo=Topology(), rank=0, dtype="bf16", **kw) -> PinnedHotCacheEmbedding:
    b = PinnedHotCacheEmbedding(VOCAB, 16, dtype=dtype, num_heads=1, max_tokens=64,
                                groups=Groups(topology=topo, rank=rank), device="cpu",
                                cache_rows=cache_rows, **kw)
    b.load_full_table(random_table(VOCAB, 16, b.storage_dtype, seed=11))
    return b


def test_hot_cache_hit_rate_exact():
    b = _hot(cache_rows=2)
    assert b.warm_cache(torch.tensor([420, 420, 9, 9, 5])).tolist() == [9, 420]  # a tie: lower id first
    _hot_one = _hot(cache_rows=1)
    assert _hot_one.warm_cache(torch.tensor([420, 420, 9, 9, 5])).tolist() == [9]
    sample = torch.tensor([17, 17, 17, 420, 420, 5, 9])  # 17 (x3) and 420 (x2) beat 5 and 9
    assert b.warm_cache(sample).tolist() == [17, 420]
    assert b.cached_ids.tolist() == [17, 420]
    ids = torch.tensor([[17], [3], [420], [17], [999], [0], [8], [421]])  # 3 hits of 8
    b.lookup(ids)
    assert b.last_hit_rate == 3 / 8
    b.lookup(torch.tensor([[420], [1]]))  # 1 hit of 2
    assert b.last_hit_rate == 1 / 2
    st = b.stats()
    assert (st["hits"], st["ids_owned"], st["lookups"], st["cached_rows"]) == (4, 10, 2, 2)
    assert st["hit_rate"] == 4 / 10
    b.reset_stats()
    assert b.stats()["hits"] == 0


def test_hot_cache_hit_rate_counts_owned_ids_on_a_shard():
    topo = Topology(tp=4, etp=4, dp=1)
    b = _hot(cache_rows=1, topo=topo, rank=1)  # rows 256..511
    assert b.warm_cache(torch.tensor([300, 300, 10, 10, 10])).tolist() == [300]
    ids = torch.tensor([[300], [301], [10], [300], [700]])  # owned: 300, 301, 300 -> 2 hits of 3
    rows = b.lookup(ids)
    assert b.last_hit_rate == 2 / 3
    assert bool((int_view(rows[2]) == 0).all()) and bool((int_view(rows[4]) == 0).all())


def test_hot_cache_fallback_and_fill():
    b = _hot(cache_rows=4)
    assert b.cached_ids.tolist() == [0, 1, 2, 3]  # no sample yet: the shard's first rows
    assert b.warm_cache(torch.tensor([50, 50, 2])).tolist() == [0, 1, 2, 50]  # 50, 2, then lowest free
    b0 = _hot(cache_rows=0)
    b0.lookup(torch.tensor([[1], [2]]))
    assert b0.last_hit_rate == 0.0 and b0.stats()["cached_rows"] == 0


def test_hot_cache_is_refreshed_when_the_table_changes():
    b = _hot(cache_rows=3)
    b.warm_cache(torch.tensor([10, 20, 30]))
    new = random_table(VOCAB, 16, b.storage_dtype, seed=99)
    b.load_full_table(new)
    ids = torch.tensor([[10], [20], [30], [40]])
    got = b.lookup(ids)
    assert b.last_hit_rate == 3 / 4
    assert torch.equal(int_view(got), reference(new, ids, 0, VOCAB))
    b.fill_synthetic(seed=3)
    from ple_bench.backends.synthetic import synthetic_rows

    got = b.lookup(ids)
    assert torch.equal(got.view(torch.int16), synthetic_rows(ids.reshape(-1), 16, 3, b.storage_dtype).view(torch.int16))


def test_hot_cache_rejects_bad_size():
    with pytest.raises(ValueError):
        _hot(cache_rows=-1)


# ----------------------------------------------------------------- cpu gather


def test_cpu_gather_prefetch_then_finalize_and_threads(monkeypatch):
    seen = []
    original = torch.index_select

    def spy(*args, **kwargs):  # the thread count torch uses for each gather
        seen.append(torch.get_num_threads())
        return original(*args, **kwargs)

    monkeypatch.setattr(torch, "index_select", spy)
    main_threads = torch.get_num_threads()
    b = PinnedCPUGatherEmbedding(VOCAB, 32, dtype="fp8", num_heads=2, max_tokens=30, device="cpu",
                                 gather_threads=4)
    b.native = False  # the spy sees the Python steps' index_select (the native call is checked below)
    full = random_table(VOCAB, 32, b.storage_dtype, seed=21)
    b.load_full_table(full)
    first = make_ids(30, 0, VOCAB, seed=1)
    second = make_ids(30, 0, VOCAB, seed=2)
    b.start_prefetch(first)
    b.start_prefetch(second)  # the unfinished first prefetch is dropped, not mixed in
    got = b.finalize()
    assert torch.equal(int_view(got), reference(full, second, 0, VOCAB).reshape(30, 2 * 32))
    with pytest.raises(RuntimeError):
        b.finalize()
    b.start_prefetch(first[:7])
    got = b.finalize()
    assert torch.equal(int_view(got), reference(full, first[:7], 0, VOCAB).reshape(7, 2 * 32))
    with pytest.raises(ValueError):
        b.start_prefetch(make_ids(31, 0, VOCAB, seed=3))
    got = b.lookup(second)  # on this thread: gather_threads too, then this thread's count again
    assert torch.equal(int_view(got), reference(full, second, 0, VOCAB).reshape(30, 2 * 32))
    assert seen and set(seen) == {4}, seen  # one level of parallelism: 4 threads, every gather
    assert torch.get_num_threads() == main_threads
    b.close()
    monkeypatch.undo()
    _native_or_skip()
    n = PinnedCPUGatherEmbedding(VOCAB, 32, dtype="fp8", num_heads=2, max_tokens=30, device="cpu",
                                 gather_threads=main_threads + 3)
    n.load_full_table(full)
    assert torch.equal(int_view(n.lookup(second)), reference(full, second, 0, VOCAB).reshape(30, 2 * 32))
    assert n.stats()["gather_impl"] == "native"
    assert torch.get_num_threads() == main_threads  # the C++ call gives the caller's thread count back
    n.close()


def test_cpu_gather_default_threads_and_bad_value():
    b = PinnedCPUGatherEmbedding(VOCAB, 8, dtype="fp32", max_tokens=4, device="cpu")
    assert b.gather_threads == max(1, min(16, torch.get_num_threads()))
    with pytest.raises(ValueError, match="gather_threads"):
        PinnedCPUGatherEmbedding(VOCAB, 8, dtype="fp32", max_tokens=4, device="cpu", gather_threads=-1)


def test_cpu_gather_surfaces_worker_errors():
    b = PinnedCPUGatherEmbedding(VOCAB, 8, dtype="fp32", max_tokens=4, device="cpu")
    b.load_full_table(random_table(VOCAB, 8, torch.float32, seed=1))
    b.native = False  # the Python steps call host_gather (the native call's errors: the direct-path test)

    def boom(*a, **k):
        raise RuntimeError("gather failed")

    b.host_gather = boom
    b.start_prefetch(torch.tensor([[1], [2]]))
    with pytest.raises(RuntimeError, match="gather failed"):
        b.finalize()


# ----------------------------------------------------------------- registry


def test_paths_are_registered_by_name():
    assert {"pinned_cpu_gather", "pinned_hot_cache"} <= set(backend_names())
    names = set(kernel_names())
    assert {"torch_uva", "triton_tuned", "dedup_triton", "dedup_torch",
            "dedup:triton_tuned", "dedup:triton_reference", "dedup:torch_masked"} <= names
    assert get_backend("pinned_cpu_gather") is PinnedCPUGatherEmbedding
    assert get_backend("pinned_hot_cache") is PinnedHotCacheEmbedding


def test_executor_hot_cache_hits_on_fresh_zipf_id_sets():
    """The runner warms the cache from an independent sample and times fresh id
    sets: with Zipf ids the hot rows are the table's, so the cache must hit
    (a cache warmed on rows that the measured sets never touch would report ~0)."""
    from ple_bench.spec.case import Case
    from ple_bench.run.executor import CaseExecutor
    from ple_bench.measure import TimingPolicy

    # 64 ids a lookup: the tuned kernel runs under the Triton interpreter on a CPU, one program per
    # few rows (1 024 ids took 23 s of the quick tier); 3 id sets of 64 still put a cache that
    # missed the hot rows far below 0.3
    case = Case(impl="pinned_hot_cache", vocab_size=400_000, dim=16, dtype="fp8", num_heads=4,
                num_tokens=16, ids="zipf:1.1", cache_rows=4000)
    pol = TimingPolicy(min_samples=1, max_samples=2, min_time_s=0.0, max_time_s=0.05, id_sets=3)
    rec = CaseExecutor(device=torch.device("cpu")).run(case, pol)
    assert rec["cache_hit_rate"] > 0.3, rec["cache_hit_rate"]
    uniform = CaseExecutor(device=torch.device("cpu")).run(
        Case(**{**case.axes(), "ids": "uniform", "extra": ()}), pol)
    assert uniform["cache_hit_rate"] < 0.1  # 1 % of the rows cached: uniform ids rarely hit


def _native_or_skip():
    """The native module; a skip only where this machine cannot build it (no compiler or
    ninja, or switched off), a failure where the build itself fails."""
    from ple_bench.backends.cuda.native import host_gather_module, native_status

    if host_gather_module() is None:
        if native_status().startswith("build failed"):
            pytest.fail(native_status())
        pytest.skip(f"native host gather: {native_status()}")


@pytest.mark.parametrize("id_dtype", [torch.int64, torch.int32])
def test_cpu_gather_direct_path_equals_the_general_path(id_dtype):
    """The direct path (one rank, host ids, deferred) -- in one C++ call and in its
    Python steps -- and the general one give the same bytes for lookup, prefetch into
    a fresh output and prefetch into ``out=``."""
    _native_or_skip()
    heads, dim, tokens = 3, 8, 5
    paths = []
    for direct, native in ((True, True), (True, False), (False, False)):
        b = PinnedCPUGatherEmbedding(VOCAB, dim, dtype="fp8", num_heads=heads, max_tokens=tokens, device="cpu")
        b.fill_synthetic(7, scale=0.5)
        b.direct, b.native = direct, native
        paths.append(b)
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        ids = torch.randint(0, VOCAB, (tokens, heads), generator=gen).to(id_dtype)
        got = []
        for b in paths:
            a = b.lookup(ids)
            b.start_prefetch(ids)
            p = b.finalize()
            out = torch.empty_like(a)
            out.view(torch.uint8).fill_(0x7F)  # poison
            b.start_prefetch(ids)
            q = b.finalize(out=out)
            assert q is out
            got.append([t.view(torch.uint8).clone() for t in (a, p, q)])
        w = paths[2].weight
        ref = w.view(torch.uint8).view(w.shape[0], -1)[ids.reshape(-1).long()].reshape(tokens, -1)
        for results in got:
            for t in results:
                assert torch.equal(t, ref)
    assert [b.stats()["gather_impl"] for b in paths] == ["native", "python", "general"]
    assert callable(paths[0]._fast_lookup) and paths[1]._fast_lookup is False  # the closure ran the native lookups
    assert paths[0].host_thread_s > 0 and paths[1].host_thread_s > 0  # the direct path counts its host work too
    for b in paths[:2]:  # an id past the allocated table is refused, not read, in a lookup and a prefetch
        bad = torch.full((tokens, heads), paths[0].weight.shape[0], dtype=id_dtype)
        with pytest.raises(IndexError):
            b.lookup(bad)
        b.start_prefetch(bad)
        with pytest.raises(IndexError):
            b.finalize()
    with pytest.raises(ValueError, match="contiguous"):
        paths[0].start_prefetch(ids)
        paths[0].finalize(out=torch.empty(tokens, heads * dim + 1, dtype=paths[0].storage_dtype))


def test_native_build_name_follows_its_source(tmp_path, monkeypatch):
    """Two versions of host_gather.cpp get two builds in the shared extension cache: a process
    of one checkout never loads (or rebuilds over) the other's."""
    from ple_bench.backends.cuda import native

    names = []
    for text in ("// one", "// two", "// one"):
        src = tmp_path / "host_gather.cpp"
        src.write_text(text)
        monkeypatch.setattr(native, "SOURCE", src)
        names.append(native._module_name())
    assert names[0] == names[2] != names[1] and names[0].startswith("ple_bench_host_gather_")


@pytest.mark.parametrize("id_dtype", [torch.int64, torch.int32])
def test_native_row_loop_equals_index_select(id_dtype):
    """The native call's own row loop (every task size, and index_select itself:
    grain 0) gives the rows of the reference, for contiguous and strided ids. A negative
    id or one past the table is refused: the call returns -1 (the module throws nothing:
    host_gather.cpp) and ``error()`` names the id, which ``native_error`` makes an
    IndexError; bad arguments come back as ValueError the same way."""
    _native_or_skip()
    from ple_bench.backends.cuda.native import native_error, new_host_gather

    rows, row_bytes, n = 5000, 40, 997
    table = torch.randint(0, 256, (rows, row_bytes), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
    g = new_host_gather(table, torch.uint8, "cpu", row_bytes, max(1, torch.get_num_threads()), 0, 0, 0, 0)
    ids = torch.randint(0, rows, (n, 2), generator=torch.Generator().manual_seed(6)).to(id_dtype)
    strided = torch.randint(0, rows, (2, n), generator=torch.Generator().manual_seed(7)).to(id_dtype).t()
    assert not strided.is_contiguous()
    assert g.grain() == 64 and g.error() == ["", ""]  # the default, no failure yet
    for grain in (0, 1, 7, 64, 4096):
        assert g.configure(grain) and g.grain() == grain
        for x in (ids, strided):
            out = torch.full((2 * n, row_bytes), 0x7F, dtype=torch.uint8)
            assert g.rows(x, out, 0) >= 0
            assert torch.equal(out, table[x.reshape(-1).long()]), grain
        for bad_id in (-1, rows):
            bad = ids.clone()
            bad[n // 2, 1] = bad_id
            assert g.rows(bad, torch.empty(2 * n, row_bytes, dtype=torch.uint8), 0) == -1
            err = native_error(g)
            assert isinstance(err, IndexError) and (f"index {bad_id} " in str(err) or grain == 0), str(err)
    assert not g.configure(-1) and isinstance(native_error(g), ValueError) and g.grain() == 4096
    assert g.rows(ids, torch.empty(3, dtype=torch.uint8), 0) == -1 and "out must be" in str(native_error(g))
    assert g.rows(ids.float(), torch.empty(2 * n, row_bytes, dtype=torch.uint8), 0) == -1
    assert g.lookup(ids.view(-1), 0) is None and "[tokens, heads]" in str(native_error(g))
    with pytest.raises(ValueError, match="contiguous uint8"):
        new_host_gather(table.t(), torch.uint8, "cpu", row_bytes, 1, 0, 0, 0, 0)