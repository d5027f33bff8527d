"""ple_bench.measure on the CPU: statistics, stopping rules with fake clocks and
sample streams, the host-timer measurement, policy parsing, machine info,
CPU ceilings and the profiler window's no-op."""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from ple_bench.measure import (
    ClockSampler, Criterion, GraphCaptureError, L2Flusher, Measurement, RelativeNoise, SampleCount,
    Stopper, TimeBudget, TimingPolicy, device_info, l2_flush, measure, measure_ceilings, measure_graph,
    profiler_window, relative_noise, run_sampling, set_profiler_window, stopper_for, summarize,
)
from ple_bench.measure import timer as timer_mod

CPU = torch.device("cpu")


# ------------------------------------------------------------------ helpers
class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def stream_batches(values, clock: FakeClock | None = None, dt: float = 0.0, mhz=None):
    """take_batch over a fixed sequence; each sample advances the fake clock."""
    it = iter(values)
    taken = []

    def take(k):
        out = [next(it) for _ in range(k)]
        taken.append(k)
        if clock is not None:
            clock.t += dt * k
        reading = mhz(sum(taken)) if callable(mhz) else mhz
        return out, reading

    take.taken = taken
    return take


def policy(**kw) -> TimingPolicy:
    base = dict(warmup_ms=0.0, min_samples=10, max_samples=500, min_time_s=0.0, max_time_s=1e9, max_noise=0.01)
    base.update(kw)
    return TimingPolicy(**base)


# -------------------------------------------------------------------- stats
def test_summarize_known_array():
    st = summarize([float(x) for x in range(1, 11)])
    assert st["n"] == 10
    assert st["median"] == 5.5 and st["mean"] == 5.5
    assert st["min"] == 1.0 and st["max"] == 10.0
    assert st["q1"] == pytest.approx(3.25) and st["q3"] == pytest.approx(7.75)
    assert st["p10"] == pytest.approx(1.9) and st["p90"] == pytest.approx(9.1)
    assert st["iqr"] == pytest.approx(4.5)
    assert st["cv"] == pytest.approx(math.sqrt(8.25) / 5.5)


def test_summarize_random_matches_statistics():
    rng = np.random.default_rng(7)
    xs = list(rng.lognormal(0.0, 0.3, size=257) + 0.5)
    st = summarize(xs)
    assert st["median"] == pytest.approx(statistics.median(xs))
    assert st["mean"] == pytest.approx(statistics.fmean(xs))
    assert st["cv"] == pytest.approx(statistics.pstdev(xs) / statistics.fmean(xs))
    assert st["min"] == min(xs) and st["max"] == max(xs)
    assert st["p10"] < st["q1"] < st["median"] < st["q3"] < st["p90"]
    json.dumps(st, allow_nan=False)
    assert all(type(v) in (int, float) for v in st.values())


def test_summarize_one_sample_and_errors():
    st = summarize([2.5])
    assert st["n"] == 1
    assert all(st[k] == 2.5 for k in ("median", "mean", "min", "max", "p10", "p90", "q1", "q3"))
    assert st["iqr"] == 0.0 and st["cv"] == 0.0
    with pytest.raises(ValueError):
        summarize([])
    with pytest.raises(ValueError):
        summarize([1.0, float("nan")])


def test_relative_noise():
    assert relative_noise([1.0, 1.0, 1.0]) == math.inf  # too few samples
    assert relative_noise([3.0] * 8) == 0.0
    xs = [float(x) for x in range(1, 11)]  # IQR 4.5, median 5.5
    expected = 1.96 * 1.2533 / 1.349 * 4.5 / math.sqrt(10) / 5.5
    assert relative_noise(xs) == pytest.approx(expected)
    rng = np.random.default_rng(5)
    ys = list(rng.normal(10.0, 0.5, size=400))
    q1, med, q3 = np.percentile(ys, [25, 50, 75])
    assert relative_noise(ys) == pytest.approx(1.96 * 1.2533 / 1.349 * (q3 - q1) / 20.0 / med)
    # for normal data the IQR estimate is close to the textbook 1.2533 * sigma / sqrt(n) / median
    assert relative_noise(ys) == pytest.approx(1.96 * 1.2533 * 0.5 / 20.0 / 10.0, rel=0.15)


# ----------------------------------------------------------------- stopping
def test_noise_target_reached_fast_on_steady_samples():
    rng = np.random.default_rng(1)
    clock = FakeClock()
    values = list(1.0 + rng.uniform(-1e-3, 1e-3, size=1000))
    take = stream_batches(values, clock, dt=1e-3)
    res = run_sampling(take, stopper_for(policy(min_samples=10), clock), max_samples=500)
    assert res.stopped_by == "noise"
    assert len(res.samples_ms) == 10
    assert res.samples_ms == pytest.approx(values[:10])


def test_min_samples_honoured():
    clock = FakeClock()
    take = stream_batches([2.0] * 1000, clock, dt=1e-3)
    res = run_sampling(take, stopper_for(policy(min_samples=37), clock), max_samples=500)
    assert (res.stopped_by, len(res.samples_ms)) == ("noise", 37)


def test_min_time_honoured():
    clock = FakeClock()
    take = stream_batches([2.0] * 1000, clock, dt=0.01)
    res = run_sampling(take, stopper_for(policy(min_samples=3, min_time_s=0.5), clock), max_samples=500)
    assert res.stopped_by == "noise"
    assert len(res.samples_ms) == 50  # 50 samples x 10 ms = min_time


def test_max_samples_cap_exact_with_batches():
    rng = np.random.default_rng(2)
    clock = FakeClock()
    take = stream_batches(list(rng.lognormal(0, 1.0, size=1000)), clock, dt=1e-4)
    res = run_sampling(take, stopper_for(policy(max_samples=45, max_noise=1e-6), clock),
                       max_samples=45, batch_size=7)
    assert res.stopped_by == "max_samples"
    assert len(res.samples_ms) == 45
    assert take.taken == [7, 7, 7, 7, 7, 7, 3]


def test_max_time_cap():
    rng = np.random.default_rng(3)
    clock = FakeClock()
    take = stream_batches(list(rng.lognormal(0, 1.0, size=1000)), clock, dt=0.125)
    res = run_sampling(take, stopper_for(policy(min_samples=2, max_time_s=1.0, max_noise=1e-6), clock),
                       max_samples=500)
    assert res.stopped_by == "max_time"
    assert len(res.samples_ms) == 8


def test_max_time_still_takes_one_sample():
    clock = FakeClock()
    take = stream_batches([5.0] * 10, clock, dt=10.0)
    res = run_sampling(take, stopper_for(policy(max_time_s=1.0), clock), max_samples=500)
    assert (res.stopped_by, len(res.samples_ms)) == ("max_time", 1)


def test_throttled_samples_do_not_count_for_noise():
    clock = FakeClock()
    # clock reading: 900 MHz for the first 20 samples (of a 2000 MHz part), then 1950
    take = stream_batches([1.0] * 100, clock, dt=1e-3, mhz=lambda n: 900.0 if n <= 20 else 1950.0)
    res = run_sampling(take, stopper_for(policy(min_samples=10), clock), max_samples=500,
                       is_throttled=lambda mhz: mhz is not None and mhz < 0.75 * 2000)
    assert res.stopped_by == "noise"
    assert len(res.samples_ms) == 30  # 20 throttled + 10 valid
    assert res.throttled == [True] * 20 + [False] * 10
    assert res.sm_clock_mhz[0] == 900.0 and res.sm_clock_mhz[-1] == 1950.0


def test_stopper_reason_order_and_custom_criterion():
    class AfterN(Criterion):
        reason = "custom"

        def __init__(self, n):
            self.n, self.seen = n, 0

        def update(self, sample_ms):
            self.seen += 1

        def done(self):
            return self.reason if self.seen >= self.n else None

    stopper = Stopper([AfterN(4), SampleCount(4)])
    stopper.start()
    for x in (1.0, 2.0, 3.0):
        stopper.update(x)
        assert stopper.done() is None
    stopper.update(4.0)
    assert stopper.done() == "custom"  # first in the list wins
    with pytest.raises(ValueError):
        Stopper([])
    clock = FakeClock()
    tb = TimeBudget(2.0, clock=clock)
    tb.start()
    clock.t += 1.9
    assert tb.done() is None
    clock.t += 0.2
    assert tb.done() == "max_time"
    rn = RelativeNoise(0.5, min_samples=4, clock=clock)
    rn.start()
    for x in (1.0, 1.0, 1.0):
        rn.update(x)
    assert rn.done() is None
    rn.update(1.0)
    assert rn.done() == "noise"


# ----------------------------------------------------------------- measure
def test_measure_cpu_matmul_counts_calls_and_times_host():
    torch.manual_seed(0)
    a = torch.randn(64, 64) + 3.0
    calls = {"n": 0}

    def fn():
        calls["n"] += 1
        a.matmul(a)

    # one try only: under load a series' halves can disagree, and the second try's calls (with the
    # first try's, discarded) are not the counts this test checks
    pol = policy(warmup_ms=2.0, min_samples=5, max_samples=20, max_time_s=2.0, max_noise=1e-9,
                 remeasure_unstable=False)
    m = measure(fn, device=CPU, policy=pol, label="mm")
    assert m.timer == "host_monotonic"
    assert m.warmup_calls >= 1
    assert calls["n"] == m.warmup_calls + len(m.samples_ms)
    assert 1 <= len(m.samples_ms) <= 20
    assert all(s > 0 for s in m.samples_ms)
    assert m.sm_clock_mhz == [None] * len(m.samples_ms)
    assert m.throttled == [False] * len(m.samples_ms)
    assert m.stopped_by in ("max_samples", "max_time")
    assert m.cold_l2 is False and m.label == "mm"
    st = m.stats()
    json.dumps(st, allow_nan=False)
    assert st["n_samples"] == len(m.samples_ms) and st["median_ms"] > 0


def test_measure_cpu_times_a_known_sleep():
    pol = policy(warmup_ms=0.0, min_samples=3, max_samples=4)
    m = measure(lambda: time.sleep(0.003), device="cpu", policy=pol)
    assert m.warmup_calls == 1  # warm-up takes at least one call even with no budget
    assert len(m.samples_ms) >= 3
    assert all(s >= 3.0 for s in m.samples_ms)  # sleep(3 ms) never returns early
    assert min(m.samples_ms) < 200.0


def test_measure_uses_injected_clock_and_nvtx_ranges(monkeypatch):
    names = []

    @contextlib.contextmanager
    def fake_annotate(name, color="blue"):
        names.append(("push", name))
        yield
        names.append(("pop", name))

    monkeypatch.setattr(timer_mod, "annotate", fake_annotate)
    clock = FakeClock()

    def fn():
        time.sleep(0.02)  # > the 10 ms batch target: one sample per batch
        clock.t += 1.0  # every call "takes" one second of the stopping clock

    pol = policy(min_samples=2, max_time_s=3.0, max_noise=1e-9)
    m = measure(fn, device=CPU, policy=pol, label="case-x", clock=clock)
    assert m.stopped_by == "max_time" and len(m.samples_ms) == 3
    assert names == [("push", "case-x"), ("push", "warmup"), ("pop", "warmup"),
                     ("push", "measurement"), ("pop", "measurement"), ("pop", "case-x")]


def test_measurement_stats_drop_throttled():
    m = Measurement(samples_ms=[1.0, 1.1, 0.9, 5.0, 6.0], timer="cuda_event",
                    sm_clock_mhz=[1900.0, 1900.0, 1900.0, 800.0, 800.0],
                    throttled=[False, False, False, True, True], stopped_by="noise", warmup_calls=3)
    st = m.stats()
    assert st["median_ms"] == pytest.approx(1.0) and st["max_ms"] == pytest.approx(1.1)
    assert (st["n_samples"], st["throttled_samples"], st["dropped_samples"]) == (3, 2, 2)
    assert st["sm_clock_mhz"] == 1900.0
    assert st["noise"] is None  # three samples: not estimable
    full = m.stats(drop_throttled=False)
    assert full["median_ms"] == pytest.approx(1.1) and full["max_ms"] == 6.0 and full["n_samples"] == 5
    all_bad = Measurement([2.0, 4.0], "cuda_event", [700.0, 700.0], [True, True], "max_time", 1)
    st2 = all_bad.stats()
    assert st2["median_ms"] == 3.0 and st2["n_samples"] == 2 and st2["dropped_samples"] == 0
    json.dumps([st, full, st2], allow_nan=False)


def test_measure_graph_needs_cuda():
    with pytest.raises(GraphCaptureError, match="CUDA"):
        measure_graph(lambda: None, device=CPU, policy=policy())


# ------------------------------------------------------------------ policy
def test_policy_from_dict_ok_and_errors():
    p = TimingPolicy.from_dict({"warmup_ms": 10, "min_samples": 5, "max_samples": 50, "cold_l2": False})
    assert p.warmup_ms == 10.0 and isinstance(p.warmup_ms, float)
    assert (p.min_samples, p.max_samples, p.cold_l2, p.hot) == (5, 50, False, True)
    with pytest.raises(ValueError, match="max_sample_count"):
        TimingPolicy.from_dict({"max_sample_count": 3})
    with pytest.raises(ValueError, match="warmup_ms"):
        TimingPolicy.from_dict({"warmup_ms": "25"})
    with pytest.raises(ValueError, match="min_samples"):
        TimingPolicy.from_dict({"min_samples": 2.5})
    with pytest.raises(ValueError, match="max_samples"):
        TimingPolicy.from_dict({"max_samples": True})
    with pytest.raises(ValueError, match="cold_l2"):
        TimingPolicy.from_dict({"cold_l2": 1})
    with pytest.raises(ValueError, match="max_samples must be >= min_samples"):
        TimingPolicy.from_dict({"min_samples": 20, "max_samples": 10})
    with pytest.raises(ValueError, match="throttle_threshold"):
        TimingPolicy.from_dict({"throttle_threshold": 1.5})
    with pytest.raises(ValueError, match="min_time_s must be <= max_time_s"):
        TimingPolicy(min_time_s=5.0, max_time_s=1.0)
    with pytest.raises(ValueError):
        TimingPolicy.from_dict(["warmup_ms", 1])


def test_policy_scaled_for_cpu():
    p = TimingPolicy().scaled_for_cpu()
    assert p.max_samples <= 5 and p.min_samples <= p.max_samples
    assert p.max_time_s <= 0.25 and p.min_time_s == 0.0 and p.warmup_ms <= 1.0
    assert (p.cold_l2, p.graph, p.hot) == (False, False, True)
    assert TimingPolicy(max_samples=2, min_samples=1).scaled_for_cpu().max_samples == 2


# ------------------------------------------------- machine, ceilings, profiler
def test_device_info_and_clocks_on_cpu():
    info = device_info(CPU)
    json.dumps(info)
    assert info["type"] == "cpu" and info["cpu_cores"] >= 1
    assert isinstance(info["name"], str) and info["name"]
    assert info["memory_bytes"] is None or info["memory_bytes"] > 0
    sampler = ClockSampler(CPU)
    assert not sampler.available and sampler.read() is None
    assert sampler.is_throttled(None, 0.75) is False


def test_l2_flush_is_noop_on_cpu():
    f = L2Flusher(CPU)
    assert not f.active
    f.flush()
    l2_flush(CPU)


def test_measure_ceilings_cpu_small():
    t0 = time.perf_counter()
    c = measure_ceilings(CPU, budget_s=0.2, pinned_table_bytes=4 << 20)
    assert time.perf_counter() - t0 < 20
    assert c["ceilings_timer"] == "host_monotonic"
    for key in ("host_memcpy_gbps", "host_random_row_gbps", "host_random_row_gbps_160B",
                "host_random_row_gbps_512B", "host_random_row_rows_per_s", "ceilings_seconds"):
        assert c[key] > 0 and math.isfinite(c[key]), key
    assert c["host_random_row_gbps"] == max(c["host_random_row_gbps_160B"], c["host_random_row_gbps_512B"])
    # gbps and rows/s of one row size are the same measurement
    assert c["host_random_row_gbps_160B"] * 1e9 / 160 == pytest.approx(c["host_random_row_rows_per_s_160B"])
    assert not any(k.startswith(("h2d", "d2d", "pinned")) for k in c)


def test_profiler_window_noop_on_cpu(monkeypatch):
    def boom():
        raise AssertionError("cudaProfilerStart must not be called without CUDA")

    monkeypatch.setattr(torch.cuda.profiler, "start", boom)
    monkeypatch.setattr(torch.cuda.profiler, "stop", boom)
    ran = []
    try:
        set_profiler_window(True)
        with profiler_window() as on:
            ran.append(on)
    finally:
        set_profiler_window(False)
    with profiler_window() as on:
        ran.append(on)
    assert ran == [False, False]


# ---------------------------------------- the CUDA path, on a fake CUDA runtime
class FakeGPU:
    """Stands in for torch.cuda: work advances a fake GPU clock (ms); events
    read it; every call is logged, so ordering and timed regions can be checked."""

    def __init__(self, monkeypatch, mhz=1900.0, max_mhz=2000.0):
        self.now_ms = 0.0
        self.log: list[str] = []
        gpu = self

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self, stream=None):
                self.t = gpu.now_ms
                gpu.log.append("record")

            def synchronize(self):
                gpu.log.append("sync")

            def elapsed_time(self, other):
                return other.t - self.t

        class Stream:
            def __init__(self, device=None):
                pass

            def synchronize(self):
                gpu.log.append("sync")

            def wait_stream(self, other):
                pass

        class Graph:
            def __init__(self):
                self.captured = []

            def replay(self):
                gpu.log.append("replay")
                for f in self.captured:
                    f()

        @contextlib.contextmanager
        def graph_ctx(graph, stream=None):
            gpu.capturing = graph
            try:
                yield
            finally:
                gpu.capturing = None

        class Sampler:
            def __init__(self, device):
                self.max_sm_clock_mhz = max_mhz

            def read(self):
                return mhz

            def is_throttled(self, reading, threshold):
                return ClockSampler.is_throttled(self, reading, threshold)

        class Flusher:
            def flush(self):
                gpu.log.append("flush")
                gpu.now_ms += 0.2  # takes GPU time, must not be in any sample

        self.capturing = None
        stream = Stream()
        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "graph", graph_ctx)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream)
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: (gpu.log.append("hold"),
                                                                  setattr(gpu, "now_ms", gpu.now_ms + cycles / 2e6)))
        monkeypatch.setattr(timer_mod, "ClockSampler", Sampler)
        monkeypatch.setattr(timer_mod, "get_flusher", lambda device: Flusher())
        timer_mod._StreamHold._cycles_per_ms.clear()

    def kernel(self, ms):
        def fn():
            if self.capturing is not None:
                self.capturing.captured.append(fn)
                return
            self.log.append("fn")
            self.now_ms += ms
        return fn


GPU0 = torch.device("cuda", 0)


def test_cuda_path_flush_outside_timed_region(monkeypatch):
    gpu = FakeGPU(monkeypatch)
    fn = gpu.kernel(0.5)
    pol = policy(warmup_ms=0.0, min_samples=10, max_samples=40)
    m = measure(fn, device=GPU0, policy=pol, cold_l2=True, label="k")
    assert m.timer == "cuda_event" and m.cold_l2 is True
    assert m.stopped_by == "noise" and len(m.samples_ms) >= 10
    assert m.samples_ms == pytest.approx([0.5] * len(m.samples_ms))  # flush time excluded
    assert m.sm_clock_mhz == [1900.0] * len(m.samples_ms) and not any(m.throttled)
    assert m.host_ms_per_call is not None and m.host_ms_per_call > 0
    # after warm-up, every batch: hold, then (flush, start, fn, end) per sample, one sync
    log = gpu.log
    assert log[:3] == ["flush", "fn", "sync"]  # warm-up: flushed too, synced per call
    start = next(i for i in range(len(log) - 1) if log[i] == "hold" and log[i + 1] == "flush")
    sampling = log[start:]
    sizes = []
    while sampling:
        batch = sampling[: sampling.index("sync") + 1]
        sampling = sampling[len(batch):]
        k = (len(batch) - 2) // 4
        assert k >= 1 and batch == ["hold"] + ["flush", "record", "fn", "record"] * k + ["sync"]
        sizes.append(k)
    assert sum(sizes) == len(m.samples_ms)
    hot = measure(fn, device=GPU0, policy=pol, cold_l2=False)
    assert hot.cold_l2 is False and "flush" not in gpu.log[-20:]


def test_cuda_path_flags_throttled_samples(monkeypatch):
    gpu = FakeGPU(monkeypatch, mhz=1000.0, max_mhz=2000.0)
    pol = policy(warmup_ms=0.0, max_samples=30, throttle_threshold=0.75)
    m = measure(gpu.kernel(0.25), device=GPU0, policy=pol)
    assert all(m.throttled) and m.stopped_by == "max_samples" and len(m.samples_ms) == 30
    assert m.stats()["throttled_samples"] == 30


def test_cuda_graph_path(monkeypatch):
    gpu = FakeGPU(monkeypatch)
    m = measure_graph(gpu.kernel(0.5), device=GPU0, policy=policy(max_samples=20), replays_per_sample=4)
    assert m.replays_per_sample == 4 and m.timer == "cuda_event"
    assert m.samples_ms == pytest.approx([0.5] * len(m.samples_ms))  # per replay, not per 4
    assert gpu.log.count("replay") == 4 * len(m.samples_ms) + m.warmup_calls

    def bad():
        if gpu.capturing is not None:
            raise RuntimeError("operation not permitted when stream is capturing")

    with pytest.raises(GraphCaptureError, match="not permitted"):
        measure_graph(bad, device=GPU0, policy=policy())


# ------------------------------------------------------ host-blocking calls
class _FakeEvent:
    """A CUDA event whose timestamp is the host clock when it is recorded."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.t = None

    def record(self, stream=None) -> None:
        self.t = time.perf_counter_ns()

    def elapsed_time(self, other: "_FakeEvent") -> float:
        return (other.t - self.t) / 1e6


class _NoClock:
    def read(self):
        return None

    def is_throttled(self, mhz, threshold):
        return False


def test_host_sync_timer_median_is_the_call_cost_and_does_not_grow(monkeypatch):
    """A fake host-blocking call of known cost (3 ms of host work), timed by the
    host-sync timer with the CUDA calls faked: the median is that cost, every
    sample is one synchronized call, and nothing grows from batch to batch."""
    syncs = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(1))
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: object())
    monkeypatch.setattr(timer_mod, "ClockSampler", lambda device: _NoClock())
    cost_s = 0.003
    own_ms = []  # each call's own wall time (more than 3 ms when the CI machine is loaded)

    def blocking_call() -> None:
        t0 = time.perf_counter()
        end = t0 + cost_s
        while time.perf_counter() < end:
            pass
        own_ms.append((time.perf_counter() - t0) * 1e3)

    policy = TimingPolicy(warmup_ms=1.0, min_samples=40, max_samples=60, min_time_s=0.0,
                          max_time_s=10.0, max_noise=0.0, cold_l2=False)
    m = timer_mod._measure_cuda_sync(blocking_call, torch.device("cuda", 0), policy, cold_l2=False,
                                     label="fake", clock=time.monotonic)
    assert m.timer == "host_sync" and m.stopped_by == "max_samples" and len(m.samples_ms) == 60
    # each sample is its call's own time plus the timer's few microseconds -- no waiting, and
    # nothing that grows from batch to batch (the spin-hold timer grew 1.5x a batch)
    extra = [s - o for s, o in zip(m.samples_ms, own_ms[-60:])]
    assert min(own_ms) >= 3.0 and all(e >= 0 for e in extra)
    assert statistics.median(extra) < 0.3, extra
    assert statistics.median(extra[-15:]) < 0.3 and statistics.median(extra[:15]) < 0.3
    assert len(m.event_samples_ms) == 60 and statistics.median(m.event_samples_ms) >= 3.0
    assert len(syncs) >= 2 * 60  # a sync before and after every sampled call


def test_measure_graph_rotates_one_graph_per_callable(monkeypatch):
    """Graph replays rotate through one captured graph per callable (one per id set), as the
    eager measurement rotates through the id sets; CUDA faked."""
    replays = []

    class FakeGraph:
        def __init__(self, k):
            self.k = k

        def replay(self):
            replays.append(self.k)

    captured = []

    def fake_capture(fn, device, label="graph"):
        captured.append(fn)
        return FakeGraph(len(captured) - 1)

    def fake_measure(launch, device, policy, *, cold_l2, label, clock, divisor=1, warmup_call=None):
        for _ in range(7):
            launch()
        return Measurement([1.0], "cuda_event", [None], [False], "max_samples", 1, label=label, cold_l2=cold_l2)

    monkeypatch.setattr(timer_mod, "capture_graph", fake_capture)
    monkeypatch.setattr(timer_mod, "_measure_cuda", fake_measure)
    monkeypatch.setattr(timer_mod, "resolve_device", lambda d: torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: type("S", (), {"synchronize": lambda self: None})())
    fns = [lambda: None, lambda: None, lambda: None]
    m = timer_mod.measure_graph(fns, device="cuda", policy=TimingPolicy(), cold_l2=True)
    assert len(captured) == 3 and replays == [0, 1, 2, 0, 1, 2, 0] and m.cold_l2


def test_annotate_pushes_and_pops_one_range_per_block(monkeypatch):
    """annotate() reuses one range object per (name, colour) and pushes / pops it
    on the ple_bench domain, nested blocks included."""
    from ple_bench import annotate as ann

    if not ann.available():
        pytest.skip("nvtx is not installed")
    events = []

    class FakeDomain:
        def get_event_attributes(self, name, color):
            return (name, color)

        def push_range(self, attr):
            events.append(("push", attr[0]))

        def pop_range(self):
            events.append(("pop",))

    monkeypatch.setattr(ann, "_the_domain", FakeDomain())
    monkeypatch.setattr(ann, "_ranges", {})
    with ann.annotate("outer", color="red"):
        with ann.annotate("inner"):
            pass
        with ann.annotate("inner"):
            pass
    assert events == [("push", "outer"), ("push", "inner"), ("pop",), ("push", "inner"), ("pop",), ("pop",)]
    assert ann.annotate("inner") is ann.annotate("inner")
    ann.set_enabled(False)
    try:
        with ann.annotate("off"):
            pass
        assert ("push", "off") not in events
    finally:
        ann.set_enabled(True)


# ------------------------------------------------------------ unstable series

def test_halves_disagree_sees_a_shift_and_not_noise():
    from ple_bench.measure.stats import halves_disagree

    rng = np.random.default_rng(3)
    steady = list(0.25 * rng.lognormal(0, 0.03, 200))
    assert not halves_disagree(steady)
    # the advise self-run's resident step: 0.129 ms for a while, then about 0.29 ms
    shifted = list(0.129 * rng.lognormal(0, 0.03, 50)) + list(0.29 * rng.lognormal(0, 0.03, 150))
    assert halves_disagree(shifted)
    # a few outliers in one half are no drift
    spiky = list(steady)
    spiky[3] = spiky[7] = 5.0
    assert not halves_disagree(spiky)


class _FakeClock:
    """The measurement's clock (``ple_bench.measure.timer.time``), advanced only by the function it
    times: a series whose every sample is what the function says, whatever else the machine runs (a
    busy wait on the real clock was pre-empted often enough on a loaded 2-core CI machine, the tests
    on both cores, for the steady half to differ too)."""

    def __init__(self) -> None:
        self.ns = 0

    def perf_counter_ns(self) -> int:
        return self.ns

    def perf_counter(self) -> float:
        return self.ns / 1e9


def _drifting(slow_calls: int, clock: _FakeClock):
    """A function that takes 10 ms of ``clock`` for its first ``slow_calls`` calls, then 2 ms, each
    with a few microseconds of deterministic jitter (a steady series is not a constant one)."""
    calls = [0]

    def fn():
        calls[0] += 1
        base_us = 10_000 if calls[0] <= slow_calls else 2_000
        clock.ns += (base_us + (calls[0] * 7) % 5) * 1_000
    return fn


def test_an_unstable_series_is_measured_again_and_flagged_when_not_allowed_to(monkeypatch):
    from ple_bench.measure import measure
    from ple_bench.measure import timer
    from ple_bench.measure.timer import TimingPolicy

    clock = _FakeClock()
    monkeypatch.setattr(timer, "time", clock)
    pol = TimingPolicy(warmup_ms=0.0, min_samples=40, max_samples=40, min_time_s=0.0, max_time_s=30.0,
                       max_noise=0.0, cold_l2=False)
    m = measure(_drifting(21, clock), device="cpu", policy=pol)  # half the first try slow, the second steady
    assert m.remeasured and not m.unstable and m.stats()["median_ms"] < 5.0
    flagged = measure(_drifting(21, clock), device="cpu", policy=replace(pol, remeasure_unstable=False))
    assert flagged.unstable and not flagged.remeasured and flagged.stats()["unstable"] is True
