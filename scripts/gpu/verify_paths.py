"""GPU check and small sweep of the alternative lookup paths (run from the repo root):

    PYTHONPATH=. python3 scripts/gpu/verify_paths.py [--sizes-gib 4 32] [--skip-sweep]

Prints PASS / FAIL / INFO lines and tables; exits 1 if any FAIL.  About two to
three minutes on an H200 (most of it Triton compiles, pinning and filling the
32 GiB tables).

1. Correctness on CUDA, bit-exact against ``synthetic_rows``: every path
   (triton_reference, torch_uva, triton_tuned, dedup_triton, dedup_torch,
   pinned_cpu_gather, pinned_hot_cache) x fp32/fp16/bf16/fp8 x dims
   80/160/128/1280 (+ 3 and 100 for the tuned kernel), synchronous lookup and
   start_prefetch/finalize (poisoned outputs), single rank and simulated ETP=4
   shards (TP=ETP=4, no process group: the local rows, zeros elsewhere); every
   tuned-kernel candidate config with and without a grid cap.
2. A small sweep: pinned tables of 4 and 32 GiB, fp8 dim 160 and bf16 dim 128,
   4096 and 65536 ids, uniform and zipf(1.1); per path the median lookup time
   (CUDA events, after warm-up), GB/s (ids x row bytes / time), Mrows/s, and % of
   the pinned host->device copy ceiling (1 GiB copy measured here).  Every
   measured lookup is also checked bit-exactly.  Autotune winners printed.
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import time

import torch

from ple_bench.backends import fast_kernels as fk
from ple_bench.backends.extra_paths import PinnedCPUGatherEmbedding, PinnedHotCacheEmbedding
from ple_bench.backends.formats import DTYPES, int_view
from ple_bench.backends.pinned import PinnedUVAEmbedding
from ple_bench.backends.synthetic import synthetic_rows
from ple_bench.parallel import Groups, Topology

SEED = 7
failures: list[str] = []

# name -> (backend class, constructor kwargs)
PATHS: dict[str, tuple[type, dict]] = {
    "triton_reference": (PinnedUVAEmbedding, {"kernel": "triton_reference"}),
    "torch_uva": (PinnedUVAEmbedding, {"kernel": "torch_uva"}),
    "triton_tuned": (PinnedUVAEmbedding, {"kernel": "triton_tuned"}),
    "dedup_triton": (PinnedUVAEmbedding, {"kernel": "dedup_triton"}),
    "dedup_torch": (PinnedUVAEmbedding, {"kernel": "dedup_torch"}),
    "cpu_gather": (PinnedCPUGatherEmbedding, {}),
    "hot_cache": (PinnedHotCacheEmbedding, {"cache_rows": 4096}),
}


def verdict(ok: bool | None, what: str) -> None:
    tag = "INFO" if ok is None else ("PASS" if ok else "FAIL")
    if ok is False:
        failures.append(what)
    print(f"{tag}: {what}", flush=True)


def sharing(cls: type, weight: torch.Tensor) -> type:
    """``cls`` whose table is ``weight`` (one pinned table shared by every path)."""
    return type(f"Shared{cls.__name__}", (cls,), {"allocate_table": lambda self, r, d, dt: weight})


def expected(ids: torch.Tensor, dim: int, dtype: torch.dtype, start: int, end: int) -> torch.Tensor:
    flat = ids.reshape(-1)
    rows = int_view(synthetic_rows(flat, dim, SEED, dtype))
    owned = (flat >= start) & (flat < end)
    return torch.where(owned.unsqueeze(1), rows, torch.zeros_like(rows))


def same(rows: torch.Tensor, want: torch.Tensor) -> bool:
    return torch.equal(int_view(rows).reshape(want.shape), want)


# ----------------------------------------------------------------- correctness


def check_correctness(dev: torch.device, tokens: int = 256, dims=(80, 160, 128, 1280)) -> None:
    vocab, heads = 20000, 2  # 2 x 256 ids: below the tuner's threshold (no tuning here)
    gen = torch.Generator(device=dev).manual_seed(1)
    for dtype_name, dtype in DTYPES.items():
        for dim in dims:
            topologies = [("single", Topology(), 0)]
            if dim == 160:
                topologies += [("etp4_r1", Topology(tp=4, etp=4, dp=1), 1),
                               ("etp4_r3", Topology(tp=4, etp=4, dp=1), 3)]
            for label, topo, rank in topologies:
                groups = Groups(topology=topo, rank=rank)
                base = PinnedUVAEmbedding(vocab, dim, dtype=dtype_name, num_heads=heads,
                                          max_tokens=tokens, groups=groups, device=dev)
                base.fill_synthetic(SEED)
                s = base.shard
                ids = torch.randint(0, vocab, (tokens, heads), device=dev, generator=gen)
                ids[:8] = ids[8:16]  # repeats
                ids.view(-1)[16:20] = torch.tensor([s.vocab_start, s.vocab_end - 1, 0, vocab - 1])
                want = expected(ids, dim, dtype, s.vocab_start, s.vocab_end)
                bad = []
                for path, (cls, kw) in PATHS.items():
                    b = sharing(cls, base.weight)(vocab, dim, dtype=dtype_name, num_heads=heads,
                                                  max_tokens=tokens, groups=groups, device=dev, **kw)
                    if isinstance(b, PinnedHotCacheEmbedding):
                        b.warm_cache(ids[: tokens // 2])  # half the ids hit
                    try:
                        ok_sync = same(b.lookup(ids), want)
                        b.start_prefetch(ids)
                        out = torch.empty(tokens, heads * dim, dtype=dtype, device=dev)
                        int_view(out).fill_(-3)
                        ok_pf = same(b.finalize(out), want)
                        if dev.type == "cuda":
                            torch.cuda.synchronize(dev)
                    except Exception as exc:  # a crash is a failure of that path, not of the script
                        ok_sync = ok_pf = False
                        print(f"  {path}: {type(exc).__name__}: {exc}")
                    if not (ok_sync and ok_pf):
                        bad.append(f"{path}(sync={ok_sync},prefetch={ok_pf})")
                    if isinstance(b, PinnedHotCacheEmbedding) and ok_sync:
                        rate = b.last_hit_rate
                        if not rate > 0:
                            bad.append(f"hot_cache hit rate {rate}")
                    b.close()
                base.close()
                verdict(not bad, f"paths {dtype_name} dim {dim} {label}: "
                                 + ("all bit-exact (lookup + prefetch)" if not bad else " ".join(bad)))

    # The tuned kernel directly: odd dims, and every candidate config with/without grid cap.
    for dtype_name, dim in (("fp32", 3), ("fp8", 3), ("bf16", 100), ("fp16", 1280)):
        dtype = DTYPES[dtype_name]
        check_tuned_configs(dev, dtype, dim, all_configs=False)
    for dtype_name, dim in (("fp8", 160), ("bf16", 128)):  # the sweep's shapes: compiles reused there
        check_tuned_configs(dev, DTYPES[dtype_name], dim, all_configs=True)


def check_tuned_configs(dev, dtype, dim, all_configs: bool, n: int = 777) -> None:
    from ple_bench.backends.uva import cuda_view_of_pinned

    rows = 5000
    on_gpu = dev.type == "cuda"
    host = torch.empty(rows, dim, dtype=dtype, pin_memory=on_gpu)
    host.copy_(synthetic_rows(torch.arange(rows, device=dev), dim, SEED, dtype).cpu())
    table = int_view(cuda_view_of_pinned(host, dev) if on_gpu else host)
    start, end = 1000, 4000
    shard = table[start:end]
    ids = torch.randint(0, rows, (n,), device=dev)
    want = expected(ids, dim, dtype, start, end)
    row_bytes = dim * host.element_size()
    word = fk._widest_word(row_bytes, shard)
    words = row_bytes // torch.empty((), dtype=word).element_size()
    configs = fk.candidate_configs(words) if all_configs else [fk.default_config(words)]
    bad = []
    for cfg in configs:
        for cap in (None, 7):
            out = torch.full((n, dim), -3, dtype=table.dtype, device=dev)
            fk.tuned_lookup(shard, ids, out, start, end, config=cfg, max_programs=cap)
            if not torch.equal(out, want):
                bad.append(f"{cfg} cap={cap}")
    # the dedup wrapper and the cache variant on the same data
    out = torch.full((n, dim), -3, dtype=table.dtype, device=dev)
    fk.make_dedup_kernel("triton_tuned")(shard, ids, out, start, end)
    if not torch.equal(out, want):
        bad.append("dedup")
    cache_rows = torch.tensor([1000, 1500, 3999], device=dev)
    cache = table[cache_rows].clone()
    slots = torch.full_like(ids, -1)
    for i, r in enumerate(cache_rows.tolist()):
        slots[ids == r] = i
    ids[:3] = cache_rows
    slots[:3] = torch.arange(3, device=dev)
    want = expected(ids, dim, dtype, start, end)
    out = torch.full((n, dim), -3, dtype=table.dtype, device=dev)
    fk.tuned_lookup(shard, ids, out, start, end, cache=cache, slots=slots,
                    config=fk.default_config(words))
    if not torch.equal(out, want):
        bad.append("cache")
    verdict(not bad, f"triton_tuned {str(dtype).replace('torch.', '')} dim {dim} ({words} x {word}): "
                     f"{len(configs)} config(s) x cap None/7 + dedup + cache "
                     + ("bit-exact" if not bad else "FAILED: " + ", ".join(bad)))


# ----------------------------------------------------------------- sweep


def median_ms(fn, warmup: int = 3, reps: int = 15) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def h2d_ceiling_gbs(dev) -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    src.fill_(1)
    dst = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    ms = median_ms(lambda: dst.copy_(src, non_blocking=True), warmup=2, reps=5)
    del src, dst
    return (1 << 30) / (ms * 1e-3) / 1e9


def zipf_ids(n: int, vocab: int, a: float, gen: torch.Generator, dev) -> torch.Tensor:
    """Zipf(a) ranks (inverse CDF of the continuous power law, rank 1 hottest),
    scattered over the vocabulary by an affine bijection mod ``vocab``."""
    u = torch.rand(n, generator=gen, device=dev, dtype=torch.float64)
    if abs(a - 1.0) < 1e-9:
        r = torch.exp(u * math.log(vocab))
    else:
        r = ((vocab ** (1 - a) - 1) * u + 1) ** (1 / (1 - a))
    rank = r.floor().to(torch.int64).clamp_(1, vocab) - 1
    mult = 2654435761
    while math.gcd(mult, vocab) != 1:
        mult += 2
    return ((rank * mult + 12345) % vocab).reshape(n, 1)


def make_ids(dist: str, n: int, vocab: int, seed: int, dev) -> torch.Tensor:
    gen = torch.Generator(device=dev).manual_seed(seed)
    if dist == "uniform":
        return torch.randint(0, vocab, (n, 1), device=dev, generator=gen)
    return zipf_ids(n, vocab, float(dist.removeprefix("zipf")), gen, dev)


SWEEP_PATHS = ["triton_reference", "torch_uva", "triton_tuned", "dedup_triton", "cpu_gather", "hot_cache"]
SWEEP_CACHE_ROWS = 1 << 18
SWEEP_IDS = (4096, 65536)


def sweep(dev, sizes_gib: list[float]) -> None:
    ceiling = h2d_ceiling_gbs(dev)
    verdict(None, f"pinned host->device copy ceiling (1 GiB): {ceiling:.1f} GB/s")
    header = (f"{'table':>6} {'fmt':>5} {'dim':>4} {'ids':>6} {'dist':>8} {'path':>16} "
              f"{'ms':>8} {'GB/s':>7} {'Mrows/s':>8} {'%H2D':>6} {'uniq%':>6} {'hit%':>6}")
    lines = [header, "-" * len(header)]
    print(header, flush=True)
    for size in sizes_gib:
        for fmt, dim in (("fp8", 160), ("bf16", 128)):
            sweep_table(dev, size, fmt, dim, ceiling, lines)
            gc.collect()  # the table's last references die with sweep_table's frame
            torch.cuda.empty_cache()
    print("\n" + "\n".join(lines))


def sweep_table(dev, size: float, fmt: str, dim: int, ceiling: float, lines: list[str]) -> None:
    dtype = DTYPES[fmt]
    row_bytes = dim * torch.empty((), dtype=dtype).element_size()
    vocab = int(size * (1 << 30)) // row_bytes
    t0 = time.perf_counter()
    base = PinnedUVAEmbedding(vocab, dim, dtype=fmt, max_tokens=0, padding_size=1, device=dev)
    t1 = time.perf_counter()
    base.fill_synthetic(SEED)
    t2 = time.perf_counter()
    print(f"  table {size} GiB {fmt} d{dim}: {vocab} rows; pinned alloc {t1 - t0:.1f} s, "
          f"fill {t2 - t1:.1f} s", flush=True)
    backends = {}
    for path in SWEEP_PATHS:
        cls, kw = PATHS[path]
        kw = dict(kw)
        if path == "hot_cache":
            kw["cache_rows"] = SWEEP_CACHE_ROWS
        backends[path] = sharing(cls, base.weight)(
            vocab, dim, dtype=fmt, max_tokens=65536, padding_size=1, device=dev, **kw)
    for n in SWEEP_IDS:
        for dist in ("uniform", "zipf1.1"):
            ids = make_ids(dist, n, vocab, seed=n + len(dist), dev=dev)
            want = expected(ids, dim, dtype, 0, vocab)
            uniq = torch.unique(ids).numel() / n
            backends["hot_cache"].warm_cache(make_ids(dist, 1 << 20, vocab, seed=99, dev=dev))
            for path in SWEEP_PATHS:
                b = backends[path]
                try:
                    ok = same(b.lookup(ids), want)
                except Exception as exc:
                    ok = False
                    print(f"  {path}: {type(exc).__name__}: {exc}")
                if not ok:
                    verdict(False, f"sweep {size}GiB {fmt} n={n} {dist} {path}: wrong rows")
                    continue
                ms = median_ms(lambda: b.lookup(ids))
                gbs = n * row_bytes / (ms * 1e-3) / 1e9
                hit = f"{100 * b.last_hit_rate:6.1f}" if path == "hot_cache" else f"{'':>6}"
                line = (f"{size:>4g}Gi {fmt:>5} {dim:>4} {n:>6} {dist:>8} {path:>16} "
                        f"{ms:8.3f} {gbs:7.1f} {n / ms / 1e3:8.2f} {100 * gbs / ceiling:6.1f} "
                        f"{100 * uniq:6.1f} {hit}")
                lines.append(line)
                print(line, flush=True)
            check_cpu_gather_prefetch(backends["cpu_gather"], ids, want, f"{size}GiB {fmt} n={n} {dist}")
    for b in backends.values():
        b.close()
    base.close()


def check_cpu_gather_prefetch(b, ids, want, label: str) -> None:
    """start_prefetch must hand the gather to its thread and return at once."""
    torch.cuda.synchronize()
    h0 = time.perf_counter()
    b.start_prefetch(ids)
    h1 = time.perf_counter()
    rows = b.finalize()
    torch.cuda.synchronize()
    h2 = time.perf_counter()
    ok = same(rows, want)
    verdict(None if ok else False,
            f"cpu_gather prefetch {label}: start_prefetch returned after {1e3 * (h1 - h0):.3f} ms, "
            f"rows ready at {1e3 * (h2 - h0):.3f} ms" + ("" if ok else " WRONG ROWS"))


def print_tuning() -> None:
    print("\nautotune winners (triton_tuned; medians of 5 launches each):")
    for r in fk.tuning_report():
        print(f"  {r['key']}: {r['best']} {r['best_ms']:.4f} ms | untuned default {r['default']} "
              f"{r['default_ms']:.4f} ms | slowest of {r['candidates']} {r['worst_ms']:.4f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-gib", type=float, nargs="*", default=[4, 32])
    ap.add_argument("--skip-sweep", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("FAIL: no CUDA device")
        return 1
    dev = torch.device("cuda", torch.cuda.current_device())
    print(f"device: {torch.cuda.get_device_name(dev)}, {fk.sm_count(dev)} SMs; torch {torch.__version__}")
    t0 = time.perf_counter()
    check_correctness(dev)
    print(f"correctness: {time.perf_counter() - t0:.1f} s", flush=True)
    if not args.skip_sweep:
        t1 = time.perf_counter()
        sweep(dev, args.sizes_gib)
        print(f"sweep: {time.perf_counter() - t1:.1f} s")
    print_tuning()
    print(f"\ntotal {time.perf_counter() - t0:.1f} s; "
          + (f"{len(failures)} FAIL" if failures else "all PASS"))
    for f in failures:
        print(f"FAIL: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
