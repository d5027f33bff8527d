"""The short fixed timing loop: the median of repeated timed calls, on CUDA events or
the host clock -- the one loop the ceilings, the all-reduce bus bandwidth and the
decode step's region timing (and compute calibration) use.

A case's own measurement is :func:`ple_bench.measure.timer.measure` (adaptive
stopping, L2 flushing, clock readings, a launch-hiding spin); this is the loop for
a figure that needs a few repeats and no more: a ceiling's copy, a collective, a
region inside a call.

* :class:`Stopwatch` -- start / stop pairs on the current CUDA stream (events,
  read after one device sync) or on the host clock (``time.perf_counter_ns``;
  with ``sync`` the device is synchronized before start and before stop, so a
  host-clock sample covers the GPU work the call queued).
* :func:`repeat_timed` -- ``warmup`` untimed calls, then timed calls: at least
  ``min_repeats``, at most ``max_repeats``, stopping once ``budget_s`` of wall time
  is spent; ``before`` runs before each timed call, outside the timing (a barrier,
  an L2 flush, an input refill).  Each sample is one call, or -- with ``region`` --
  what the call itself recorded on that stopwatch (a region inside the call).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..env import resolve_device




class Stopwatch:
    """Timed intervals: CUDA events on the current stream of ``device`` (``host=False``
    on a CUDA device), else the host clock.  ``start()`` / ``stop()`` any number of
    times; :meth:`samples_ms` reads them all (one device sync for events)."""

    def __init__(self, device, *, host: bool = False, sync: bool = False) -> None:
        self.device = resolve_device(device)
        self.events = self.device.type == "cuda" and not host
        self.sync = sync and self.device.type == "cuda"
        self._pairs: list[list[Any]] = []
        self._host_ms: list[float] = []
        self._t0 = 0

    @property
    def timer(self) -> str:
        if self.events:
            return "cuda_event"
        return "host_sync" if self.sync else "host_monotonic"

    def _sync(self) -> None:
        if self.sync:
            torch.cuda.synchronize(self.device)

    def start(self) -> None:
        if self.events:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.device))
            self._pairs.append([ev, None])
        else:
            self._sync()
            self._t0 = time.perf_counter_ns()

    def stop(self) -> None:
        if self.events:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.device))
            self._pairs[-1][1] = ev
        else:
            self._sync()
            self._host_ms.append((time.perf_counter_ns() - self._t0) / 1e6)

    def __len__(self) -> int:
        return len(self._pairs) if self.events else len(self._host_ms)

    def last_ms(self) -> float:
        """The latest interval (waits for its end event)."""
        if not self.events:
            return self._host_ms[-1]
        start, end = self._pairs[-1]
        end.synchronize()
        return start.elapsed_time(end)

    def samples_ms(self) -> list[float]:
        if not self.events:
            return list(self._host_ms)
        if self._pairs:
            torch.cuda.synchronize(self.device)
        return [a.elapsed_time(b) for a, b in self._pairs]


@dataclass
class Repeats:
    """The samples of :func:`repeat_timed` (ms, in order) and how they were taken."""

    samples_ms: list[float] = field(default_factory=list)
    timer: str = ""

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms) if self.samples_ms else math.nan

    @property
    def median_s(self) -> float:
        return self.median_ms / 1e3


def repeat_timed(fn: Callable[[], Any], *, device, warmup: int = 1, min_repeats: int = 3,
                 max_repeats: int | None = None, budget_s: float | None = None, host: bool = False,
                 sync: bool | None = None, before: Callable[[], Any] | None = None,
                 region: Stopwatch | None = None) -> Repeats:
    """Time repeated calls of ``fn`` (see the module docstring).

    ``host``: the host clock on a CUDA device too (``sync`` defaults to True there:
    the device is synchronized around each timed call).  Without ``host``, CUDA events
    bracket each call on the current stream and every sample is read (synchronized)
    before the next call, so calls do not overlap.  ``max_repeats`` defaults to
    ``min_repeats`` (a fixed count: what a loop that every rank must run the same
    number of times needs); ``budget_s`` lets it stop between the two."""
    device = resolve_device(device)
    if min_repeats < 1:
        raise ValueError("min_repeats must be >= 1")
    max_repeats = min_repeats if max_repeats is None else max(max_repeats, min_repeats)
    cuda = device.type == "cuda"
    if sync is None:
        sync = host and cuda
    watch = region if region is not None else Stopwatch(device, host=host, sync=sync)
    for _ in range(max(0, warmup)):
        if before is not None:
            before()
        fn()
    if cuda:
        torch.cuda.synchronize(device)
    skip = len(watch)  # a caller's stopwatch may hold the warm-up's regions
    t0 = time.perf_counter()
    taken = 0
    while taken < min_repeats or (taken < max_repeats and budget_s is not None
                                  and time.perf_counter() - t0 < budget_s):
        if before is not None:
            before()
        if region is None:
            watch.start()
            fn()
            watch.stop()
            watch.last_ms()  # one call at a time: wait for it before the next
        else:
            fn()
        taken += 1
    samples = watch.samples_ms()[skip:]
    return Repeats(samples_ms=samples, timer=watch.timer)


__all__ = ["Repeats", "Stopwatch", "repeat_timed"]
