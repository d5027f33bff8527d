"""GPU checks of the per-case ceilings and the repeat loop:
``python -m pytest -m gpu tests/gpu`` on a GPU machine; skipped with the reason elsewhere.

A lookup is held against the random-row ceiling of its own table, row size and id
distribution, timed as it is (CUDA events, cold L2, rotating id sets); on a GPU no
lookup may exceed 105 % of it -- where one does, the ceiling is wrong."""

from __future__ import annotations

import pytest
import torch

from ple_bench.spec.case import Case
from ple_bench.run.executor import CaseExecutor
from ple_bench.measure import TimingPolicy
from ple_bench.measure.repeat import Stopwatch, repeat_timed
from ple_bench.record import CEILING_SLACK_PCT
from ple_bench.record import RunContext, build

pytestmark = pytest.mark.gpu

VOCAB_1GIB, DIM = 6_710_886, 160  # fp8: 160 B rows, 1 GiB


def _policy() -> TimingPolicy:
    return TimingPolicy(max_time_s=0.5, hot=False, graph=False)


def _run(ex: CaseExecutor, case: Case) -> dict:
    result = ex.measure(case, _policy())
    rec = build(case, result, RunContext({"mode": "gpu", "ceilings": {}}))
    rec["_entry"] = result.random_row_ceilings
    return rec


@pytest.mark.parametrize("impl,kernel,memory", [("device", "triton_reference", "device"),
                                                ("pinned_uva", "triton_reference", "pinned"),
                                                ("pinned_uva", "triton_tuned", "pinned")])
@pytest.mark.parametrize("ids", ["uniform", "zipf:1.1"])
@pytest.mark.parametrize("tokens", [256, 4096])
def test_kernel_path_lookups_stay_within_their_own_random_row_ceiling(impl, kernel, memory, ids, tokens):
    ex = CaseExecutor(device=torch.device("cuda", torch.cuda.current_device()))
    case = Case(impl=impl, kernel=kernel, vocab_size=VOCAB_1GIB, dim=DIM, dtype="fp8", num_heads=16,
                num_tokens=tokens, ids=ids)
    try:
        rec = _run(ex, case)
    finally:
        ex.release_table()
    entries = {e["key"]: e for e in rec["_entry"]}
    entry, own = entries[rec["random_row_ceiling"]], entries[rec["random_row_ceiling_at_rows"]]
    assert own["rows"] == rec["rows"] and own["ids"] == ids and own["timer"] == "cuda_event"
    assert entry["memory"] == memory and entry["ids"] == ids and entry["row_bytes"] == DIM
    assert entry["timer"] == rec["timer"] == "cuda_event"
    assert entry["cold_l2"] is rec["cold_l2"] is True
    # held against the plain gather of its own batch, the bandwidth-bound batch's figure beside it
    assert rec["ceiling"] == f"{memory}_random_row_at_rows" and rec["ceiling_gbps"] == own["gbps"]
    assert rec["pct_of_bandwidth_ceiling"] == pytest.approx(100 * rec["gbps"] / entry["gbps"])
    assert rec["gbps"] == pytest.approx(rec["rows"] * DIM / (rec["median_ms"] * 1e6))
    print(f"{impl}/{kernel} {ids} {tokens} tok: {rec['gbps']:.1f} of {rec['ceiling_gbps']:.1f} GB/s "
          f"= {rec['pct_of_ceiling']:.0f}% (of the bandwidth-bound batch: {rec['pct_of_bandwidth_ceiling']:.0f}%)")
    assert rec["pct_of_ceiling"] <= CEILING_SLACK_PCT and rec["ceiling_exceeded"] is False


def test_the_host_gather_ceiling_is_timed_as_the_host_path():
    ex = CaseExecutor(device=torch.device("cuda", torch.cuda.current_device()))
    case = Case(impl="pinned_cpu_gather", vocab_size=VOCAB_1GIB, dim=DIM, dtype="fp8", num_heads=16,
                num_tokens=256, ids_on="host")
    try:
        rec = ex.run(case, _policy())
    finally:
        ex.release_table()
    ceiling = rec["host_gather_ceiling"]
    assert ceiling["timer"] == rec["timer"] == "host_sync" and ceiling["cold_l2"] is rec["cold_l2"] is True
    assert ceiling["warm_ms"] > 0 and rec["host_gather_ceiling_warm_ms"] == ceiling["warm_ms"]
    print(f"host gather: lookup {rec['median_ms']:.4f} ms, ceiling {ceiling['ms']:.4f} ms cold, "
          f"{ceiling['warm_ms']:.4f} ms warm: {rec['pct_of_host_gather_ceiling']:.0f}%")
    assert rec["pct_of_host_gather_ceiling"] <= CEILING_SLACK_PCT


def test_repeat_timed_on_cuda_events_times_the_kernel():
    dev = torch.device("cuda", torch.cuda.current_device())
    res = repeat_timed(lambda: torch.cuda._sleep(2_000_000), device=dev, warmup=1, min_repeats=5)
    assert res.timer == "cuda_event" and len(res.samples_ms) == 5
    host = repeat_timed(lambda: torch.cuda._sleep(2_000_000), device=dev, warmup=1, min_repeats=5, host=True)
    assert host.timer == "host_sync"
    # the host clock around a synchronized call covers the kernel the events time
    assert host.median_ms >= 0.9 * res.median_ms > 0
    watch = Stopwatch(dev)
    for _ in range(3):
        watch.start()
        torch.cuda._sleep(1_000_000)
        watch.stop()
    assert len(watch.samples_ms()) == 3 and min(watch.samples_ms()) > 0
