"""The phases of each replayed decode step in a torch.profiler (Kineto) trace of a full-graph
step case (``python -m ple_bench run --suite S --case ID --torch-trace N``): per
``cudaGraphLaunch`` inside the trace's ``measurement step`` range, the GPU work it launched (the
graph's kernels and copies share the launch's correlation id), as microseconds after the launch
call began:

* ``launch_us`` the launch call; ``gpu_start_us`` the graph's first GPU work; ``step_gpu_us`` its
  first to last GPU work;
* ``compute_end_us`` the last matmul of the chain (``nvjet``/``gemm`` kernels other than the
  consumer's ``badd``); ``consumer_us`` the consumer (the ``badd`` matmul) start;
* ``lookup_start_us`` / ``lookup_end_us`` the lookup's own GPU work: the gather kernel (a resident
  table), the host->device copy of the staged rows and, for ``pinned_host_flag``, its poll kernels
  (``wait_flag``: ``poll_us`` how long they waited);
* ``slack_us`` = consumer start - lookup end: how much earlier than needed the rows landed
  (negative: the consumer waited for them).

    python scripts/trace_phases.py results/<run>/trace_<case>.json [...]

Prints one line of medians per trace (and ``--all``: every replay)."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def _is_matmul(name: str) -> bool:
    return name.startswith(("nvjet", "sm90_", "ampere_", "cutlass")) or "gemm" in name


def replays(path: Path) -> list[dict[str, float]]:
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    step = [e for e in events if e.get("cat") == "user_annotation" and e["name"] == "measurement step"]
    if not step:
        raise SystemExit(f"{path}: no 'measurement step' range (was it run with --torch-trace?)")
    lo, hi = step[0]["ts"], step[0]["ts"] + step[0]["dur"]
    gpu: dict[int, list[dict]] = {}
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy"):
            gpu.setdefault(e.get("args", {}).get("correlation"), []).append(e)
    out = []
    for launch in events:
        if launch.get("cat") != "cuda_runtime" or launch["name"] != "cudaGraphLaunch":
            continue
        if not lo <= launch["ts"] <= hi:
            continue
        work = sorted(gpu.get(launch.get("args", {}).get("correlation"), []), key=lambda e: e["ts"])
        if not work:
            continue
        t0 = launch["ts"]
        first = work[0]["ts"]
        last = max(e["ts"] + e["dur"] for e in work)
        chain = [e for e in work if _is_matmul(e["name"]) and "badd" not in e["name"]]
        consumer = [e for e in work if _is_matmul(e["name"]) and "badd" in e["name"]]
        lookup = [e for e in work if "gather" in e["name"] or "HtoD" in e["name"] or e["name"] == "wait_flag"]
        polls = [e for e in work if e["name"] == "wait_flag"]
        row = {"launch_us": launch["dur"], "gpu_start_us": first - t0, "step_gpu_us": last - first,
               "compute_end_us": max(e["ts"] + e["dur"] for e in chain) - t0 if chain else None,
               "consumer_us": consumer[0]["ts"] - t0 if consumer else None,
               "lookup_start_us": min(e["ts"] for e in lookup) - t0 if lookup else None,
               "lookup_end_us": max(e["ts"] + e["dur"] for e in lookup) - t0 if lookup else None,
               "poll_us": sum(e["dur"] for e in polls) if polls else None}
        if row["consumer_us"] is not None and row["lookup_end_us"] is not None:
            row["slack_us"] = row["consumer_us"] - row["lookup_end_us"]
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--all", action="store_true", help="every replay, not only the medians")
    args = ap.parse_args()
    for path in args.traces:
        rows = replays(path)
        if args.all:
            for r in rows:
                print(json.dumps({k: round(v, 1) if v is not None else None for k, v in r.items()}))
        keys = rows[0].keys() if rows else []
        med = {k: round(statistics.median([r[k] for r in rows if r.get(k) is not None]), 1)
               for k in keys if any(r.get(k) is not None for r in rows)}
        print(json.dumps({"trace": path.name, "replays": len(rows), **med}))


if __name__ == "__main__":
    main()
