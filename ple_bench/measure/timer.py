"""Timing one callable: the policy, the raw measurement, and the sampling loops
(eager, with cold or warm L2, and CUDA-graph replay).

How a CUDA measurement runs (after nvbench's cold measurement and
``triton.testing.do_bench``):

* warm-up: ``fn()`` (after an L2 flush when cold) and a stream sync, repeated
  until ``warmup_ms`` of wall time have passed -- at least one call;
* sampling, in batches of ``k`` samples followed by one sync: each sample is
  ``[L2 flush] -> start event -> fn() -> end event`` on the current stream; the
  flush is outside the events.  Before a batch is enqueued, a spin kernel
  (``torch.cuda._sleep``) holds the stream a little longer than the host needs
  to enqueue the batch (nvbench's "blocking kernel" idea), so the events time
  GPU work and not the host's launch gaps; ``host_ms_per_call`` records the
  host's enqueue time per sample separately.  The batch size is chosen so that
  a batch lasts about :data:`TARGET_BATCH_S` (1..:data:`MAX_BATCH` samples);
* the SM clock is read once per batch through NVML, while the GPU is running
  the batch, and given to every sample of that batch; samples below
  ``throttle_threshold`` x the maximum SM clock are flagged ``throttled``, are
  not fed to the noise criterion and are dropped by ``stats()`` by default;
* stopping: :func:`ple_bench.measure.stopping.stopper_for` -- relative noise
  of the median <= ``max_noise`` once ``min_samples`` and ``min_time_s`` are in,
  or the ``max_samples`` / ``max_time_s`` caps (times are wall time of the
  sampling phase).

On a CPU device the same loop times ``fn()`` with ``time.perf_counter_ns``
(``timer="host_monotonic"``); there is nothing to flush and no clock to read.

Host-blocking calls (``host_sync=True``; a backend that declares
``blocks_host``, or a step whose ids are refilled on the host): a call that
occupies the host thread would wait out a launch-hiding spin, which then grows
with the host time it measured -- so there is no spin.  Each sample is one
synchronized call timed by the host clock: ``[L2 flush] -> device sync -> t0 ->
start event -> fn() -> end event -> device sync -> t1`` (``timer="host_sync"``,
the sample is ``t1 - t0``; the events' GPU time of the same call is kept
alongside in ``event_samples_ms``).  The stopping rule, the caps and the clock
readings are those of the other timers.

NVTX: the whole measurement is in ``annotate(label)``, warm-up in
``annotate("warmup")``, sampling in ``annotate("measurement")``.  The sampling
phase is also the window of ``run --profile-window`` (cudaProfilerStart/Stop)
and of ``run --torch-trace`` (a torch.profiler session of its first samples;
``measure/profiler.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from ..annotate import annotate
from ..env import resolve_device
from ..results import kept_samples
from .clocks import ClockSampler
from .l2 import get_flusher
from .stats import halves_disagree, relative_noise, summarize
from .profiler import profiler_window, torch_trace_window
from .stopping import Stopper, stopper_for

#: a sampling batch aims to last about this long (GPU time or host time)
TARGET_BATCH_S = 0.01
#: most samples enqueued before one sync
MAX_BATCH = 64
#: longest hold of the stream before a batch
MAX_HOLD_MS = 200.0


class GraphCaptureError(RuntimeError):
    """``fn`` could not be captured in a CUDA graph (or there is no CUDA)."""


# --------------------------------------------------------------------- policy
_FLOAT_FIELDS = ("warmup_ms", "min_time_s", "max_time_s", "max_noise", "throttle_threshold")
_INT_FIELDS = ("min_samples", "max_samples", "id_sets")
_BOOL_FIELDS = ("cold_l2", "hot", "graph")


@dataclass
class TimingPolicy:
    """How long and how often to sample; one per suite (``[suite.timing]``)."""

    warmup_ms: float = 25.0
    min_samples: int = 10
    max_samples: int = 500
    min_time_s: float = 0.1
    max_time_s: float = 3.0
    max_noise: float = 0.01
    cold_l2: bool = True
    hot: bool = True
    graph: bool = True
    throttle_threshold: float = 0.75
    # Lookups rotate through this many independent id sets, one per call: repeating
    # one set keeps its rows' address translations warm even with the L2 flushed.
    id_sets: int = 8
    # A series whose halves disagree is measured once more (off where ranks must take the same
    # samples: a second try on one rank alone would leave the others waiting in a collective).
    remeasure_unstable: bool = True

    def __post_init__(self) -> None:
        self._check_types(dataclasses.asdict(self))
        problems = []
        if self.warmup_ms < 0:
            problems.append("warmup_ms must be >= 0")
        if self.min_samples < 1:
            problems.append("min_samples must be >= 1")
        if self.max_samples < self.min_samples:
            problems.append("max_samples must be >= min_samples")
        if self.min_time_s < 0:
            problems.append("min_time_s must be >= 0")
        if self.max_time_s <= 0:
            problems.append("max_time_s must be > 0")
        if self.min_time_s > self.max_time_s:
            problems.append("min_time_s must be <= max_time_s")
        if not self.max_noise >= 0:
            problems.append("max_noise must be >= 0")
        if not 0 <= self.throttle_threshold <= 1:
            problems.append("throttle_threshold must be in [0, 1]")
        if self.id_sets < 1:
            problems.append("id_sets must be >= 1")
        if problems:
            raise ValueError("bad timing policy: " + "; ".join(problems))

    @staticmethod
    def _check_types(d: dict) -> None:
        bad = []
        for key, value in d.items():
            if key in _FLOAT_FIELDS:
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                want = "a finite number"
            elif key in _INT_FIELDS:
                ok = isinstance(value, int) and not isinstance(value, bool)
                want = "an integer"
            else:
                ok = isinstance(value, bool)
                want = "true or false"
            if not ok:
                bad.append(f"{key} must be {want}, got {value!r}")
        if bad:
            raise ValueError("bad timing policy: " + "; ".join(bad))

    @classmethod
    def from_dict(cls, d: dict) -> "TimingPolicy":
        if not isinstance(d, dict):
            raise ValueError(f"a timing policy is a table of keys, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown timing key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        cls._check_types(d)
        values = {k: (float(v) if k in _FLOAT_FIELDS else v) for k, v in d.items()}
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def scaled_for_cpu(self) -> "TimingPolicy":
        """Functional CPU mode: a handful of samples, tiny budgets; no L2 flush
        and no graphs (neither exists on a CPU), one warm measurement."""
        max_samples = min(self.max_samples, 5)
        return dataclasses.replace(
            self,
            warmup_ms=min(self.warmup_ms, 1.0),
            min_samples=min(self.min_samples, 3, max_samples),
            max_samples=max_samples,
            min_time_s=0.0,
            max_time_s=min(self.max_time_s, 0.25),
            cold_l2=False,
            hot=True,
            graph=False,
        )


# ---------------------------------------------------------------- measurement
@dataclass
class Measurement:
    """Raw samples of one measurement (stored as they are; summaries derive)."""

    samples_ms: list[float]
    timer: str
    sm_clock_mhz: list[float | None]
    throttled: list[bool]
    stopped_by: str
    warmup_calls: int
    label: str = ""
    cold_l2: bool = False  # True only when the L2 was really flushed before each sample
    host_ms_per_call: float | None = None  # host enqueue time per sample (CUDA), None on CPU
    replays_per_sample: int = 1  # graph replays timed per sample (sample = their mean)
    event_samples_ms: list[float] | None = None  # host_sync: the CUDA-event time of each sample's call
    remeasured: bool = False  # the first try's halves disagreed (stats.halves_disagree): this is the second
    unstable: bool = False  # ... and so did this one's

    def stats(self, drop_throttled: bool = True) -> dict[str, Any]:
        """median_ms, mean_ms, min_ms, max_ms, p10_ms, p90_ms, q1_ms, q3_ms,
        iqr_ms, cv, noise (relative CI half-width of the median, None when too
        few samples), n_samples (those summarised), throttled_samples,
        dropped_samples, sm_clock_mhz (median reading, None if none).

        With ``drop_throttled`` throttled samples are left out -- unless all
        are throttled, then all are kept (``dropped_samples`` is 0 and
        ``throttled_samples == n_samples`` says so)."""
        keep = kept_samples(self.samples_ms, self.throttled) if drop_throttled else self.samples_ms
        st = summarize(keep)
        noise = relative_noise(keep)
        clocks = sorted(c for c in self.sm_clock_mhz if c is not None)
        return {
            "median_ms": st["median"], "mean_ms": st["mean"], "min_ms": st["min"], "max_ms": st["max"],
            "p10_ms": st["p10"], "p90_ms": st["p90"], "q1_ms": st["q1"], "q3_ms": st["q3"],
            "iqr_ms": st["iqr"], "cv": st["cv"],
            "noise": noise if math.isfinite(noise) else None,
            "n_samples": st["n"],
            "throttled_samples": int(sum(self.throttled)),
            "dropped_samples": len(self.samples_ms) - len(keep),
            "sm_clock_mhz": clocks[len(clocks) // 2] if clocks else None,
            "unstable": self.unstable,
        }

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# -------------------------------------------------------------- sampling loop
@dataclass
class SamplingResult:
    samples_ms: list[float] = field(default_factory=list)
    sm_clock_mhz: list[float | None] = field(default_factory=list)
    throttled: list[bool] = field(default_factory=list)
    stopped_by: str = ""


def run_sampling(
    take_batch: Callable[[int], tuple[list[float], float | None]],
    stopper: Stopper,
    *,
    max_samples: int,
    batch_size: Callable[[list[float]], int] | int = 1,
    is_throttled: Callable[[float | None], bool] = lambda mhz: False,
) -> SamplingResult:
    """The device-independent loop: ask ``take_batch(k)`` for ``k`` samples and
    one clock reading, feed them to ``stopper``, until it gives a reason.

    ``k`` is ``batch_size(samples so far)`` (or the constant), capped so the
    total never passes ``max_samples``; at least one sample is always taken.
    Fake batch functions and fake clocks in the stopper make it testable."""
    out = SamplingResult()
    stopper.start()
    while True:
        want = batch_size(out.samples_ms) if callable(batch_size) else batch_size
        k = max(1, min(int(want), max_samples - len(out.samples_ms)))
        batch, mhz = take_batch(k)
        if len(batch) != k:
            raise RuntimeError(f"take_batch({k}) returned {len(batch)} samples")
        flag = bool(is_throttled(mhz))
        for sample in batch:
            out.samples_ms.append(float(sample))
            out.sm_clock_mhz.append(mhz)
            out.throttled.append(flag)
            stopper.update(float(sample), throttled=flag)
        reason = stopper.done()
        if reason is None and len(out.samples_ms) >= max_samples:
            reason = "max_samples"
        if reason is not None:
            out.stopped_by = reason
            return out


def _adaptive_batch(per_sample_s: Callable[[], float]) -> Callable[[list[float]], int]:
    def size(_samples: list[float]) -> int:
        cost = per_sample_s()
        if not cost > 0:
            return 1
        return max(1, min(MAX_BATCH, int(TARGET_BATCH_S / cost)))
    return size


# ------------------------------------------------------------------- devices


class _StreamHold:
    """Holds a stream with ``torch.cuda._sleep`` (a clock64 spin of one thread)
    for a requested number of milliseconds, calibrated once per device."""

    _cycles_per_ms: dict[int, float] = {}

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.enabled = hasattr(torch.cuda, "_sleep")
        if self.enabled and device.index not in self._cycles_per_ms:
            try:
                self._cycles_per_ms[device.index] = self._calibrate()
            except Exception:
                self.enabled = False

    def _calibrate(self) -> float:
        cycles = 2_000_000
        stream = torch.cuda.current_stream(self.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ms = []
        for _ in range(3):
            start.record(stream)
            torch.cuda._sleep(cycles)
            end.record(stream)
            end.synchronize()
            ms.append(start.elapsed_time(end))
        # the fastest run gives the most cycles per ms -> holds err on the long side
        return cycles / max(min(ms), 1e-3)

    def hold(self, ms: float) -> None:
        if self.enabled and ms > 0:
            ms = min(ms, MAX_HOLD_MS)
            torch.cuda._sleep(int(ms * self._cycles_per_ms[self.device.index]))


class _CudaBatcher:
    """``take_batch`` for CUDA: hold, then ``k`` x ([flush] start fn end), read
    the SM clock while the GPU works, sync, read the events."""

    def __init__(self, device, launch: Callable[[], None], *, flusher, clocks: ClockSampler,
                 divisor: int = 1, host_per_call_s: float = 0.0) -> None:
        self.device = device
        self.stream = torch.cuda.current_stream(device)
        self.launch = launch
        self.flusher = flusher
        self.clocks = clocks
        self.divisor = divisor
        self.hold = _StreamHold(device)
        self.pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(MAX_BATCH)]
        self.host_per_call_s = host_per_call_s
        self.host_total_s = 0.0
        self.host_calls = 0
        self.gpu_per_sample_s = 0.0

    def per_sample_s(self) -> float:
        return max(self.host_per_call_s, self.gpu_per_sample_s)

    def __call__(self, k: int) -> tuple[list[float], float | None]:
        self.hold.hold(1.5 * 1e3 * self.host_per_call_s * k + 0.05)
        t0 = time.perf_counter()
        for start, end in self.pairs[:k]:
            if self.flusher is not None:
                self.flusher.flush()
            start.record(self.stream)
            self.launch()
            end.record(self.stream)
        enqueue_s = time.perf_counter() - t0
        self.host_total_s += enqueue_s
        self.host_calls += k
        self.host_per_call_s = enqueue_s / k
        mhz = self.clocks.read()  # the GPU is busy with this batch now
        self.pairs[k - 1][1].synchronize()
        samples = [start.elapsed_time(end) / self.divisor for start, end in self.pairs[:k]]
        self.gpu_per_sample_s = sum(samples) * self.divisor / k / 1e3
        return samples, mhz


class _SyncScope:
    """What a ``host_sync`` sample waits for: the whole device (the default), or the measured
    call's own stream only (:func:`stream_scoped_sync`), while a load on streams of its own runs
    beside the measurement (:mod:`ple_bench.measure.background`) -- a device-wide sync would wait
    for that load's copy in flight and time it.  A step's side streams join its main stream
    before the step's end event, so the stream's end is the call's end."""

    device_wide = True


SYNC_SCOPE = _SyncScope()


@contextlib.contextmanager
def stream_scoped_sync():
    """``host_sync`` samples inside the block wait on their own stream, not the device."""
    before = SYNC_SCOPE.device_wide
    SYNC_SCOPE.device_wide = False
    try:
        yield
    finally:
        SYNC_SCOPE.device_wide = before


def wait_for_work(device) -> None:
    """Wait until the work queued so far is done: the whole device, or inside
    :func:`stream_scoped_sync` the current stream only (what a measured call queued)."""
    if SYNC_SCOPE.device_wide:
        torch.cuda.synchronize(device)
    else:
        torch.cuda.current_stream(device).synchronize()


class SyncedCall:
    """One sample of the ``host_sync`` timer, the one definition of what it times:
    ``[L2 flush] -> device sync -> t0 -> start event -> launch() -> end event -> device sync -> t1``.

    :meth:`prepare` is what comes before the clock (the flush, when there is a flusher, and
    the sync that keeps an earlier call's GPU work out of the sample), :meth:`run` what the
    clock times; :meth:`sample` does both and returns the host time of :meth:`run` in ms,
    the events' GPU time of the same call in :attr:`last_event_ms`.  ``pytest suites/`` hands
    ``run`` to pytest-benchmark as its target and ``prepare`` as its untimed setup, so its
    host clock times exactly the engine's sample (suites/test_suite_cases.py)."""

    def __init__(self, device, launch: Callable[[], Any], *, flusher=None) -> None:
        self.device = device
        self.stream = torch.cuda.current_stream(device)
        self.launch = launch
        self.flusher = flusher
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def prepare(self) -> None:
        if self.flusher is not None:
            self.flusher.flush()
        wait_for_work(self.device)

    def run(self) -> None:
        self.start.record(self.stream)
        self.launch()
        self.end.record(self.stream)
        if SYNC_SCOPE.device_wide:
            torch.cuda.synchronize(self.device)
        else:
            self.end.synchronize()

    def sample(self) -> float:
        self.prepare()
        t0 = time.perf_counter_ns()
        self.run()
        return (time.perf_counter_ns() - t0) / 1e6

    @property
    def last_event_ms(self) -> float:
        return self.start.elapsed_time(self.end)


class _SyncBatcher:
    """``take_batch`` for host-blocking calls: each sample one synchronized call
    (:class:`SyncedCall`), timed by the host clock, CUDA events alongside (no stream hold)."""

    def __init__(self, device, launch: Callable[[], None], *, flusher, clocks: ClockSampler) -> None:
        self.device = device
        self.call = SyncedCall(device, launch, flusher=flusher)
        self.clocks = clocks
        self.event_samples_ms: list[float] = []
        self.per_sample_s = 0.0

    def __call__(self, k: int) -> tuple[list[float], float | None]:
        samples = []
        mhz = None
        for i in range(k):
            samples.append(self.call.sample())
            if i == 0:  # after the sample's clock: an NVML read costs host time the call did not spend
                mhz = self.clocks.read()  # the GPU was busy with this call a moment ago
            self.event_samples_ms.append(self.call.last_event_ms)
        self.per_sample_s = sum(samples) / k / 1e3
        return samples, mhz


def warm_up(call: Callable[[], None], sync: Callable[[], None], warmup_ms: float) -> tuple[int, float]:
    """The warm-up of every measurement: call (then ``sync``) until ``warmup_ms`` of wall time
    have passed, at least once; returns (calls, wall seconds per call).  ``pytest suites/``
    warms its rounds up with it too (ple_bench/run/bench.py)."""
    calls = 0
    t0 = time.perf_counter()
    with annotate("warmup", color="grey"):
        while True:
            call()
            sync()
            calls += 1
            elapsed = time.perf_counter() - t0
            if elapsed * 1e3 >= warmup_ms:
                return calls, elapsed / calls


def _measure_cpu(fn, policy: TimingPolicy, label: str, clock) -> Measurement:
    calls, per_call_s = warm_up(fn, lambda: None, policy.warmup_ms)
    estimate = {"s": per_call_s}

    def take_batch(k: int) -> tuple[list[float], None]:
        samples = []
        for _ in range(k):
            t0 = time.perf_counter_ns()
            fn()
            samples.append((time.perf_counter_ns() - t0) / 1e6)
        estimate["s"] = sum(samples) / k / 1e3
        return samples, None

    with annotate("measurement", color="green"), torch_trace_window(label) as traced:
        res = run_sampling(traced(take_batch), stopper_for(policy, clock), max_samples=policy.max_samples,
                           batch_size=_adaptive_batch(lambda: estimate["s"]))
    return Measurement(res.samples_ms, "host_monotonic", res.sm_clock_mhz, res.throttled,
                       res.stopped_by, calls, label=label, cold_l2=False)


def _measure_cuda_sync(launch, device, policy: TimingPolicy, *, cold_l2: bool, label: str,
                       clock) -> Measurement:
    flusher = get_flusher(device) if cold_l2 else None
    clocks = ClockSampler(device)

    def warm_call() -> None:
        if flusher is not None:
            flusher.flush()
        launch()

    calls, _ = warm_up(warm_call, lambda: torch.cuda.synchronize(device), policy.warmup_ms)
    batcher = _SyncBatcher(device, launch, flusher=flusher, clocks=clocks)
    with annotate("measurement", color="green"), profiler_window(), torch_trace_window(label) as traced:
        res = run_sampling(
            traced(batcher), stopper_for(policy, clock), max_samples=policy.max_samples,
            batch_size=_adaptive_batch(lambda: batcher.per_sample_s),
            is_throttled=lambda mhz: clocks.is_throttled(mhz, policy.throttle_threshold),
        )
    return Measurement(res.samples_ms, "host_sync", res.sm_clock_mhz, res.throttled, res.stopped_by,
                       calls, label=label, cold_l2=flusher is not None,
                       event_samples_ms=list(batcher.event_samples_ms))


def _measure_cuda(launch, device, policy: TimingPolicy, *, cold_l2: bool, label: str, clock,
                  divisor: int = 1, warmup_call=None) -> Measurement:
    stream = torch.cuda.current_stream(device)
    flusher = get_flusher(device) if cold_l2 else None
    clocks = ClockSampler(device)

    def warm_call() -> None:
        if flusher is not None:
            flusher.flush()
        (warmup_call or launch)()

    calls, per_call_s = warm_up(warm_call, stream.synchronize, policy.warmup_ms)
    # the warm-up's wall time per call includes the GPU time and a sync: an
    # upper bound of the host's enqueue time, capped so the first hold is short
    batcher = _CudaBatcher(device, launch, flusher=flusher, clocks=clocks, divisor=divisor,
                           host_per_call_s=min(per_call_s, 0.002))
    with annotate("measurement", color="green"), profiler_window(), torch_trace_window(label) as traced:
        res = run_sampling(
            traced(batcher), stopper_for(policy, clock), max_samples=policy.max_samples,
            batch_size=_adaptive_batch(batcher.per_sample_s),
            is_throttled=lambda mhz: clocks.is_throttled(mhz, policy.throttle_threshold),
        )
    host_ms = 1e3 * batcher.host_total_s / batcher.host_calls / divisor if batcher.host_calls else None
    return Measurement(res.samples_ms, "cuda_event", res.sm_clock_mhz, res.throttled, res.stopped_by,
                       calls, label=label, cold_l2=flusher is not None, host_ms_per_call=host_ms,
                       replays_per_sample=divisor)


# ------------------------------------------------------------------- public
def measure(fn: Callable[[], Any], *, device, policy: TimingPolicy, cold_l2: bool = False,
            label: str = "measure", clock: Callable[[], float] = time.monotonic,
            host_sync: bool = False) -> Measurement:
    """Time ``fn()`` (no arguments; complete on the current stream when it
    returns) on ``device`` under ``policy``; ``cold_l2`` flushes the L2 before
    every sample (CUDA only; ignored on CPU, where ``Measurement.cold_l2`` is
    False).  ``host_sync``: ``fn`` occupies the host -- time synchronized calls
    on the host clock, no spin hold (CUDA; on a CPU every call is host-timed
    anyway).  ``clock`` is the stopping rule's wall clock (injectable for tests).

    A series whose halves disagree beyond its noise (:func:`stats.halves_disagree`) is
    measured once more (``remeasured``) when ``policy.remeasure_unstable``; if the second
    series disagrees too it is kept and flagged ``unstable``."""
    device = resolve_device(device)
    m = _measure_once(fn, device, policy, cold_l2, label, clock, host_sync)
    if not halves_disagree(kept_samples(m.samples_ms, m.throttled)):
        return m
    if not policy.remeasure_unstable:
        return dataclasses.replace(m, unstable=True)
    again = _measure_once(fn, device, policy, cold_l2, label, clock, host_sync)
    return dataclasses.replace(again, remeasured=True,
                               unstable=halves_disagree(kept_samples(again.samples_ms, again.throttled)))


def _measure_once(fn, device, policy, cold_l2, label, clock, host_sync) -> Measurement:
    with annotate(label):
        if device.type != "cuda":
            return _measure_cpu(fn, policy, label, clock)
        with torch.cuda.device(device):
            if host_sync:
                return _measure_cuda_sync(fn, device, policy, cold_l2=cold_l2, label=label, clock=clock)
            return _measure_cuda(fn, device, policy, cold_l2=cold_l2, label=label, clock=clock)


def capture_graph(fn: Callable[[], Any], device: torch.device, *, warmup_calls: int = 3,
                  label: str = "graph") -> "torch.cuda.CUDAGraph":
    """Warm ``fn`` up on a side stream, then capture one call of it in a
    CUDA graph; :class:`GraphCaptureError` (with the reason) if that fails."""
    device = resolve_device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        raise GraphCaptureError(f"CUDA graphs need a CUDA device; {label!r} runs on {device}")
    with torch.cuda.device(device):
        current = torch.cuda.current_stream(device)
        side = torch.cuda.Stream(device)
        graph = torch.cuda.CUDAGraph()
        try:
            side.wait_stream(current)
            with torch.cuda.stream(side):
                for _ in range(max(1, warmup_calls)):
                    fn()
            current.wait_stream(side)
            side.synchronize()
            with torch.cuda.graph(graph, stream=side):
                fn()
            current.wait_stream(side)
        except Exception as exc:
            raise GraphCaptureError(
                f"capturing {label!r} in a CUDA graph failed: {type(exc).__name__}: {exc}"
            ) from exc
        return graph


def measure_graph(fn: Callable[[], Any] | Sequence[Callable[[], Any]], *, device, policy: TimingPolicy,
                  replays_per_sample: int = 1, label: str = "graph", cold_l2: bool = False,
                  clock: Callable[[], float] = time.monotonic) -> Measurement:
    """Capture ``fn`` in a CUDA graph and time its replays: each sample is the
    mean of ``replays_per_sample`` back-to-back replays between one event
    pair.  ``fn`` may be a list of callables (e.g. one per id set): each is
    captured in a graph of its own and the replays rotate through them, one
    graph per replay, as an eager measurement rotates through its id sets.
    ``cold_l2`` flushes before each sample (outside the graph, so it is cold
    only for the first replay of a sample).  Raises :class:`GraphCaptureError`
    when capture fails or there is no CUDA."""
    if replays_per_sample < 1:
        raise ValueError("replays_per_sample must be >= 1")
    fns = list(fn) if isinstance(fn, (list, tuple)) else [fn]
    if not fns:
        raise ValueError("measure_graph needs at least one callable")
    device = resolve_device(device)
    with annotate(label):
        graphs = [capture_graph(f, device, label=label) for f in fns]
        with torch.cuda.device(device):
            turn = [0]

            def replay_next() -> None:
                graphs[turn[0] % len(graphs)].replay()
                turn[0] += 1

            def launch() -> None:
                for _ in range(replays_per_sample):
                    replay_next()

            try:
                return _measure_cuda(launch, device, policy, cold_l2=cold_l2, label=label, clock=clock,
                                     divisor=replays_per_sample, warmup_call=replay_next)
            finally:
                torch.cuda.current_stream(device).synchronize()
                del graphs
