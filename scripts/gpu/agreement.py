"""Issue 3 evidence: ple_bench's median next to triton.testing.do_bench's and
ncu's gpu__time_duration for the same lookup (reference Triton kernel, one
kernel per lookup), and the profile verb under ncu.

    PYTHONPATH=. python3 scripts/gpu/agreement.py [--ncu-cache-control=none] CASE_ID [CASE_ID ...]

ncu flushes the GPU caches before every kernel it profiles (``--cache-control all``);
``--ncu-cache-control=none`` profiles warm, to compare with ple_bench's hot median.
"""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

import torch
import triton.testing

from ple_bench.executor import CaseExecutor
from ple_bench.measure import TimingPolicy, measure
from ple_bench.parallel import Topology
from ple_bench.suite import load_suite


def ncu_kernel_ms(case_id: str, out: Path, cache_control: str = "all") -> tuple[float | None, int, str]:
    """Run the case through ``python -m ple_bench profile`` and read the lookup kernel's durations."""
    cmd = [sys.executable, "-m", "ple_bench", "profile", "--suite", "default", "--case", case_id, "--tool", "ncu",
           "--samples", "20", "--metrics", "gpu__time_duration.sum", "--cache-control", cache_control, "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    log = proc.stdout[-1500:] + proc.stderr[-1500:]
    rep = out / "profile.ncu-rep"
    if not rep.exists():
        return None, 0, log
    raw = subprocess.run(["ncu", "--import", str(rep), "--csv", "--page", "raw", "--print-units", "base",
                          "--metrics", "gpu__time_duration.sum"], capture_output=True, text=True).stdout
    rows = list(csv.reader(io.StringIO(raw)))
    if len(rows) < 3:
        return None, 0, log + raw[-500:]
    head = rows[0]
    k_name, k_time = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
    times = sorted(float(r[k_time].replace(",", "")) / 1e6 for r in rows[2:] if "ple_lookup" in r[k_name])
    names = sorted({r[k_name] for r in rows[2:]})
    if not times:
        return None, 0, log + f" kernels seen: {names}"
    return times[len(times) // 2], len(times), f"kernels profiled: {names}"


def main() -> int:
    suite = load_suite("default")
    by_id = {c.case_id: c for c in suite.cases}
    policy = TimingPolicy.from_dict(suite.timing or {})
    device = torch.device("cuda", 0)
    ex = CaseExecutor(device=device)
    rows = []
    args = sys.argv[1:]
    cache_control = "all"
    if args and args[0].startswith("--ncu-cache-control="):
        cache_control = args.pop(0).split("=", 1)[1]
    for case_id in args:
        case = by_id[case_id]
        topo = Topology(case.tp, case.etp, case.dp)
        backend = ex.backend_for(case, topo, ex.groups_for(topo))
        # the runner's own workload: policy.id_sets independent id sets, looked up in turn
        ids = ex.id_sets_for(case, topo, policy.id_sets)
        ex._gate(case, backend, ids, None)
        fn = ex._lookup_fn(case, backend, ids, None)
        ours = measure(fn, device=device, policy=policy, cold_l2=True).stats()["median_ms"]
        ours_hot = measure(fn, device=device, policy=policy, cold_l2=False).stats()["median_ms"]
        db = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
        ncu_ms, n, note = ncu_kernel_ms(case_id, Path(f"/tmp/prof-{case_id}-{cache_control}"), cache_control)
        rows.append((case_id, ours, ours_hot, db, ncu_ms, n))
        print(f"[ncu cache-control {cache_control}] {case_id}: ours cold {ours:.4f} ms, hot {ours_hot:.4f}; do_bench {db:.4f}; "
              f"ncu {ncu_ms if ncu_ms is None else round(ncu_ms, 4)} ms over {n} launches ({note})", flush=True)
    print("\n| case | ple_bench cold median (ms) | ple_bench hot | do_bench median (ms) | ours/do_bench | "
          "ncu gpu__time_duration median (ms) | ours/ncu |")
    print("|---|---|---|---|---|---|---|")
    for cid, ours, hot, db, ncu_ms, n in rows:
        r_ncu = f"{ours / ncu_ms:.3f}" if ncu_ms else "n/a"
        print(f"| {cid} | {ours:.4f} | {hot:.4f} | {db:.4f} | {ours / db:.3f} | "
              f"{'n/a' if ncu_ms is None else f'{ncu_ms:.4f}'} ({n}) | {r_ncu} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
