"""Where a host-graph step's time goes (issue 26), on the host clock, replay by replay.

For the resident table (HBM, ids on the device) and ``pinned_host_graph`` (pinned host table,
ids on the host) at one decode shape, each step replayed as ONE CUDA graph after the ids are
written (the step's ``set_inputs``, which synchronizes first, as a server's scheduler does):

* ``step_us``: replay launch -> synchronize returns (the host-sync timer's sample, without the feed);
* ``compute_us``: the same for the step's full graph without its lookup (compute + consumer):
  the physical limit of any lookup path;
* host graph only, from the host node's own timestamps (native ``HostGraphGather.timing``):
  ``node_start_us`` (launch -> the host node starts: the graph's fork and the driver's callback
  hand-off), ``gather_us`` (the row loop), ``tail_us`` (the host node ends -> synchronize returns:
  the copy node, the join and whatever compute is left);
* ``--threads`` sweeps the host node's OpenMP threads on the same table (one fill).

    python scripts/gpu/host_graph_timeline.py --vocab 214748364 --tokens 256 --compute-us 200

Prints one JSON line per variant (medians over ``--reps`` replays)."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from ple_bench.backends import get_backend
from ple_bench.step import DecodeStep, check_step
from ple_bench.workload import make_ids


def _med(xs):
    return round(statistics.median(xs), 2) if xs else None


def _replays(step, kind, sets, reps, backend=None):
    run = step.runner(kind, "full")
    out = {"step_us": [], "node_start_us": [], "gather_us": [], "tail_us": []}
    for i in range(reps + 5):
        step.set_inputs(sets[i % len(sets)])
        t0 = time.monotonic_ns()
        run()
        torch.cuda.synchronize()
        t2 = time.monotonic_ns()
        if i < 5:
            continue
        out["step_us"].append((t2 - t0) / 1e3)
        if backend is not None:
            last = max(backend.host_node_timing(), key=lambda t: t["last_end_ns"])
            out["node_start_us"].append((last["last_start_ns"] - t0) / 1e3)
            out["gather_us"].append(last["last_us"])
            out["tail_us"].append((t2 - last["last_end_ns"]) / 1e3)
    return {k: _med(v) for k, v in out.items() if v}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=214748364)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--compute-us", type=float, default=200.0)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--threads", type=int, nargs="*", default=[16])
    ap.add_argument("--host-alloc", default="exact")
    args = ap.parse_args()
    heads, dim, seed = 16, 160, 11
    sets = [make_ids("uniform", args.tokens, heads, args.vocab, seed=s) for s in range(8)]

    dev = get_backend("device")(args.vocab, dim, dtype="fp8", num_heads=heads, max_tokens=args.tokens,
                                device="cuda", kernel="triton_reference")
    dev.fill_synthetic(seed, scale=0.5)
    step = DecodeStep(dev, hidden=args.hidden, num_tokens=args.tokens, compute_us=args.compute_us,
                      prefetch=False, graph="full", ids_on="device")
    check_step(step, sets, seed)
    res = {"variant": "resident_full", **_replays(step, "step", sets, args.reps),
           "compute_us": _replays(step, "compute", sets, args.reps)["step_us"]}
    print(json.dumps(res), flush=True)
    step.close()
    dev.close()
    del dev, step
    torch.cuda.empty_cache()

    cls = get_backend("pinned_host_graph")
    first = None
    for threads in args.threads:
        if first is None:
            b = cls(args.vocab, dim, dtype="fp8", num_heads=heads, max_tokens=args.tokens, device="cuda",
                    host_alloc=args.host_alloc, gather_threads=threads)
            b.fill_synthetic(seed, scale=0.5)
            first = b
        else:  # the same table, another host node (one fill)
            weight = first.weight
            shared = type("SharedHostGraph", (cls,), {"allocate_table": lambda self, r, d, dt: weight})
            b = shared(args.vocab, dim, dtype="fp8", num_heads=heads, max_tokens=args.tokens, device="cuda",
                       gather_threads=threads)
            b.set_scale(0.5)
        step = DecodeStep(b, hidden=args.hidden, num_tokens=args.tokens, compute_us=args.compute_us,
                          prefetch=True, graph="full", ids_on="host")
        check_step(step, sets, seed)
        rec = {"variant": f"host_graph_full_t{threads}", **_replays(step, "step", sets, args.reps, b),
               "compute_us": _replays(step, "compute", sets, args.reps)["step_us"]}
        print(json.dumps(rec), flush=True)
        step.close()
        if b is not first:
            b.close()
    first.close()


if __name__ == "__main__":
    main()
