"""GPU check of the copy-engine lookup path ``pinned_copy_engine`` (run from the repo root):

    PYTHONPATH=. python3 scripts/gpu/verify_copy_engine.py [--table-gib 4] [--skip-timing]

Prints PASS / FAIL / INFO lines and tables; exits 1 if any FAIL.  Under two
minutes on an H200 (most of it pinning and filling the 4 GiB table).

1. Mechanisms: the ``cuda.bindings`` version, CUDA runtime/driver versions,
   whether ``cudaMemcpyBatchAsync`` exists, the mechanism ``auto`` picks and
   why the others were passed over.
2. Correctness on CUDA, bit-exact against ``synthetic_rows``: every available
   mechanism (memcpy_batch, memcpy_loop, torch_row_copies) x fp32/fp16/bf16/fp8
   x dims 80/160, single rank and simulated ETP=4 shards (TP=ETP=4: local rows,
   zeros elsewhere), synchronous lookup and start_prefetch/finalize with the
   output and the prefetch buffer poisoned; a batch split into several calls.
3. Timing, 4 GiB pinned table, fp8 dim 160 (160 B rows), uniform ids,
   1024 / 4096 / 65536 rows, CUDA events (medians): ``pinned_uva`` (reference
   Triton kernel) vs ``pinned_copy_engine`` per mechanism -- the synchronous
   lookup (ids D2H + host address list + copies), prefetch+finalize, and the
   copies alone (ids already on the host) with the host time to issue them.
4. Overlap: a bf16 matmul chain on the main stream, alone and with the row
   copies running beside it on a side stream (both released by one GPU event,
   so the host's issue time is out of the picture): the chain's slowdown.  The
   same with pinned_uva's lookup kernel beside it, for contrast (it uses SMs).
   FAIL if the copy engines slow the chain by more than 5%.
5. Which GPU activity one batch of copies produces (torch.profiler): kernels
   vs memcpy/memset records (INFO).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

import torch

from ple_bench.backends import copy_engine as ce
from ple_bench.backends.copy_engine import PinnedCopyEngineEmbedding
from ple_bench.backends.formats import DTYPES, int_view
from ple_bench.backends.pinned import PinnedUVAEmbedding
from ple_bench.backends.synthetic import synthetic_rows
from ple_bench.parallel import Groups, Topology

SEED = 7
MAX_SLOWDOWN = 0.05
failures: list[str] = []


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


# ----------------------------------------------------------------- 1. mechanisms
def report_mechanisms(dev) -> list[str]:
    info = ce.bindings_info()
    verdict(None, f"torch {torch.__version__} (CUDA {torch.version.cuda}); cuda.bindings {info['bindings']}; "
                  f"runtime {info['runtime_version']}, driver {info['driver_version']}; "
                  f"cudaMemcpyBatchAsync in the bindings: {info['has_memcpy_batch']}")
    b = PinnedCopyEngineEmbedding(1000, 80, dtype="bf16", max_tokens=8, device=dev)
    verdict(None, f"auto picks copy_mechanism={b.copy_mechanism!r}"
                  + (f"; passed over: {' | '.join(b.mechanism_notes)}" if b.mechanism_notes else ""))
    if b.copy_mechanism != "memcpy_batch":
        verdict(None, "the batched copy engine path is NOT what runs here (see above): install cuda-bindings "
                      ">= 12.8 with a CUDA >= 12.8 driver to measure it")
    b.close()
    candidates, _ = ce.candidate_mechanisms(ce.load_runtime())
    return candidates


# ----------------------------------------------------------------- 2. correctness
def check_correctness(dev, mechanisms: list[str], tokens: int = 64, heads: int = 2) -> None:
    vocab = 20000
    gen = torch.Generator(device=dev).manual_seed(1)
    for mech in mechanisms:
        for dtype_name, dtype in DTYPES.items():
            for dim in (80, 160):
                bad = []
                for label, topo, rank in (("single", Topology(), 0),
                                          ("etp4_r1", Topology(tp=4, etp=4, dp=1), 1),
                                          ("etp4_r3", Topology(tp=4, etp=4, dp=1), 3)):
                    groups = Groups(topology=topo, rank=rank)
                    try:
                        b = PinnedCopyEngineEmbedding(vocab, dim, dtype=dtype_name, num_heads=heads,
                                                      max_tokens=tokens, groups=groups, device=dev,
                                                      copy_mechanism=mech)
                        b.fill_synthetic(SEED)
                        s = b.shard
                        ids = torch.randint(0, vocab, (tokens, heads), device=dev, generator=gen)
                        ids[:8] = ids[8:16]  # repeats
                        ids.view(-1)[16:20] = torch.tensor([s.vocab_start, s.vocab_end - 1, 0, vocab - 1])
                        want = expected(ids, dim, dtype, s.vocab_start, s.vocab_end)
                        ok_sync = same(b.lookup(ids), want)
                        b.prepare_prefetch().view(torch.uint8).fill_(0x7F)
                        b.start_prefetch(ids)
                        out = torch.empty(tokens, heads * dim, dtype=dtype, device=dev)
                        out.view(torch.uint8).fill_(0x7F)
                        ok_pf = same(b.finalize(out), want)
                        torch.cuda.synchronize(dev)
                        b.close()
                    except Exception as exc:  # a crash is a failure of that mechanism, not of the script
                        ok_sync = ok_pf = False
                        print(f"  {mech} {dtype_name} d{dim} {label}: {type(exc).__name__}: {exc}")
                    if not (ok_sync and ok_pf):
                        bad.append(f"{label}(sync={ok_sync},prefetch={ok_pf})")
                verdict(not bad, f"{mech} {dtype_name} dim {dim}: "
                                 + ("bit-exact (lookup + prefetch, single + ETP=4 shards)" if not bad else " ".join(bad)))
    if "memcpy_batch" in mechanisms:  # a batch split over several cudaMemcpyBatchAsync calls
        old = ce.BATCH_CHUNK
        ce.BATCH_CHUNK = 100
        try:
            b = PinnedCopyEngineEmbedding(vocab, 160, dtype="fp8", num_heads=1, max_tokens=1000, device=dev,
                                          copy_mechanism="memcpy_batch")
            b.fill_synthetic(SEED)
            ids = torch.randint(0, vocab, (1000, 1), device=dev, generator=gen)
            verdict(same(b.lookup(ids), expected(ids, 160, DTYPES["fp8"], 0, vocab)),
                    "memcpy_batch in 10 calls of 100 copies: bit-exact")
            b.close()
        finally:
            ce.BATCH_CHUNK = old


# ----------------------------------------------------------------- 3. timing
def event_ms(fn, iters: int, warmup: int = 2) -> tuple[float, float]:
    """Median CUDA-event time of ``fn`` on the current stream, and median host wall time."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    gpu, host = [], []
    for _ in range(iters):
        a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        h0 = time.perf_counter()
        a.record()
        fn()
        z.record()
        h1 = time.perf_counter()
        z.synchronize()
        gpu.append(a.elapsed_time(z))
        host.append(1e3 * (h1 - h0))
    return statistics.median(gpu), statistics.median(host)


def iters_for(mech: str, n: int) -> int:
    if mech == "torch_row_copies":
        return 3
    if mech == "memcpy_loop":
        return 3 if n > 8192 else 8
    return 20


def timing(dev, table_gib: float, mechanisms: list[str]) -> dict:
    fmt, dim = "fp8", 160
    dtype = DTYPES[fmt]
    row_bytes = dim
    vocab = int(table_gib * (1 << 30)) // row_bytes
    t0 = time.perf_counter()
    base = PinnedUVAEmbedding(vocab, dim, dtype=fmt, max_tokens=65536, padding_size=1, device=dev)
    t1 = time.perf_counter()
    base.fill_synthetic(SEED)
    torch.cuda.synchronize()
    verdict(None, f"table {table_gib} GiB {fmt} d{dim}: {vocab} rows; pinned alloc {t1 - t0:.1f} s, "
                  f"fill {time.perf_counter() - t1:.1f} s")
    paths = {m: sharing(PinnedCopyEngineEmbedding, base.weight)(
        vocab, dim, dtype=fmt, max_tokens=65536, padding_size=1, device=dev, copy_mechanism=m)
        for m in mechanisms}
    header = (f"{'rows':>6} {'path':>30} {'lookup ms':>10} {'prefetch ms':>12} {'copies ms':>10} "
              f"{'issue ms':>9} {'host thr ms':>11} {'GB/s copies':>11}")
    lines = [header, "-" * len(header)]
    print(header, flush=True)
    gen = torch.Generator(device=dev).manual_seed(3)
    keep = {}
    for n in (1024, 4096, 65536):
        ids = torch.randint(0, vocab, (n, 1), device=dev, generator=gen)
        want = expected(ids, dim, dtype, 0, vocab)
        out = torch.empty(n, 1, dim, dtype=dtype, device=dev)
        ok = same(base.lookup(ids), want)
        look, _ = event_ms(lambda: base.lookup(ids), 20)
        pf, _ = event_ms(lambda: (base.start_prefetch(ids), base.finalize()), 20)
        kern, _ = event_ms(lambda: base.local_lookup(ids, out=out), 20)
        line = (f"{n:>6} {'pinned_uva triton_reference':>30} {look:10.3f} {pf:12.3f} {kern:10.3f} "
                f"{'':>9} {'':>11} {n * row_bytes / kern / 1e6:11.2f}")
        lines.append(line)
        print(line, flush=True)
        if not ok:
            verdict(False, f"pinned_uva n={n}: wrong rows")
        host_ids = torch.empty(n, dtype=torch.int64, pin_memory=True)
        host_ids.copy_(ids.reshape(-1))
        for mech, b in paths.items():
            if mech == "torch_row_copies" and n > 4096:
                continue
            it = iters_for(mech, n)
            try:
                ok = same(b.lookup(ids), want)
                b.start_prefetch(ids)
                ok = ok and same(b.finalize(), want)
                dest = int_view(out).view(n, dim)
                dest.fill_(-3)
                b.issue_copies(host_ids, dest)
                torch.cuda.synchronize()
                ok = ok and torch.equal(dest, want)
                look, _ = event_ms(lambda: b.lookup(ids), it, warmup=1)
                pf, _ = event_ms(lambda: (b.start_prefetch(ids), b.finalize()), it, warmup=1)
                h0 = b.host_thread_s
                cop, issue = event_ms(lambda: b.issue_copies(host_ids, dest), it, warmup=1)
                thr = 1e3 * (b.host_thread_s - h0) / (it + 1)
            except Exception as exc:
                verdict(False, f"{mech} n={n}: {type(exc).__name__}: {exc}")
                continue
            if not ok:
                verdict(False, f"{mech} n={n}: wrong rows")
            line = (f"{n:>6} {'copy_engine ' + mech:>30} {look:10.3f} {pf:12.3f} {cop:10.3f} {issue:9.3f} "
                    f"{thr:11.3f} {n * row_bytes / cop / 1e6:11.2f}")
            lines.append(line)
            print(line, flush=True)
            if n == 65536:
                keep[mech] = cop
    print("\n" + "\n".join(lines))
    print("lookup: synchronous lookup (ids D2H, address list, copies); prefetch: start_prefetch + finalize; "
          "copies: the copies alone, ids already on the host (issue = host time to enqueue them)\n")
    return {"base": base, "paths": paths, "vocab": vocab, "copies_ms": keep}


# ----------------------------------------------------------------- 4. overlap
def sleep_cycles_per_ms() -> float:
    a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(20_000_000)
    z.record()
    z.synchronize()
    return 20_000_000 / a.elapsed_time(z)


def overlap(dev, ctx: dict) -> None:
    base, paths, vocab = ctx["base"], ctx["paths"], ctx["vocab"]
    mech = next((m for m in ("memcpy_batch", "memcpy_loop") if m in paths), None)
    if mech is None:
        verdict(None, "overlap check skipped: no bindings mechanism (torch_row_copies only)")
        return
    b = paths[mech]
    n, dim = 65536, 160
    gen = torch.Generator(device=dev).manual_seed(5)
    ids = torch.randint(0, vocab, (n, 1), device=dev, generator=gen)
    host_ids = torch.empty(n, dtype=torch.int64, pin_memory=True)
    host_ids.copy_(ids.reshape(-1))
    dest = torch.empty(n, dim, dtype=torch.int8, device=dev)
    out = torch.empty(n, 1, dim, dtype=DTYPES["fp8"], device=dev)
    x = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16) / 64
    side = torch.cuda.Stream(device=dev)
    main = torch.cuda.current_stream(dev)

    def chain(k: int):
        y = x
        for _ in range(k):
            y = y @ w
        return y

    chain(3)
    comp1, _ = event_ms(lambda: chain(1), 10)
    t0 = time.perf_counter()
    b.issue_copies(host_ids, dest, stream=side)
    issue_ms = 1e3 * (time.perf_counter() - t0)  # host time to enqueue one batch
    torch.cuda.synchronize()
    cyc = sleep_cycles_per_ms()
    k = 4

    def trial(side_work, reps_: int, issue_each_ms: float) -> tuple[float, float, float]:
        """Compute-chain time, side-work time, and the share of the chain the side work overlapped."""
        gate_ms = 5.0 + 1.5 * issue_each_ms * reps_
        ev = {k_: torch.cuda.Event(enable_timing=True) for k_ in ("ref", "c0", "c1", "s0", "s1")}
        torch.cuda.synchronize()
        ev["ref"].record(main)
        torch.cuda._sleep(int(gate_ms * cyc))  # holds both streams while the host enqueues
        gate = torch.cuda.Event()
        gate.record(main)
        if side_work is not None:
            side.wait_event(gate)
            with torch.cuda.stream(side):
                ev["s0"].record(side)
                for _ in range(reps_):
                    side_work()
                ev["s1"].record(side)
        ev["c0"].record(main)
        chain(k)
        ev["c1"].record(main)
        torch.cuda.synchronize()
        c0, c1 = ev["ref"].elapsed_time(ev["c0"]), ev["ref"].elapsed_time(ev["c1"])
        if side_work is None:
            return c1 - c0, 0.0, 0.0
        s0, s1 = ev["ref"].elapsed_time(ev["s0"]), ev["ref"].elapsed_time(ev["s1"])
        return c1 - c0, s1 - s0, max(0.0, min(c1, s1) - max(c0, s0)) / (c1 - c0)

    def med(side_work, reps_, issue_each_ms=0.0):
        trials = [trial(side_work, reps_, issue_each_ms) for _ in range(7)]
        return tuple(statistics.median(t[i] for t in trials) for i in range(3))

    # Size the side work to about 15 ms of GPU time (the host may enqueue for at most ~0.6 s
    # while the gate holds the GPU), then the chain to 80% of it, so the copies cover the chain.
    ce_work = lambda: b.issue_copies(host_ids, dest, stream=side)  # noqa: E731
    _, one_ms, _ = trial(ce_work, 1, issue_ms)
    reps = max(1, min(int(15.0 / max(one_ms, 1e-3)) + 1, int(400.0 / (1.5 * issue_ms)) or 1))
    side_ms = reps * one_ms
    k = max(4, int(0.8 * side_ms / max(comp1, 1e-3)))
    kern_ms, _ = event_ms(lambda: base.local_lookup(ids, out=out), 10)
    kreps = max(1, min(5000, int(1.1 * k * comp1 / max(kern_ms, 1e-3)) + 1))
    verdict(None, f"overlap setup: one {mech} batch of {n} copies: GPU {one_ms:.3f} ms, host issue {issue_ms:.3f} ms; "
                  f"{reps} batches beside a chain of {k} matmuls ({comp1:.3f} ms each)")
    alone, _, _ = med(None, 0)
    with_ce, ce_ms, ce_cov = med(ce_work, reps, issue_ms)
    with_k, k_ms, k_cov = med(lambda: base.local_lookup(ids, out=out), kreps, 0.02)
    # the main stream again, alone, to see the noise
    alone2, _, _ = med(None, 0)
    noise = abs(alone2 - alone) / alone
    slow_ce = with_ce / alone - 1
    slow_k = with_k / alone - 1
    verdict(None, f"matmul chain ({k} x bf16 4096^2) alone: {alone:.3f} ms (again: {alone2:.3f} ms, "
                  f"noise {100 * noise:.1f}%)")
    verdict(None, f"beside pinned_uva lookups ({kreps} x {n} rows, {k_ms:.2f} ms, {100 * k_cov:.0f}% of the chain "
                  f"overlapped): chain {with_k:.3f} ms, slowdown {100 * slow_k:+.1f}%")
    what = (f"beside {mech} copies ({reps} x {n} rows of 160 B, {ce_ms:.2f} ms, {100 * ce_cov:.0f}% of the "
            f"chain overlapped): chain {with_ce:.3f} ms, slowdown {100 * slow_ce:+.1f}%")
    if ce_cov < 0.5:
        verdict(None, what + " -- INCONCLUSIVE: the copies overlapped less than half of the chain")
    else:
        verdict(slow_ce <= MAX_SLOWDOWN + noise, what + f" (limit {100 * MAX_SLOWDOWN:.0f}% + noise)")


# ----------------------------------------------------------------- 5. profile
def profile_activity(dev, ctx: dict) -> None:
    paths = ctx["paths"]
    mech = next((m for m in ("memcpy_batch", "memcpy_loop") if m in paths), None)
    if mech is None:
        return
    from torch.profiler import ProfilerActivity, profile

    b = paths[mech]
    n = 1024
    host_ids = torch.randint(0, ctx["vocab"], (n,), dtype=torch.int64).pin_memory()
    dest = torch.empty(n, 160, dtype=torch.int8, device=dev)
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            b.issue_copies(host_ids, dest)
            torch.cuda.synchronize()
    except Exception as exc:  # the profiler is a diagnostic here, never a verdict
        verdict(None, f"profiler unavailable: {type(exc).__name__}: {exc}")
        return
    counts: dict[str, int] = {}
    for e in prof.events():
        if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type):
            counts[e.name] = counts.get(e.name, 0) + 1
    kernels = {k: v for k, v in counts.items() if not k.lower().startswith(("memcpy", "memset"))}
    copies = {k: v for k, v in counts.items() if k.lower().startswith(("memcpy", "memset"))}
    verdict(None, f"GPU activity of one {mech} batch of {n} copies (all owned): copies {copies or 'none seen'}; "
                  f"kernels {kernels or 'none'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table-gib", type=float, default=4.0)
    ap.add_argument("--skip-timing", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("FAIL: no CUDA device")
        return 1
    dev = torch.device("cuda", torch.cuda.current_device())
    verdict(None, f"device {torch.cuda.get_device_name(dev)}")
    t0 = time.perf_counter()
    mechanisms = report_mechanisms(dev)
    check_correctness(dev, mechanisms)
    verdict(None, f"correctness done in {time.perf_counter() - t0:.1f} s")
    if not args.skip_timing:
        ctx = timing(dev, args.table_gib, mechanisms)
        overlap(dev, ctx)
        profile_activity(dev, ctx)
        for b in ctx["paths"].values():
            b.close()
        ctx["base"].close()
        gc.collect()
    verdict(None, f"total {time.perf_counter() - t0:.1f} s")
    print(f"\n{'FAILED: ' + str(len(failures)) if failures else 'ALL PASSED'}")
    for f in failures:
        print(f"  - {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
