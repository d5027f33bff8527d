"""Where a prefetched CPU-gather lookup spends its host time, piece by piece.

The paths suite (docs/runs/...-paths-ab72) measured start_prefetch + finalize of
1024 rows at 0.40 ms with host ids, against a host-gather ceiling of 0.027 ms and a
synchronous lookup of 0.12 ms.  This wraps the backend's pieces with host-clock
counters and runs the step's lookup body (``start_prefetch`` then ``finalize(out=)``,
a device sync between calls, as the host-sync timer does) on a pinned table of
``--table-gib``, then prints the mean microseconds per call of every piece.
Run: ``python3 scripts/gpu/host_gather_profile.py --out $OUT/host_gather_profile.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections import defaultdict

import torch

from ple_bench.backends import get_backend
from ple_bench.backends.pinned import PinnedUVAEmbedding

DIM, HEADS = 160, 16


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--table-gib", type=float, default=32.0)
    ap.add_argument("--rows", default="1024,4096")
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    dev = torch.device("cuda", 0)
    vocab = int(args.table_gib * 2**30) // DIM
    t0 = time.perf_counter()
    b = get_backend("pinned_cpu_gather")(vocab, DIM, dtype="fp8", num_heads=HEADS, max_tokens=4096, device=dev,
                                          host_alloc="exact")
    b.fill_synthetic(1234, scale=0.5)
    print(f"table {b.table_bytes / 2**30:.1f} GiB in {time.perf_counter() - t0:.1f} s", flush=True)
    spent: dict[str, float] = defaultdict(float)

    def wrap(obj, name, label=None):
        fn = getattr(obj, name)

        @functools.wraps(fn)
        def inner(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[label or name] += time.perf_counter() - t
        setattr(obj, name, inner)

    for name in ("start_prefetch", "finalize", "_prefetch_target", "_side_stream_start", "_join",
                 "_prefetch_work", "host_rows", "host_gather", "_select", "reduce_rows"):
        wrap(b, name)
    wrap(b._staging, "take", "staging.take")
    wrap(b._staging, "copied_on", "staging.copied_on")
    uva_finalize = PinnedUVAEmbedding.finalize

    def timed_uva_finalize(self, out=None):
        t = time.perf_counter()
        try:
            return uva_finalize(self, out)
        finally:
            spent["PinnedUVA.finalize (join side stream, select, copy out, event)"] += time.perf_counter() - t
    PinnedUVAEmbedding.finalize = timed_uva_finalize
    real_index_select = torch.index_select

    def timed_index_select(*a, **k):
        t = time.perf_counter()
        try:
            return real_index_select(*a, **k)
        finally:
            spent["torch.index_select"] += time.perf_counter() - t
    torch.index_select = timed_index_select

    report = []
    for rows in [int(r) for r in args.rows.split(",")]:
        tokens = rows // HEADS
        gen = torch.Generator().manual_seed(rows)
        sets = [torch.randint(0, vocab, (tokens, HEADS), generator=gen).pin_memory() for _ in range(8)]
        out = torch.empty(tokens, HEADS * DIM, dtype=b.storage_dtype, device=dev)
        for mode in ("prefetch", "lookup", "prefetch_gap", "lookup_gap"):
            spent.clear()
            wall = 0.0
            for i in range(args.calls + 10):
                torch.cuda.synchronize()
                if mode.endswith("_gap"):
                    time.sleep(0.0005)  # a step's worth of other work between lookups
                t = time.perf_counter()
                if mode.startswith("lookup"):
                    out.copy_(b.lookup(sets[i % 8]))
                else:
                    b.start_prefetch(sets[i % 8])
                    b.finalize(out=out)
                torch.cuda.synchronize()
                if i == 9:
                    spent.clear()
                elif i > 9:
                    wall += time.perf_counter() - t
            entry = {"rows": rows, "mode": mode, "wall_us": wall / args.calls * 1e6,
                     "pieces_us": {k: v / args.calls * 1e6 for k, v in sorted(spent.items(), key=lambda kv: -kv[1])}}
            report.append(entry)
            print(json.dumps(entry), flush=True)
    torch.index_select = real_index_select
    PinnedUVAEmbedding.finalize = uva_finalize
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
