"""Issue 16 item 4 evidence: ``profile --tool torch`` on the H200 -- which CUDA
streams the phases of a pinned_uva prefetch decode step launched their work on.

    PYTHONPATH=. python3 scripts/gpu/torch_trace_check.py [--suite nightly] [--case CASE_ID] [--samples 5]
    PYTHONPATH=. python3 scripts/gpu/torch_trace_check.py --trace results/<run_id>/trace_<case_id>.json

It runs ``python -m ple_bench profile --suite S --case ID --tool torch`` (default:
the nightly suite's eager pinned_uva prefetch step, a 1 GiB fp8 table, 100 us of
compute), loads the Chrome trace it wrote and, for every decode step of the
``measurement step`` window, follows each CUDA launch made inside a phase range
(``prefetch_start``, ``compute``, ``prefetch_finalize``) through its correlation
id to the kernel / memcpy / memset it became, and prints, per phase, the streams
(``args.stream``, else the event's ``tid``) and names of that GPU work, and how
much of the lookup kernel's GPU time overlapped the main-stream matmuls.

Checks (PASS / FAIL; exit 0 only if all pass):
 1. the trace has CUDA activity (kernels) and the step phases as named ranges;
 2. the lookup kernel (a kernel launched in ``prefetch_start``, by name
    ``ple_lookup`` when there is one) ran on a stream other than every stream of
    the matmuls launched in ``compute``.
``--trace`` analyses an existing trace instead of running the case.
"""

from __future__ import annotations

import argparse
import bisect
import json
import re
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

DEFAULT_SUITE = "nightly"
DEFAULT_CASE = "step.pinned_uva.v6710886.d160.fp8.h16.t256.pf.c100us-0c98cc45"
PHASES = ("prefetch_start", "compute", "prefetch_finalize")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


def run_profile(suite: str, case: str, samples: int, results_dir: Path) -> Path:
    cmd = [sys.executable, "-m", "ple_bench", "profile", "--suite", suite, "--case", case, "--tool", "torch",
           "--samples", str(samples), "--results-dir", str(results_dir)]
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    print(proc.stdout[-3000:])
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
    found = re.search(r"^trace: (\S+) ", proc.stdout, re.M)
    if not found:
        raise SystemExit(f"FAIL no trace path printed (exit {proc.returncode})")
    return Path(found.group(1))


def stream_of(ev: dict):
    return (ev.get("args") or {}).get("stream", ev.get("tid"))


def _window(ranges: list[dict], label: str) -> tuple[float, float] | None:
    for ev in ranges:
        if ev["name"] == f"measurement {label}":
            return ev["ts"], ev["ts"] + ev.get("dur", 0)
    return None


def analyse(trace: dict, window: str = "step") -> dict:
    """Per phase (inside ``decode_step`` ranges of the ``measurement <window>`` range):
    Counter of (stream, category, name) of the GPU work its launches became, and
    the lookup kernel's overlap with the compute kernels."""
    events = trace.get("traceEvents", [])
    ranges = [e for e in events if e.get("cat") == "user_annotation" and e.get("ph") == "X"]
    gpu = {}
    for e in events:
        if e.get("cat") in GPU_CATS and e.get("ph") == "X":
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                gpu.setdefault(corr, []).append(e)
    launches = sorted((e for e in events if e.get("cat") in LAUNCH_CATS and e.get("ph") == "X"),
                      key=lambda e: e["ts"])
    starts = [e["ts"] for e in launches]
    win = _window(ranges, window)
    steps = [r for r in ranges if r["name"] == "decode_step"
             and (win is None or win[0] <= r["ts"] <= win[1])]
    per_phase: dict[str, Counter] = defaultdict(Counter)
    work: dict[str, list[dict]] = defaultdict(list)
    for phase in PHASES:
        for r in ranges:
            if r["name"] != phase or not any(s["ts"] <= r["ts"] <= s["ts"] + s.get("dur", 0) and
                                             s.get("tid") == r.get("tid") for s in steps):
                continue
            lo = bisect.bisect_left(starts, r["ts"])
            hi = bisect.bisect_right(starts, r["ts"] + r.get("dur", 0))
            for launch in launches[lo:hi]:
                if launch.get("tid") != r.get("tid") or launch.get("pid") != r.get("pid"):
                    continue
                for g in gpu.get((launch.get("args") or {}).get("correlation"), []):
                    per_phase[phase][(stream_of(g), g["cat"], g["name"])] += 1
                    work[phase].append(g)
    kernels_start = [g for g in work["prefetch_start"] if g["cat"] == "kernel"]
    lookup = [g for g in kernels_start if "ple_lookup" in g["name"]] or kernels_start
    compute = [g for g in work["compute"] if g["cat"] == "kernel"]
    return {
        "steps": len(steps),
        "phases": {p: per_phase[p] for p in PHASES},
        "lookup_streams": sorted({stream_of(g) for g in lookup}, key=str),
        "lookup_names": sorted({g["name"] for g in lookup}),
        "compute_streams": sorted({stream_of(g) for g in compute}, key=str),
        "overlap": _overlap(lookup, compute),
        "has_kernels": any(e.get("cat") == "kernel" for e in events),
        "range_names": sorted({r["name"] for r in ranges}),
    }


def _overlap(a: list[dict], b: list[dict]) -> float | None:
    """Share of the GPU time of ``a``'s events that some event of ``b`` overlapped."""
    total = sum(e.get("dur", 0) for e in a)
    if not total:
        return None
    spans = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in b)
    covered = 0.0
    for e in a:
        lo, hi = e["ts"], e["ts"] + e.get("dur", 0)
        for s, t in spans:
            if t <= lo:
                continue
            if s >= hi:
                break
            covered += min(hi, t) - max(lo, s)
            lo = min(hi, t)
    return covered / total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default=DEFAULT_SUITE)
    ap.add_argument("--case", default=DEFAULT_CASE)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--trace", type=Path, help="analyse this trace instead of running the case")
    args = ap.parse_args()
    path = args.trace or run_profile(args.suite, args.case, args.samples,
                                     Path(tempfile.mkdtemp(prefix="torch_trace_check-")))
    trace = json.loads(path.read_text())
    print(f"trace {path} ({path.stat().st_size / 1e6:.2f} MB, {len(trace.get('traceEvents', []))} events)")
    print("windows:", (trace.get("ple_bench") or {}).get("windows"))
    res = analyse(trace)
    print(f"decode steps in the 'measurement step' window: {res['steps']}")
    for phase, work in res["phases"].items():
        print(f"\n{phase}: GPU work its launches became (stream, category, name: count)")
        for (stream, cat, name), n in sorted(work.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
            print(f"  stream {stream}  {cat:<10} {name[:90]}: {n}")
    print(f"\nlookup kernel(s) {res['lookup_names']} on stream(s) {res['lookup_streams']}; "
          f"compute matmuls on stream(s) {res['compute_streams']}")
    if res["overlap"] is not None:
        print(f"lookup kernel GPU time overlapped by compute kernels: {100 * res['overlap']:.1f} %")
    failed = 0
    ok1 = res["has_kernels"] and res["steps"] > 0 and all(p in res["range_names"] for p in PHASES)
    print(("PASS" if ok1 else "FAIL") + f" 1. CUDA kernels in the trace and the step phases as named ranges "
          f"({res['range_names']})")
    failed += not ok1
    ok2 = bool(res["lookup_streams"]) and bool(res["compute_streams"]) and \
        not set(res["lookup_streams"]) & set(res["compute_streams"])
    print(("PASS" if ok2 else "FAIL") + " 2. the lookup kernel ran on a stream of its own, not the matmuls' stream")
    failed += not ok2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
