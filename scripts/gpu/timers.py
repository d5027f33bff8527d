"""The two timers on one case, in one process: the engine's measurement and the rounds
``pytest suites/`` (pytest-benchmark) times, alternated, with the engine's warm-up varied.

Run on the GPU machine (scripts/gpu/prelude.sh sourced):

    python3 scripts/gpu/timers.py [CASE_PREFIX ...]

For each case: the engine's median (host clock) and its CUDA-event median of the same calls, the
bridge's rounds timed as pytest-benchmark times them (setup untimed, the round on perf_counter),
then the engine again, the engine with 200 ms of warm-up, and the bridge again.  Where the engine's
first figure differs from the rest, the difference is the state the engine sampled, not the path."""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time

import torch

from ple_bench.measure import TimingPolicy
from ple_bench.run.bench import bench_target
from ple_bench.run.executor import CaseExecutor, case_grid_cap
from ple_bench.run.loop import order_cases
from ple_bench.spec.suite import load_suite

DEFAULT = ("lookup.pinned_cpu_gather.v4096.d160.fp8.h4.t8.pf-",
           "step.pinned_uva.triton_reference.v4096.d160.fp8.h4.t8.pf.c20us.idshost",
           "step.pinned_copy_engine.v4096.d160.fp8.h4.t8.pf.c20us-",
           "lookup.pinned_cpu_gather.v4096.d160.fp8.h4.t8.pf.idshost")


def spread(xs) -> str:
    q = statistics.quantiles(xs, n=10)
    return f"p10 {q[0]:.3f} p50 {statistics.median(xs):.3f} p90 {q[-1]:.3f} n={len(xs)}"


def cpu_mhz() -> str:
    """The clock of the core this process runs on now (/proc/cpuinfo), and the core."""
    core = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[36])  # field 39: the last CPU
    try:
        blocks = open("/proc/cpuinfo").read().split("\n\n")
        mhz = [ln.split(":")[1].strip() for ln in blocks[core].splitlines() if ln.startswith("cpu MHz")]
        return f"cpu{core} {float(mhz[0]):.0f} MHz" if mhz else f"cpu{core}"
    except (OSError, IndexError, ValueError):
        return f"cpu{core}"


def engine(executor, case, policy) -> str:
    rec = executor.run(case, policy)
    ev = rec.get("event_samples_ms") or rec.get("step_event_samples_ms")
    return (f"{spread(rec['samples_ms'])}" + (f" (events p50 {statistics.median(ev):.3f})" if ev else "")
            + f" | SM {rec.get('sm_clock_mhz')} MHz | {cpu_mhz()}")


def bridge(executor, case, policy, rounds: int = 200) -> str:
    with case_grid_cap(case, executor.table.backend):
        t = bench_target(executor, case, policy)
        try:
            t.warm_up()
            out = []
            for _ in range(rounds):
                if t.setup is not None:
                    t.setup()
                t0 = time.perf_counter_ns()
                t.target()
                out.append((time.perf_counter_ns() - t0) / 1e6)
        finally:
            t.close()
    return f"{spread(out)} | {cpu_mhz()}"


def main(prefixes: list[str]) -> None:
    suite = load_suite("smoke")
    policy = TimingPolicy.from_dict(suite.timing or {})
    warm = dataclasses.replace(policy, warmup_ms=200.0)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    executor = CaseExecutor(rank=0, world_size=1, device=device)
    cases = [c for c in order_cases(suite.cases) if c.world_size == 1 and any(c.case_id.startswith(p) for p in prefixes)]
    print(f"{len(cases)} cases; smoke policy warmup_ms={policy.warmup_ms} min/max samples "
          f"{policy.min_samples}/{policy.max_samples} max_time_s={policy.max_time_s}")
    long = dataclasses.replace(policy, warmup_ms=200.0, min_samples=200, max_samples=2000, min_time_s=1.0,
                               max_time_s=1.0)
    for case in cases:
        print(case.case_id, flush=True)
        for name, run in (("engine (smoke policy)", lambda: engine(executor, case, policy)),
                          ("bridge (200 rounds)", lambda: bridge(executor, case, policy)),
                          ("engine again", lambda: engine(executor, case, policy)),
                          ("engine, 200 ms warm-up", lambda: engine(executor, case, warm)),
                          ("engine, 1 s of samples", lambda: engine(executor, case, long)),
                          ("bridge again", lambda: bridge(executor, case, policy)),
                          ("engine, 1 s again", lambda: engine(executor, case, long))):
            print(f"  {name:24s} {run()}", flush=True)

if __name__ == "__main__":
    main(sys.argv[1:] or list(DEFAULT))
