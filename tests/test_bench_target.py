"""``pytest suites/``'s round (:func:`ple_bench.run.bench.bench_target`) and the engine's sample time
the same work: each calls the case's timed callable once, and a slow part of it (the step's id
refill, a prefetch's start) is inside both clocks.  A bridge that times a copy of the callable
missing a part, or that moves the id refill out of the timed call, fails here."""

from __future__ import annotations

import time

import pytest
import torch

import ple_bench.measure as measure_mod
from ple_bench.backends.pinned_uva import PinnedUVAEmbedding
from ple_bench.measure import TimingPolicy
from ple_bench.run import step as step_mod
from ple_bench.run.bench import bench_target
from ple_bench.run.executor import CaseExecutor
from ple_bench.spec.case import Case

SLOW_S = 0.004  # the slow part: far above the rest of a tiny CPU call


def _policy() -> TimingPolicy:
    return TimingPolicy(warmup_ms=0.0, min_samples=3, max_samples=4, min_time_s=0.0, max_time_s=30.0,
                        max_noise=0.0, cold_l2=False, hot=False, graph=False, id_sets=3,
                        remeasure_unstable=False)


CASES = {
    # the step: its id refill (set_inputs) is slow; the step body is counted
    "step": (Case(kind="step", impl="pinned_uva", vocab_size=4096, dim=64, dtype="fp32", num_heads=4, num_tokens=8,
                  hidden=128, compute_us=20.0, prefetch=True),
             "step", step_mod.DecodeStep, "set_inputs", step_mod.DecodeStep, "body_step"),
    # a prefetching lookup: its start is slow; its finalize is counted
    "lookup": (Case(kind="lookup", impl="pinned_uva", vocab_size=4096, dim=64, dtype="fp32", num_heads=4,
                    num_tokens=8, prefetch=True),
               "lookup", PinnedUVAEmbedding, "start_prefetch", PinnedUVAEmbedding, "finalize"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_engine_sample_and_bench_round_time_the_same_call(name, monkeypatch):
    case, label, slow_cls, slow_name, counted_cls, counted_name = CASES[name]
    calls = {"slow": 0, "counted": 0}
    slow_orig, counted_orig = getattr(slow_cls, slow_name), getattr(counted_cls, counted_name)

    def slow(self, *a, **kw):
        calls["slow"] += 1
        time.sleep(SLOW_S)
        return slow_orig(self, *a, **kw)

    def counted(self, *a, **kw):
        calls["counted"] += 1
        return counted_orig(self, *a, **kw)

    monkeypatch.setattr(slow_cls, slow_name, slow)
    monkeypatch.setattr(counted_cls, counted_name, counted)

    # the engine: the case's primary measurement (label "step" / "lookup"), calls counted around it
    seen = {}
    real_measure = measure_mod.measure

    def spy(fn, **kw):
        before = dict(calls)
        m = real_measure(fn, **kw)
        if kw.get("label") == label and label not in seen:
            seen[label] = (m, {k: calls[k] - before[k] for k in calls})
        return m

    monkeypatch.setattr(measure_mod, "measure", spy)
    executor = CaseExecutor(device=torch.device("cpu"))
    try:
        executor.run(case, _policy())
        m, during = seen[label]
        per_sample = m.warmup_calls + len(m.samples_ms)  # the CPU timer: warm-up calls, then one call a sample
        assert during == {"slow": per_sample, "counted": per_sample}
        assert min(m.samples_ms) >= SLOW_S * 1e3, m.samples_ms

        # pytest suites/: one round = one call of the same callable, the slow part inside its clock
        target = bench_target(executor, case, _policy())
        try:
            assert target.setup is None and target.timer == "host" and target.engine_timer == "host_monotonic"
            # warmed up as the engine: the policy's warmup_ms (0 here) of calls, at least one
            before = dict(calls)
            warm = target.warm_up()
            assert warm == m.warmup_calls == 1
            assert {k: calls[k] - before[k] for k in calls} == {"slow": 1, "counted": 1}
            t0 = time.perf_counter()
            target.target()
            target.warmup_ms = 2.5e3 * (time.perf_counter() - t0)  # two and a half calls' time
            t0 = time.perf_counter()
            assert target.warm_up() >= 2 and time.perf_counter() - t0 >= target.warmup_ms / 1e3
            for _ in range(3):
                before = dict(calls)
                t0 = time.perf_counter()
                target.target()
                took = time.perf_counter() - t0
                assert {k: calls[k] - before[k] for k in calls} == {"slow": 1, "counted": 1}
                assert took >= SLOW_S
        finally:
            target.close()
    finally:
        executor.release_table()


def test_step_feed_refills_the_next_id_set_inside_the_timed_call():
    """StepFeed, the callable both timers time for a step: the next id set, then the runner."""
    fed, ran = [], []

    class FakeStep:
        def set_inputs(self, ids, counts=None):
            fed.append((int(ids[0, 0]), counts))

    sets = [torch.full((2, 1), v) for v in (5, 6, 7)]
    feed = step_mod.StepFeed(FakeStep(), sets, [2])
    fn = feed.timed(lambda: ran.append(len(fed)))
    for _ in range(4):
        fn()
    assert fed == [(5, [2]), (6, [2]), (7, [2]), (5, [2])]
    assert ran == [1, 2, 3, 4]  # the runner runs after its refill, in the same call
    with pytest.raises(ValueError):
        step_mod.StepFeed(FakeStep(), [])
