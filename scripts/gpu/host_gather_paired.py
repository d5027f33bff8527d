"""The CPU gather's lookup against the host-gather ceiling, **interleaved**: every
variant is sampled in turn, a batch of ``--batch`` samples each, for ``--rounds``
rounds, so that the lent VMs' drift (the same code moved 10-30 % between two blocks
of one process in session 6's first call) falls on every variant alike.

Each sample is the harness's host-sync sample (``ple_bench.measure.timer._SyncBatcher``,
what ``measure(host_sync=True)`` takes): L2 flush, device sync, host clock, event,
the call, event, device sync, host clock.  Variants, on a pinned table of
``--table-gib`` (exact pinning), 8 rotating id sets of uniform random rows:

  isel_ceiling  ``measure.host_gather_ceiling``'s index_select gather: torch.index_select into
                pinned staging (exact size) + one ``copy_(non_blocking=True)``
  loop_ceiling  its row-loop gather: the native row loop alone into the same staging + the same copy
  isel          the native call's rows() with torch's index_select inside (grain 0), a fixed output
  gG            the native call's rows() with its own row loop, G rows per task, a fixed output
  nat_lookup    the native call's lookup() (allocates the output), the default loop
  lookup        ``pinned_cpu_gather``'s ``lookup`` (the record's call), the default loop
  prefetch      ``start_prefetch`` + ``finalize(out=)`` (the decode step's body)

Per variant: the median over all samples, the median of the CUDA events around the same
calls, and the share of each ceiling as the median of per-round ratios (the ceiling's batch
median / the variant's), with the 10-90 % range across rounds of the share of the faster one.  Every variant's rows are checked byte for byte against torch's index_select first.
Run: ``python3 scripts/gpu/host_gather_paired.py --out $OUT/paired.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from ple_bench.backends import get_backend
from ple_bench.backends.cudart import current_stream_handle
from ple_bench.measure.ceilings import _row_loop
from ple_bench.measure.clocks import ClockSampler
from ple_bench.measure.l2 import get_flusher
from ple_bench.measure.timer import _SyncBatcher

DIM, HEADS = 160, 16


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--table-gib", type=float, default=32.0)
    ap.add_argument("--rows", default="1024,4096,8192,65536")
    ap.add_argument("--grains", default="16,32,64,128,256", help="row-loop rows per task to compare")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    dev = torch.device("cuda", 0)
    vocab = int(args.table_gib * 2**30) // DIM
    rows_list = [int(r) for r in args.rows.split(",")]
    grains = [int(g) for g in args.grains.split(",") if g]
    t0 = time.perf_counter()
    b = get_backend("pinned_cpu_gather")(vocab, DIM, dtype="fp8", num_heads=HEADS, max_tokens=max(rows_list) // HEADS,
                                          device=dev, host_alloc="exact")
    b.fill_synthetic(1234, scale=0.5)
    table = b.weight.view(torch.uint8).view(b.weight.shape[0], -1)
    b.lookup(torch.zeros(1, HEADS, dtype=torch.int64))  # builds the direct state
    nat = b._direct().native
    if nat is None:
        print("the native host gather is not built: nothing to compare", flush=True)
        return 1
    default_cfg = nat.grain()
    plain_loop = _row_loop(table)
    print(f"table {b.table_bytes / 2**30:.1f} GiB pinned+filled in {time.perf_counter() - t0:.1f} s, torch threads "
          f"{torch.get_num_threads()}, gather_threads {b.gather_threads}, default loop {default_cfg}", flush=True)
    flusher = get_flusher(dev)
    clocks = ClockSampler(dev)
    main_h = current_stream_handle(0)
    report: dict = {"table_bytes": b.table_bytes, "torch_threads": torch.get_num_threads(),
                    "default_grain": default_cfg, "rounds": args.rounds, "batch": args.batch, "rows": {}}

    for rows in rows_list:
        tokens = rows // HEADS
        gen = torch.Generator().manual_seed(rows)
        sets = [torch.randint(0, vocab, (tokens, HEADS), generator=gen).pin_memory() for _ in range(8)]
        flat_sets = [s.view(-1) for s in sets]
        staging = torch.empty(rows, table.shape[1], dtype=torch.uint8, pin_memory=True)
        dest = torch.empty(rows, table.shape[1], dtype=torch.uint8, device=dev)
        fixed = torch.empty(tokens, HEADS * DIM, dtype=b.storage_dtype, device=dev)
        turn = [0]

        def nxt():
            turn[0] += 1
            return turn[0] % 8

        def isel_ceiling():
            torch.index_select(table, 0, flat_sets[nxt()], out=staging)
            dest.copy_(staging, non_blocking=True)

        def loop_ceiling():
            plain_loop(flat_sets[nxt()], staging)
            dest.copy_(staging, non_blocking=True)

        def rows_fixed():
            nat.rows(sets[nxt()], fixed, main_h)

        variants = [("isel_ceiling", None, isel_ceiling), ("loop_ceiling", None, loop_ceiling), ("isel", 0, rows_fixed)]
        variants += [(f"g{g}", g, rows_fixed) for g in grains]
        variants += [("nat_lookup", default_cfg, lambda: nat.lookup(sets[nxt()], main_h)),
                     ("lookup", default_cfg, lambda: b.lookup(sets[nxt()])),
                     ("prefetch", default_cfg, lambda: (b.start_prefetch(sets[nxt()]), b.finalize(out=fixed)))]

        # correctness first: every variant's rows equal torch's index_select of the same ids
        for k in range(3):
            ref = torch.index_select(table, 0, flat_sets[k]).view(tokens, -1)
            for name, cfg, _ in variants[2:]:
                nat.configure(default_cfg if cfg is None else cfg)
                fixed.view(torch.uint8).fill_(0x7F)
                if name == "nat_lookup":
                    got = nat.lookup(sets[k], main_h)
                elif name == "lookup":
                    got = b.lookup(sets[k])
                elif name == "prefetch":
                    b.start_prefetch(sets[k])
                    got = b.finalize(out=fixed)
                else:
                    nat.rows(sets[k], fixed, main_h)
                    got = fixed
                torch.cuda.synchronize()
                if not torch.equal(got.view(torch.uint8).cpu(), ref):
                    print(f"MISMATCH at {rows} rows: {name}", flush=True)
                    return 1
            for name, gather in (("isel_ceiling", lambda i, o: torch.index_select(table, 0, i, out=o)),
                                 ("loop_ceiling", plain_loop)):
                staging.fill_(0x7F)
                gather(flat_sets[k], staging)
                dest.copy_(staging)
                torch.cuda.synchronize()
                if not torch.equal(dest.cpu().view(tokens, -1), ref):
                    print(f"MISMATCH at {rows} rows: {name}", flush=True)
                    return 1

        batchers = {}
        for name, cfg, fn in variants:
            def launch(fn=fn):
                fn()
            batchers[name] = (cfg, _SyncBatcher(dev, launch, flusher=flusher, clocks=clocks))
            nat.configure(default_cfg if cfg is None else cfg)
            for _ in range(20):  # warm-up, as measure's
                flusher.flush()
                fn()
                torch.cuda.synchronize()
        samples: dict[str, list[float]] = {n: [] for n in batchers}
        round_medians: dict[str, list[float]] = {n: [] for n in batchers}
        for _ in range(args.rounds):
            for name, (cfg, batcher) in batchers.items():
                nat.configure(default_cfg if cfg is None else cfg)
                got, _mhz = batcher(args.batch)
                samples[name] += got
                round_medians[name].append(statistics.median(got))
        nat.configure(default_cfg)
        res = {}
        faster = min(("isel_ceiling", "loop_ceiling"), key=lambda n: statistics.median(samples[n]))
        for name, (_cfg, batcher) in batchers.items():
            share = {c: statistics.median(a / v for a, v in zip(round_medians[c], round_medians[name]))
                     for c in ("isel_ceiling", "loop_ceiling")}
            ratios = [a / v for a, v in zip(round_medians[faster], round_medians[name])]
            res[name] = {"median_ms": statistics.median(samples[name]), "p25_ms": pct(samples[name], 0.25),
                         "p75_ms": pct(samples[name], 0.75), "samples": len(samples[name]),
                         "event_median_ms": statistics.median(batcher.event_samples_ms),
                         "share_of_isel_ceiling": share["isel_ceiling"], "share_of_loop_ceiling": share["loop_ceiling"],
                         "binding_ceiling": faster, "share_of_binding": statistics.median(ratios),
                         "share_p10": pct(ratios, 0.1), "share_p90": pct(ratios, 0.9)}
        pieces_names = ("alloc", "check", "wait", "gather", "copy", "record")
        got = []
        for _ in range(300):
            flusher.flush()
            torch.cuda.synchronize()
            got.append(nat.lookup_pieces(sets[nxt()], main_h))
            torch.cuda.synchronize()
        res["pieces_us"] = {n: statistics.median(g[i] for g in got) for i, n in enumerate(pieces_names)}
        report["rows"][rows] = res
        print(f"\nrows {rows} ({args.rounds} rounds x {args.batch} samples a variant, interleaved)", flush=True)
        print(f"{'variant':>12} {'median ms':>10} {'p25':>8} {'p75':>8} {'events ms':>10} {'% isel':>7} "
              f"{'% loop':>7}  (p10-p90 of the faster: {faster})")
        for name in batchers:
            r = res[name]
            print(f"{name:>12} {r['median_ms']:>10.4f} {r['p25_ms']:>8.4f} {r['p75_ms']:>8.4f} "
                  f"{r['event_median_ms']:>10.4f} {100 * r['share_of_isel_ceiling']:>6.0f}% "
                  f"{100 * r['share_of_loop_ceiling']:>6.0f}%  {100 * r['share_p10']:>5.0f}-{100 * r['share_p90']:.0f}%")
        print("native lookup pieces (us, medians, after a flush): "
              + " ".join(f"{k}={v:.2f}" for k, v in res["pieces_us"].items()), flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1)
    b.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
