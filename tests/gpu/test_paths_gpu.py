"""The alternative lookup paths over one pinned table on a CUDA GPU (was the correctness part of
scripts/gpu/verify_paths.py; its timing sweep was a study, recorded in docs/lookup-paths.md):
every path (triton_reference, torch_uva, triton_tuned, dedup_triton, dedup_torch, pinned_cpu_gather,
pinned_hot_cache) x fp32/fp16/bf16/fp8 x dims 80/160/128/1280, synchronous lookup and
start_prefetch/finalize into a poisoned output, single rank and simulated ETP=4 shards (the local
rows, zeros elsewhere), bit-exact against ``synthetic_rows``; the tuned kernel with odd dims and
every candidate config with and without a grid cap, its dedup wrapper and its cache variant.

``python -m pytest -m gpu tests/gpu``; skipped with the reason elsewhere."""

from __future__ import annotations

import pytest
import torch

from ple_bench.backends import fast_kernels as fk
from ple_bench.backends.pinned_cpu_gather import PinnedCPUGatherEmbedding
from ple_bench.backends.pinned_hot_cache import PinnedHotCacheEmbedding
from ple_bench.backends.formats import DTYPES, int_view
from ple_bench.backends.pinned_uva import PinnedUVAEmbedding
from ple_bench.backends.synthetic import synthetic_rows
from ple_bench.parallel import Groups, Topology
from tests.gpu._helpers import same, sharing
from tests.gpu._helpers import expected as _expected

pytestmark = pytest.mark.gpu

SEED = 7
DEV = torch.device("cuda", 0)
PATHS: dict[str, tuple[type, dict]] = {
    "triton_reference": (PinnedUVAEmbedding, {"kernel": "triton_reference"}),
    "torch_uva": (PinnedUVAEmbedding, {"kernel": "torch_uva"}),
    "triton_tuned": (PinnedUVAEmbedding, {"kernel": "triton_tuned"}),
    "dedup_triton": (PinnedUVAEmbedding, {"kernel": "dedup_triton"}),
    "dedup_torch": (PinnedUVAEmbedding, {"kernel": "dedup_torch"}),
    "cpu_gather": (PinnedCPUGatherEmbedding, {}),
    "hot_cache": (PinnedHotCacheEmbedding, {"cache_rows": 4096}),
}


def expected(ids, dim, dtype, start, end):
    return _expected(ids, dim, dtype, start, end, SEED)


CASES = [(d, dim, "single", 0) for d in DTYPES for dim in (80, 160, 128, 1280)] + \
        [(d, 160, f"etp4_r{r}", r) for d in DTYPES for r in (1, 3)]


@pytest.mark.parametrize("dtype_name,dim,label,rank", CASES)
def test_every_path_bit_exact(dtype_name, dim, label, rank, tokens=256):
    vocab, heads = 20000, 2  # 2 x 256 ids: below the tuner's threshold (no tuning here)
    dtype = DTYPES[dtype_name]
    topo = Topology() if label == "single" else Topology(tp=4, etp=4, dp=1)
    groups = Groups(topology=topo, rank=rank)
    gen = torch.Generator(device=DEV).manual_seed(1)
    base = PinnedUVAEmbedding(vocab, dim, dtype=dtype_name, num_heads=heads, max_tokens=tokens, groups=groups,
                              device=DEV)
    base.fill_synthetic(SEED)
    s = base.shard
    ids = torch.randint(0, vocab, (tokens, heads), device=DEV, generator=gen)
    ids[:8] = ids[8:16]  # repeats
    ids.view(-1)[16:20] = torch.tensor([s.vocab_start, s.vocab_end - 1, 0, vocab - 1])
    want = expected(ids, dim, dtype, s.vocab_start, s.vocab_end)
    bad = []
    for path, (cls, kw) in PATHS.items():
        b = sharing(cls, base.weight)(vocab, dim, dtype=dtype_name, num_heads=heads, max_tokens=tokens,
                                      groups=groups, device=DEV, **kw)
        if isinstance(b, PinnedHotCacheEmbedding):
            b.warm_cache(ids[: tokens // 2])  # half the ids hit
        ok_sync = same(b.lookup(ids), want)
        b.start_prefetch(ids)
        out = torch.empty(tokens, heads * dim, dtype=dtype, device=DEV)
        int_view(out).fill_(-3)
        ok_pf = same(b.finalize(out), want)
        torch.cuda.synchronize(DEV)
        if not (ok_sync and ok_pf):
            bad.append(f"{path}(sync={ok_sync},prefetch={ok_pf})")
        if isinstance(b, PinnedHotCacheEmbedding) and not b.last_hit_rate > 0:
            bad.append(f"hot_cache hit rate {b.last_hit_rate} with half the ids cached")
        b.close()
    base.close()
    assert not bad, f"{dtype_name} dim {dim} {label}: " + " ".join(bad)


@pytest.mark.parametrize("dtype_name,dim,all_configs", [
    ("fp32", 3, False), ("fp8", 3, False), ("bf16", 100, False), ("fp16", 1280, False),
    ("fp8", 160, True), ("bf16", 128, True)])
def test_tuned_kernel_configs_dedup_and_cache(dtype_name, dim, all_configs, n=777):
    from ple_bench.backends.cuda.uva import cuda_view_of_pinned

    dtype = DTYPES[dtype_name]
    rows = 5000
    host = torch.empty(rows, dim, dtype=dtype, pin_memory=True)
    host.copy_(synthetic_rows(torch.arange(rows, device=DEV), dim, SEED, dtype).cpu())
    table = int_view(cuda_view_of_pinned(host, DEV))
    start, end = 1000, 4000
    shard = table[start:end]
    # an own generator: a capture that an earlier test let fail on purpose can leave the default
    # CUDA generator refusing offsets ("Offset increment outside graph capture"), seen on the H200
    gen = torch.Generator(device=DEV)
    gen.manual_seed(dim * 31 + n)
    ids = torch.randint(0, rows, (n,), device=DEV, generator=gen)
    want = expected(ids, dim, dtype, start, end)
    row_bytes = dim * host.element_size()
    word = fk._widest_word(row_bytes, shard)
    words = row_bytes // torch.empty((), dtype=word).element_size()
    configs = fk.candidate_configs(words) if all_configs else [fk.default_config(words)]
    bad = []
    for cfg in configs:
        for cap in (None, 7):
            out = torch.full((n, dim), -3, dtype=table.dtype, device=DEV)
            fk.tuned_lookup(shard, ids, out, start, end, config=cfg, max_programs=cap)
            if not torch.equal(out, want):
                bad.append(f"{cfg} cap={cap}")
    out = torch.full((n, dim), -3, dtype=table.dtype, device=DEV)
    fk.make_dedup_kernel("triton_tuned")(shard, ids, out, start, end)
    if not torch.equal(out, want):
        bad.append("dedup")
    cache_rows = torch.tensor([1000, 1500, 3999], device=DEV)
    cache = table[cache_rows].clone()
    slots = torch.full_like(ids, -1)
    for i, r in enumerate(cache_rows.tolist()):
        slots[ids == r] = i
    ids[:3] = cache_rows
    slots[:3] = torch.arange(3, device=DEV)
    want = expected(ids, dim, dtype, start, end)
    out = torch.full((n, dim), -3, dtype=table.dtype, device=DEV)
    fk.tuned_lookup(shard, ids, out, start, end, cache=cache, slots=slots, config=fk.default_config(words))
    if not torch.equal(out, want):
        bad.append("cache")
    assert not bad, f"triton_tuned {dtype_name} dim {dim} ({words} x {word}), {len(configs)} config(s): {bad}"
