"""Host paths against the plainest hand version, in one process on one GPU.

For a pinned table (``--table-gib``, default 8) and host ids of 1 K .. 64 K
uniform random rows, times with the host clock around synchronized calls
(median of ``--repeats`` calls over 8 rotating id sets):

* ``hand``: ``torch.index_select`` of the rows (byte view, all torch threads)
  into pinned staging, one host->device copy, sync -- ten lines of torch;
* ``ceiling``: :func:`ple_bench.measure.host_gather_ceiling`'s back-to-back ``warm_ms``
  (must agree with ``hand``; ``ceiling_cold_ms``: its figure timed as the engine times
  host paths, ``host_sync`` with the L2 flushed);
* ``nested_pool``: the old CPU gather -- 8 pool threads, each an ``index_select``
  with its own OpenMP team (what issue 12 reported);
* ``cpu_gather``: ``pinned_cpu_gather.lookup`` and ``start_prefetch + finalize``;
* ``copy_engine``: ``pinned_copy_engine.lookup`` (its mechanism, host us per row);
* ``uva_ref``: ``pinned_uva`` + ``triton_reference`` with host ids.

Every path's output is compared byte for byte with the hand version's first.
Prints a table and writes JSON (``--out``).  Run on the GPU machine:
``python3 scripts/gpu/host_path_check.py --out $OUT/host_path_check.json``.
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
from ple_bench.measure import host_gather_ceiling

DIM, HEADS = 160, 16


def timed(fn, repeats: int) -> float:
    """Median ms of ``fn()`` as a synchronized call on the host clock."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--table-gib", type=float, default=8.0)
    ap.add_argument("--rows", default="1024,4096,8192,65536")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--out", default="")
    ap.add_argument("--host-prefetch", default="deferred", choices=("deferred", "thread"))
    args = ap.parse_args(argv)
    dev = torch.device("cuda", 0)
    vocab = int(args.table_gib * 2**30) // DIM
    t0 = time.perf_counter()
    gather = get_backend("pinned_cpu_gather")(vocab, DIM, dtype="fp8", num_heads=HEADS, max_tokens=65536 // HEADS,
                                              device=dev, host_prefetch=args.host_prefetch)
    gather.fill_synthetic(1234, scale=0.5)
    shared = gather.weight

    def sharing(name: str, **kw):
        cls = get_backend(name)

        class Shared(cls):  # the same pinned table, no second allocation
            def allocate_table(self, rows, dim, dtype):
                assert tuple(shared.shape) == (rows, dim) and shared.dtype == dtype
                return shared

        b = Shared(vocab, DIM, dtype="fp8", num_heads=HEADS, max_tokens=65536 // HEADS, device=dev, **kw)
        b.set_scale(0.5)
        return b

    ce = sharing("pinned_copy_engine")
    uva = sharing("pinned_uva", kernel="triton_reference")
    print(f"table {gather.table_bytes / 2**30:.1f} GiB pinned and filled in {time.perf_counter() - t0:.1f} s; "
          f"torch threads {torch.get_num_threads()}, cpu_gather threads {gather.gather_threads}, "
          f"copy mechanism {ce.copy_mechanism} ({'; '.join(ce.mechanism_notes) or 'no notes'})", flush=True)

    table = shared.view(torch.uint8).view(shared.shape[0], -1)
    pool = ThreadPoolExecutor(8)
    rows_list = [int(r) for r in args.rows.split(",")]
    results = []
    ok = True
    for rows in rows_list:
        tokens = rows // HEADS
        gen = torch.Generator().manual_seed(rows)
        id_sets = [torch.randint(0, vocab, (tokens, HEADS), generator=gen).pin_memory() for _ in range(8)]
        flat_sets = [s.reshape(-1) for s in id_sets]
        staging = torch.empty(rows, DIM, dtype=torch.uint8, pin_memory=True)
        dest = torch.empty(rows, DIM, dtype=torch.uint8, device=dev)
        turn = [0]

        def nxt():
            turn[0] += 1
            return turn[0] % 8

        def hand():
            torch.index_select(table, 0, flat_sets[nxt()], out=staging)
            dest.copy_(staging, non_blocking=True)

        def nested():
            ids = flat_sets[nxt()]
            step = -(-rows // 8)
            futs = [pool.submit(torch.index_select, table, 0, ids[i:i + step], out=staging[i:i + step])
                    for i in range(0, rows, step)]
            for f in futs:
                f.result()
            dest.copy_(staging, non_blocking=True)

        def cg_lookup():
            return gather.lookup(id_sets[nxt()])

        def cg_prefetch():
            gather.start_prefetch(id_sets[nxt()])
            return gather.finalize()

        def ce_lookup():
            return ce.lookup(id_sets[nxt()])

        def uva_lookup():
            return uva.lookup(id_sets[nxt()])

        # correctness: every path's rows for id set 0 equal the hand gather's
        torch.index_select(table, 0, flat_sets[0], out=staging)
        want = staging.clone()
        checks = {}
        for name, fn in (("cpu_gather", lambda: gather.lookup(id_sets[0])),
                         ("cpu_gather_prefetch", lambda: (gather.start_prefetch(id_sets[0]), gather.finalize())[1]),
                         ("copy_engine", lambda: ce.lookup(id_sets[0])), ("uva_ref", lambda: uva.lookup(id_sets[0]))):
            got = fn().view(torch.uint8).reshape(rows, DIM).cpu()
            checks[name] = bool(torch.equal(got, want))
            ok &= checks[name]
        row = {"rows": rows, "correct": checks}
        row["hand_ms"] = timed(hand, args.repeats)
        ceiling = host_gather_ceiling(shared, rows, dev)
        row["ceiling_ms"] = ceiling["warm_ms"]  # back to back, as ``hand`` is timed
        row["ceiling_cold_ms"] = ceiling["ms"]  # as the engine times host paths (host_sync, cold L2)
        row["nested_pool_ms"] = timed(nested, args.repeats)
        row["cpu_gather_ms"] = timed(cg_lookup, args.repeats)
        row["cpu_gather_prefetch_ms"] = timed(cg_prefetch, args.repeats)
        h0 = ce.host_thread_s
        row["copy_engine_ms"] = timed(ce_lookup, args.repeats)
        row["copy_engine_host_us_per_row"] = (ce.host_thread_s - h0) * 1e6 / ((args.repeats + 3) * rows)
        row["uva_ref_ms"] = timed(uva_lookup, args.repeats)
        # the copy engine's own host work per row: the address arrays (the rest is the driver's batch call)
        from ple_bench.backends.copy_engine import copy_plan

        t_a = time.perf_counter()
        for i in range(50):
            pos, loc = copy_plan(flat_sets[i % 8], 0, vocab)
            pos.mul(DIM).add_(dest.data_ptr()), loc.mul(DIM).add_(shared.data_ptr())
        row["copy_engine_address_us_per_row"] = (time.perf_counter() - t_a) / 50 / rows * 1e6
        row["cpu_gather_pct_of_hand"] = 100 * row["hand_ms"] / row["cpu_gather_ms"]
        row["cpu_gather_pct_of_ceiling"] = 100 * row["ceiling_ms"] / row["cpu_gather_ms"]
        results.append(row)
        print(json.dumps(row), flush=True)

    # the gather's thread count at 4096 rows
    sweep = []
    for threads in (1, 2, 4, 8, 16):
        b = sharing("pinned_cpu_gather", gather_threads=threads)
        gen = torch.Generator().manual_seed(7)
        sets = [torch.randint(0, vocab, (256, HEADS), generator=gen).pin_memory() for _ in range(8)]
        k = [0]

        def run(b=b, sets=sets, k=k):
            k[0] += 1
            b.lookup(sets[k[0] % 8])

        sweep.append({"threads": threads, "ms_4096_rows": timed(run, args.repeats)})
        b.close()
    print(json.dumps({"gather_threads_sweep": sweep}), flush=True)
    print(f"{'rows':>6} {'hand':>8} {'ceiling':>8} {'nested':>8} {'gather':>8} {'gath_pf':>8} {'ce':>8} "
          f"{'ce_us/row':>9} {'uva_ref':>8} {'%hand':>6}")
    for r in results:
        print(f"{r['rows']:>6} {r['hand_ms']:8.4f} {r['ceiling_ms']:8.4f} {r['nested_pool_ms']:8.4f} "
              f"{r['cpu_gather_ms']:8.4f} {r['cpu_gather_prefetch_ms']:8.4f} {r['copy_engine_ms']:8.4f} "
              f"{r['copy_engine_host_us_per_row']:9.4f} {r['uva_ref_ms']:8.4f} {r['cpu_gather_pct_of_hand']:6.1f}")
    print("ALL CORRECT" if ok else "MISMATCH: see 'correct'")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"table_bytes": gather.table_bytes, "copy_mechanism": ce.copy_mechanism,
                       "mechanism_notes": ce.mechanism_notes, "torch_threads": torch.get_num_threads(),
                       "rows": results, "gather_threads_sweep": sweep}, fh, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
