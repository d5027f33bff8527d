"""``ple_bench.measure.repeat``: the one loop for "median of repeated timed calls"
-- fixed counts, a budget, regions a call records -- and its users: the
decode step's compute regions and the all-reduce bus bandwidth (the ceilings' use is
covered by tests/test_measure.py and tests/test_ceilings.py)."""

from __future__ import annotations

import torch

from ple_bench.measure.repeat import Stopwatch, repeat_timed


def test_repeat_timed_takes_the_fixed_count_and_calls_before_each():
    order = []
    res = repeat_timed(lambda: order.append("fn"), device="cpu", warmup=2, min_repeats=4,
                       before=lambda: order.append("before"))
    assert len(res.samples_ms) == 4 and res.timer == "host_monotonic"
    assert order == ["before", "fn"] * 6  # warm-up included
    assert res.median_ms == sorted(res.samples_ms)[1] / 2 + sorted(res.samples_ms)[2] / 2


def test_repeat_timed_stops_on_its_budget_between_min_and_max():
    import time

    res = repeat_timed(lambda: time.sleep(0.01), device="cpu", warmup=0, min_repeats=2, max_repeats=1000,
                       budget_s=0.05)
    assert 2 <= len(res.samples_ms) < 20
    assert all(s >= 9.0 for s in res.samples_ms)  # each sample is one call of >= 10 ms


def test_repeat_timed_reads_a_region_the_call_records():
    import time

    watch = Stopwatch("cpu")

    def call():
        time.sleep(0.002)  # outside the region
        watch.start()
        time.sleep(0.02)
        watch.stop()

    res = repeat_timed(call, device="cpu", warmup=1, min_repeats=3, region=watch)
    assert len(res.samples_ms) == 3 and len(watch) == 4  # the warm-up's region is left out
    assert all(19.0 <= s < 40.0 for s in res.samples_ms)


def test_the_step_regions_come_from_the_repeat_loop(monkeypatch):
    from ple_bench.run import step as step_mod
    from tests.test_host_ids import _backend

    calls = []
    real = step_mod.repeat_timed

    def spy(fn, **kw):
        calls.append(kw)
        return real(fn, **kw)

    monkeypatch.setattr(step_mod, "repeat_timed", spy)
    step = step_mod.DecodeStep(_backend("device"), hidden=24, num_tokens=6, compute_layers=2)
    fed = []
    samples = step.compute_region_samples("compute", 5, feed=lambda: fed.append(1), warmup=2)
    assert len(samples) == 5 and all(s > 0 for s in samples) and len(fed) == 7
    assert calls[-1]["region"] is not None and calls[-1]["min_repeats"] == 5


def test_allreduce_busbw_is_timed_by_the_repeat_loop(monkeypatch, tmp_path):
    import torch.distributed as dist

    from ple_bench.run import rank

    calls = []
    real = rank.repeat_timed

    def spy(fn, **kw):
        calls.append(kw)
        return real(fn, **kw)

    monkeypatch.setattr(rank, "repeat_timed", spy)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        out = rank.allreduce_busbw(torch.device("cpu"), 1)
    finally:
        dist.destroy_process_group()
    assert list(out) == ["allreduce_busbw_gbps_w1"]
    (kw,) = calls
    assert kw["min_repeats"] == 10 and kw["warmup"] == 3 and kw["host"] is True and kw["before"] is dist.barrier
