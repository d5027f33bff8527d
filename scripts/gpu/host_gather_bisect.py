"""Where the CPU gather's time goes, next to the plainest hand version (one GPU, one process).

The first host_path_check run on the H200 (docs/gpu-logs/host_path_check.log) showed
``pinned_cpu_gather.lookup`` at 26-39 % of a plain index_select + copy at 1-4 K rows.
This times the hand version and the path's layers one by one, each as a synchronized
call on the host clock (median of ``--repeats``, 8 rotating host id sets), so the
layer that costs the difference shows:

  gather_only      torch.index_select into pinned staging (no copy)
  hand             gather_only + one host->device copy
  hand_event       hand + an event recorded and waited for before the next gather
  host_gather      the path's host_gather (its views, thread-count context, host-time count)
  host_rows        the path's staging + gather + copy
  local_lookup     the path's local_lookup (output allocation, id handling)
  lookup           the path's lookup (the public call)
  pool_hand_T      hand, handed to a 1-thread pool whose thread runs T torch threads
  prefetch         start_prefetch + finalize (host_prefetch="thread": a host thread gathers)
  prefetch_deferred  the same with host_prefetch="deferred" (finalize gathers on this thread)
  busy200          a 200 us GPU spin on the main stream alone
  overlap_thread / overlap_deferred   the spin, then start_prefetch, then finalize: how much of
                   the gather the GPU work hides (ideal: max(busy200, the gather))
Run: ``python3 scripts/gpu/host_gather_bisect.py --out $OUT/host_gather_bisect.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from ple_bench.backends import get_backend
from ple_bench.backends.formats import int_view

DIM, HEADS = 160, 16


def timed(fn, repeats: int) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter_ns() - t0) / 1e6)
    return statistics.median(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--table-gib", type=float, default=8.0)
    ap.add_argument("--rows", default="1024,4096,8192")
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    dev = torch.device("cuda", 0)
    vocab = int(args.table_gib * 2**30) // DIM
    b = get_backend("pinned_cpu_gather")(vocab, DIM, dtype="fp8", num_heads=HEADS, max_tokens=8192, device=dev)
    b.fill_synthetic(1234, scale=0.5)
    table = b.weight.view(torch.uint8).view(b.weight.shape[0], DIM)
    shared = b.weight

    class Shared(type(b)):  # the same pinned table, no second allocation
        def allocate_table(self, rows, dim, dtype):
            return shared

    bd = Shared(vocab, DIM, dtype="fp8", num_heads=HEADS, max_tokens=8192, device=dev, host_prefetch="deferred")
    bd.set_scale(0.5)
    cycles = int(200e-6 * torch.cuda.get_device_properties(dev).clock_rate * 1e3) if hasattr(
        torch.cuda.get_device_properties(dev), "clock_rate") else 396_000
    stream = torch.cuda.current_stream(dev)
    rows_out = []
    for rows in [int(r) for r in args.rows.split(",")]:
        tokens = rows // HEADS
        gen = torch.Generator().manual_seed(rows)
        sets = [torch.randint(0, vocab, (tokens, HEADS), generator=gen).pin_memory() for _ in range(8)]
        flats = [s.reshape(-1) for s in sets]
        staging = torch.empty(rows, DIM, dtype=torch.uint8, pin_memory=True)
        dest = torch.empty(rows, DIM, dtype=torch.uint8, device=dev)
        dest_int = int_view(torch.empty(rows, DIM, dtype=b.storage_dtype, device=dev))
        stage_int = int_view(torch.empty(rows, DIM, dtype=b.storage_dtype, pin_memory=True))
        k = [0]
        done = [None]

        def nxt():
            k[0] += 1
            return k[0] % 8

        def gather_only():
            torch.index_select(table, 0, flats[nxt()], out=staging)

        def hand():
            torch.index_select(table, 0, flats[nxt()], out=staging)
            dest.copy_(staging, non_blocking=True)

        def hand_event():
            if done[0] is not None:
                done[0].synchronize()
            torch.index_select(table, 0, flats[nxt()], out=staging)
            with torch.cuda.stream(stream):
                dest.copy_(staging, non_blocking=True)
            e = torch.cuda.Event()
            e.record(stream)
            done[0] = e

        res = {"rows": rows}
        variants = [("gather_only", gather_only), ("hand", hand), ("hand_event", hand_event),
                    ("host_gather", lambda: b.host_gather(flats[nxt()], stage_int)),
                    ("host_rows", lambda: b.host_rows(flats[nxt()], dest_int, stream)),
                    ("local_lookup", lambda: b.local_lookup(sets[nxt()])),
                    ("lookup", lambda: b.lookup(sets[nxt()]))]
        for threads in (16, 8, 4):
            pool = ThreadPoolExecutor(1, initializer=lambda t=threads: torch.set_num_threads(t))
            variants.append((f"pool_hand_{threads}", lambda pool=pool: pool.submit(hand).result()))
        variants.append(("prefetch", lambda: (b.start_prefetch(sets[nxt()]), b.finalize())))
        variants.append(("prefetch_deferred", lambda: (bd.start_prefetch(sets[nxt()]), bd.finalize())))
        variants.append(("busy200", lambda: torch.cuda._sleep(cycles)))
        variants.append(("overlap_thread", lambda: (torch.cuda._sleep(cycles), b.start_prefetch(sets[nxt()]),
                                                    b.finalize())))
        variants.append(("overlap_deferred", lambda: (torch.cuda._sleep(cycles), bd.start_prefetch(sets[nxt()]),
                                                      bd.finalize())))
        for name, fn in variants:
            res[name] = timed(fn, args.repeats)
        # the order matters for warm thread teams: the hand version again at the end
        res["hand_again"] = timed(hand, args.repeats)
        rows_out.append(res)
        print(json.dumps(res), flush=True)
    names = [n for n in rows_out[0] if n != "rows"]
    print(f"{'ms':>14}" + "".join(f"{r['rows']:>10}" for r in rows_out))
    for n in names:
        print(f"{n:>14}" + "".join(f"{r[n]:10.4f}" for r in rows_out))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"torch_threads": torch.get_num_threads(), "rows": rows_out}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
