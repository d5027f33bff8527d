"""Issue 3 study: why do small pinned tables move 12-33 % between runs while
each run's own coefficient of variation stays under 2 %?

Hypothesis: the rate depends on *where the pinned allocation lands* (which host
pages back it, how the IOMMU maps them), which is fixed for an allocation's
life and drawn anew by each process.  Test: in one process, allocate the same
table K times (the pinned caching allocator emptied in between, so each is a
fresh cudaHostAlloc), measure the same lookup R times on each allocation.
If the spread *between* allocations is much larger than the spread *within*
one, the run-to-run difference is the allocation's, not the timer's.

    PYTHONPATH=. python3 scripts/gpu/placement_study.py [--allocs 5] [--repeats 3]

Prints one line per allocation and a summary per table size; about 1-2 min on an H200.
"""

from __future__ import annotations

import argparse
import gc
import glob
import os
import statistics
import sys

import torch

from ple_bench.case import Case
from ple_bench.executor import CaseExecutor
from ple_bench.measure import TimingPolicy, measure
from ple_bench.parallel import Topology


def machine_facts() -> None:
    nodes = sorted(glob.glob("/sys/devices/system/node/node[0-9]*"))
    print(f"NUMA nodes: {len(nodes)} ({', '.join(os.path.basename(n) for n in nodes)})")
    for path in glob.glob("/sys/bus/pci/devices/*/numa_node"):
        dev = os.path.dirname(path)
        try:
            vendor = open(os.path.join(dev, "vendor")).read().strip()
            cls = open(os.path.join(dev, "class")).read().strip()
        except OSError:
            continue
        if vendor == "0x10de" and cls.startswith("0x0302"):
            print(f"GPU {os.path.basename(dev)}: numa_node {open(path).read().strip()}")
    for f in ("/sys/kernel/mm/transparent_hugepage/enabled",):
        if os.path.exists(f):
            print(f"{f}: {open(f).read().strip()}")
    iommu = glob.glob("/sys/class/iommu/*")
    print(f"IOMMU groups visible: {len(iommu)}")


def empty_pinned_cache() -> None:
    gc.collect()
    fn = getattr(torch._C, "_host_emptyCache", None)
    if fn is not None:
        fn()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--allocs", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("FAIL: needs CUDA")
        return 1
    machine_facts()
    device = torch.device("cuda", 0)
    policy = TimingPolicy(min_samples=10, max_samples=400, min_time_s=0.2, max_time_s=0.6, max_noise=0.02)
    ex = CaseExecutor(device=device)
    topo = Topology(1, 1, 1)
    groups = ex.groups_for(topo)
    shapes = [
        ("64 MiB fp8 d160, 32768 rows", Case(impl="pinned_uva", vocab_size=419430, dim=160, dtype="fp8",
                                             num_heads=16, num_tokens=2048)),
        ("1 GiB fp8 d160, 32768 rows", Case(impl="pinned_uva", vocab_size=6710886, dim=160, dtype="fp8",
                                            num_heads=16, num_tokens=2048)),
    ]
    for label, case in shapes:
        per_alloc: list[list[float]] = []
        for a in range(args.allocs):
            ex.release_table()
            empty_pinned_cache()
            backend = ex.backend_for(case, topo, groups)
            ids = ex.id_sets_for(case, topo, 8)
            ex._gate(case, backend, ids, None)  # correctness before any timing
            fn = ex._lookup_fn(case, backend, ids, None)
            meds = [measure(fn, device=device, policy=policy, cold_l2=True).stats()["median_ms"]
                    for _ in range(args.repeats)]
            per_alloc.append(meds)
            addr = backend.weight.data_ptr()
            print(f"{label} alloc {a} @0x{addr:x}: medians " + ", ".join(f"{m:.4f}" for m in meds) + " ms",
                  flush=True)
        within = [100 * (max(m) - min(m)) / min(m) for m in per_alloc]
        centers = [statistics.median(m) for m in per_alloc]
        between = 100 * (max(centers) - min(centers)) / min(centers)
        print(f"SUMMARY {label}: within-allocation spread max {max(within):.1f} % "
              f"(median {statistics.median(within):.1f} %); between-allocation spread {between:.1f} % "
              f"(alloc medians {', '.join(f'{c:.4f}' for c in centers)} ms)", flush=True)
    ex.release_table()
    return 0


if __name__ == "__main__":
    sys.exit(main())
