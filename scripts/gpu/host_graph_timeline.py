"""Where a host-graph step's time goes, on the host clock, replay by replay, all paths
in ONE process (so every variant of a shape runs the same calibrated compute: the suite's workers
calibrate theirs each, which can differ by one matmul).

Per table and shape (tokens x compute), variants: the resident table (HBM, ids on the device,
full graph), ``pinned_host_graph`` (full graph and breakable), ``pinned_host_flag`` (full graph,
one piece and four: the gather posted right after the launch), ``pinned_cpu_gather`` (breakable,
the same pinned table), the resident table with other lookup kernels (``--resident-kernels``:
variants ``resident_<kernel>_full``) and the step written by hand in plain torch (``hand_step.py``:
``hand_resident``, ``hand_host``, ``hand_limit``); each step replayed after the ids are written
(the step's ``set_inputs``, which synchronizes first, as a server's scheduler does).  The first
variant of a shape calibrates its matmul count; every other variant of the shape runs that count.

* ``step_us``: replay launch -> synchronize returns (the host-sync timer's sample, without the feed);
* ``from_feed_us``: set_inputs called -> synchronize returns (the step from the moment its ids are
  known on the host: the figure to compare a path that starts its work in ``set_inputs`` with);
* ``compute_us``: the same for the step's graph without its lookup (compute + consumer) -- the
  resident full graph's is the physical limit of any lookup path;
* host graph only, from the host node's own timestamps (native ``HostGraphGather.timing``):
  ``node_start_us`` (launch -> the host node starts: the graph's fork and the driver's callback
  hand-off), ``gather_us`` (the row loop), ``tail_us`` (the host node ends -> synchronize returns:
  the copy node, the join and whatever compute is left); for the flag path the same from its
  team's timestamps (``node_start_us``: launch -> the post, which the step makes after the launch);

    python scripts/gpu/host_graph_timeline.py --vocab 214748364 320001536 --shapes 64x150 256x200 512x200

Prints one JSON line per variant (medians over ``--reps`` replays)."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from ple_bench.backends import get_backend
from ple_bench.run.step import DecodeStep, check_step
from ple_bench.workload import make_ids

from hand_step import HandStep


def _med(xs):
    return round(statistics.median(xs), 2) if xs else None


def _replays(step, kind, sets, reps, backend=None, mode="full"):
    run = step.runner(kind, mode)
    out = {"step_us": [], "from_feed_us": [], "node_start_us": [], "gather_us": [], "tail_us": []}
    for i in range(reps + 5):
        t_feed = time.monotonic_ns()
        step.set_inputs(sets[i % len(sets)])
        t0 = time.monotonic_ns()
        run()
        torch.cuda.synchronize()
        t2 = time.monotonic_ns()
        if i < 5:
            continue
        out["step_us"].append((t2 - t0) / 1e3)
        out["from_feed_us"].append((t2 - t_feed) / 1e3)
        if backend is not None:
            last = max(backend.host_node_timing(), key=lambda t: t["last_end_ns"])
            out["node_start_us"].append((last["last_start_ns"] - t0) / 1e3)
            out["gather_us"].append(last["last_us"])
            out["tail_us"].append((t2 - last["last_end_ns"]) / 1e3)
    return {k: _med(v) for k, v in out.items() if v}


def _shared(cls, weight):
    """``cls`` reading ``weight`` (one pinned table filled once for several paths)."""
    return type(f"Shared{cls.__name__}", (cls,), {"allocate_table": lambda self, r, d, dt: weight})


HAND = ("hand_resident", "hand_host", "hand_limit")
VARIANTS = (  # name, backend key, graph mode, prefetch, ids_on
    ("resident_full", "device", "full", False, "device"),
    ("host_graph_full", "host_graph", "full", True, "host"),
    ("host_flag_full", "host_flag", "full", True, "host"),
    ("host_flag4_full", "host_flag4", "full", True, "host"),
    ("cpu_gather_breakable", "cpu_gather", "breakable", True, "host"),
    ("host_graph_breakable", "host_graph", "breakable", True, "host"),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, nargs="+", default=[214748364])
    ap.add_argument("--shapes", nargs="+", default=["256x200"],
                    help="TOKENSxCOMPUTE_US pairs, e.g. 64x150 256x200 512x200")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--threads", type=int, default=0, help="host-node threads (0: the default)")
    ap.add_argument("--host-alloc", default="exact")
    ap.add_argument("--pin", action="store_true", help="the flag path's team pinned away from this thread's core")
    ap.add_argument("--flag-threads", type=int, nargs="+", default=[0],
                    help="the flag path's team sizes (0: its default); variants host_flag[4]_tN_full")
    ap.add_argument("--resident-kernels", nargs="+", default=[],
                    help="the resident table also with these lookup kernels (variants resident_<kernel>_full)")
    ap.add_argument("--variants", nargs="+", default=[v[0] for v in VARIANTS] + list(HAND))
    args = ap.parse_args()
    heads, dim, seed = 16, 160, 11
    shapes = [(int(a), float(b)) for a, b in (x.split("x") for x in args.shapes)]
    max_tokens = max(t for t, _ in shapes)
    variants = [v for v in VARIANTS if v[0] in args.variants]
    for threads in args.flag_threads:  # the flag path at other team sizes
        for chunks in (1, 4):
            key = f"host_flag{'' if chunks == 1 else chunks}_t{threads}"
            if threads and f"{key}_full" in args.variants:
                variants.append((f"{key}_full", key, "full", True, "host"))
    variants += [(f"resident_{k}_full", "device", "full", False, "device") for k in args.resident_kernels]
    hand = [v for v in HAND if v in args.variants]
    variants = {v[0]: v for v in variants}
    for vocab in args.vocab:
        backends = {}
        dev = get_backend("device")(vocab, dim, dtype="fp8", num_heads=heads, max_tokens=max_tokens,
                                    device="cuda", kernel="triton_reference")
        dev.fill_synthetic(seed, scale=0.5)
        backends["device"] = dev
        hg = get_backend("pinned_host_graph")(vocab, dim, dtype="fp8", num_heads=heads, max_tokens=max_tokens,
                                              device="cuda", host_alloc=args.host_alloc,
                                              gather_threads=args.threads)
        hg.fill_synthetic(seed, scale=0.5)
        backends["host_graph"] = hg
        cg = _shared(get_backend("pinned_cpu_gather"), hg.weight)(vocab, dim, dtype="fp8", num_heads=heads,
                                                                  max_tokens=max_tokens, device="cuda")
        cg.set_scale(0.5)
        backends["cpu_gather"] = cg
        for threads in args.flag_threads:
            for chunks in (1, 4):
                key = f"host_flag{'' if chunks == 1 else chunks}" + (f"_t{threads}" if threads else "")
                if f"{key}_full" not in variants:
                    continue
                hf = _shared(get_backend("pinned_host_flag"), hg.weight)(
                    vocab, dim, dtype="fp8", num_heads=heads, max_tokens=max_tokens, device="cuda",
                    gather_threads=threads, chunks=chunks, pin_threads=args.pin)
                hf.set_scale(0.5)
                backends[key] = hf
        for tokens, compute_us in shapes:
            sets = [make_ids("uniform", tokens, heads, vocab, seed=s) for s in range(8)]
            matmuls = None  # the shape's first variant calibrates; the others run its count
            for name, key, graph, prefetch, ids_on in variants.values():
                b = backends[key]
                kernel = name[len("resident_"):-len("_full")] if name.startswith("resident_") else ""
                if key == "device":
                    b.set_kernel(kernel if kernel in args.resident_kernels else b.default_kernel)
                work = {"compute_us": compute_us} if matmuls is None else {"compute_layers": matmuls}
                step = DecodeStep(b, hidden=args.hidden, num_tokens=tokens, prefetch=prefetch, graph=graph,
                                  ids_on=ids_on, **work)
                matmuls = step.compute_matmuls
                check_step(step, sets, seed)
                timing = b if key.startswith(("host_graph", "host_flag")) and graph == "full" else None
                step_t = _replays(step, "step", sets, args.reps, timing, graph)
                comp_t = _replays(step, "compute", sets, args.reps, None, graph)
                print(json.dumps({"vocab": vocab, "tokens": tokens, "compute_target_us": compute_us,
                                  "variant": name, "matmuls": step.compute_matmuls, **step_t,
                                  "compute_us": comp_t["step_us"]}), flush=True)
                step.close()
            if hand:
                if matmuls is None:
                    raise SystemExit("the hand variants take their matmul count from a project variant of "
                                     "the shape: name one in --variants")
                h = HandStep(dev.weight, hg.weight, 0.5, tokens=tokens, heads=heads, hidden=args.hidden,
                             matmuls=matmuls)
                h.build()
                h.check(sets[0])
                runs = {"hand_resident": h.run_resident, "hand_host": h.run_host, "hand_limit": h.run_limit}
                for name in hand:
                    print(json.dumps({"vocab": vocab, "tokens": tokens, "compute_target_us": compute_us,
                                      "variant": name, "matmuls": matmuls,
                                      "step_us": h.time_us(runs[name], sets, args.reps)}), flush=True)
                del h
        for b in reversed(list(backends.values())):
            b.close()
        del backends, cg, hg, dev
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
