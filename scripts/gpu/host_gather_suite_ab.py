"""Why the default suite's CPU-gather records sit lower against the host-gather ceiling
(73-88 % of it at 1-8 K rows, session 6) than the same lookup timed interleaved by
host_gather_paired.py (86-97 %). In one process: the suite's own case (``CaseExecutor.run``,
its record: median and ceiling), then, on that executor's backend, interleaved batches of the
harness's host-sync samples (``_SyncBatcher``, as in host_gather_paired.py) of

  lookup_case       ``backend.lookup`` over the case's 8 id sets (what the record times)
  lookup_uniform    ``backend.lookup`` over 8 sets of uniform random rows of the whole table,
                    [tokens, heads] (the ceiling's kind of ids)
  loop_uniform      the row-loop ceiling's call over the same uniform sets, flat (what the
                    record is held against)
  loop_case         the row-loop ceiling's call over the case's ids, flattened
  isel_uniform      the index_select ceiling's call over the uniform sets

then ``measure(host_sync=True)`` blocks (the executor's call) of lookup_case and loop_uniform.
Run: ``python3 scripts/gpu/host_gather_suite_ab.py --tokens 64,256,512``.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from ple_bench.case import Case
from ple_bench.executor import CaseExecutor
from ple_bench.measure import TimingPolicy, measure
from ple_bench.measure.ceilings import _row_loop
from ple_bench.measure.clocks import ClockSampler
from ple_bench.measure.l2 import get_flusher
from ple_bench.measure.timer import _SyncBatcher
from ple_bench.parallel import Topology

VOCAB, DIM, HEADS = 214748364, 160, 16  # the default suite's 32 GiB table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="64,256,512")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--batch", type=int, default=10)
    args = ap.parse_args(argv)
    dev = torch.device("cuda", 0)
    pol = TimingPolicy(max_time_s=1.5, min_time_s=0.3, max_samples=1000, min_samples=10, max_noise=0.02,
                       warmup_ms=100.0, id_sets=8, cold_l2=True, hot=True, graph=True)  # the default suite's
    ex = CaseExecutor(device=dev)
    flusher, clocks = get_flusher(dev), ClockSampler(dev)
    for tokens in [int(t) for t in args.tokens.split(",")]:
        case = Case(impl="pinned_cpu_gather", vocab_size=VOCAB, dim=DIM, dtype="fp8", num_heads=HEADS,
                    num_tokens=tokens, ids_on="host")
        rec = ex.run(case, pol)
        b = ex.table.backend
        rows = tokens * HEADS
        case_sets = ex.id_sets_for(case, Topology(1, 1, 1), 8)
        gen = torch.Generator().manual_seed(rows)
        uni = [torch.randint(0, VOCAB, (tokens, HEADS), generator=gen).pin_memory() for _ in range(8)]
        table = b.weight.view(torch.uint8).view(b.weight.shape[0], -1)
        loop = _row_loop(table)
        staging = torch.empty(rows, table.shape[1], dtype=torch.uint8, pin_memory=True)
        dest = torch.empty(rows, table.shape[1], dtype=torch.uint8, device=dev)
        turn = [0]

        def nxt():
            turn[0] += 1
            return turn[0] % 8

        def ceiling(gather, sets):
            def run():
                gather(sets[nxt()].view(-1), staging)
                dest.copy_(staging, non_blocking=True)
            return run

        isel = lambda ids, out: torch.index_select(table, 0, ids, out=out)  # noqa: E731
        variants = {"lookup_case": lambda: b.lookup(case_sets[nxt()]),
                    "lookup_uniform": lambda: b.lookup(uni[nxt()]),
                    "loop_uniform": ceiling(loop, uni), "loop_case": ceiling(loop, case_sets),
                    "isel_uniform": ceiling(isel, uni)}
        for k in range(2):  # correctness first
            want = torch.index_select(table, 0, case_sets[k].view(-1)).view(tokens, -1)
            got = b.lookup(case_sets[k])
            torch.cuda.synchronize()
            if not torch.equal(got.view(torch.uint8).cpu(), want):
                print(f"MISMATCH at {tokens} tokens", flush=True)
                return 1
        batchers = {n: _SyncBatcher(dev, fn, flusher=flusher, clocks=clocks) for n, fn in variants.items()}
        for fn in variants.values():
            for _ in range(20):
                flusher.flush()
                fn()
                torch.cuda.synchronize()
        samples = {n: [] for n in batchers}
        for _ in range(args.rounds):
            for n, bt in batchers.items():
                samples[n] += bt(args.batch)[0]
        blocks = {n: measure(variants[n], device=dev, policy=pol, cold_l2=True, label=n, host_sync=True)
                  .stats()["median_ms"] for n in ("lookup_case", "loop_uniform")}
        print(f"\n{tokens} tokens ({rows} rows): record median {rec['median_ms']:.4f} ms, its ceiling "
              f"{rec['host_gather_ceiling_ms']:.4f} ({rec['host_gather_ceiling_gather']}), "
              f"{rec['pct_of_host_gather_ceiling']:.0f} %; gather_impl {rec['gather_impl']}", flush=True)
        ref = statistics.median(samples["loop_uniform"])
        for n, s in samples.items():
            m = statistics.median(s)
            print(f"{n:>15} interleaved {m:.4f} ms ({100 * ref / m:.0f} % of loop_uniform)"
                  + (f"; measure() block {blocks[n]:.4f}" if n in blocks else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
