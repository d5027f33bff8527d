"""Follow a ``profile --tool torch`` trace's CUDA launches to the GPU work they became.

Used by tests/gpu/test_profile_streams_gpu.py (on the H200: the lookup kernel of a prefetched
step runs on a stream of its own, beside the compute's matmuls) and tests/test_profile_torch.py
(the same analysis on hand-made and CPU traces).  Per phase of the decode step
(``prefetch_start``, ``compute``, ``prefetch_finalize``) inside the ``measurement step`` window:
the streams and names of the kernels / copies its launches became, matched through their
correlation ids, and how much of the lookup kernel's GPU time the matmuls overlapped."""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict

PHASES = ("prefetch_start", "compute", "prefetch_finalize")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


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
