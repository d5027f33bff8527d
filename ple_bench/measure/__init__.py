"""Measuring a case: timing policy and loop (``timer``), stopping criteria
(``stopping``), summaries (``stats``), SM clock and machine description
(``clocks``), L2 flushing (``l2``), the median of a few repeated timed calls (``repeat``),
physical ceilings (``ceilings``) and the
external profiler's capture window (``profiler``).

Measurement never formats: it returns raw samples in dataclasses; reports
are built from the stored records."""

from .ceilings import host_gather_ceiling, measure_ceilings, random_row_ceiling
from .clocks import ClockSampler, device_info
from .l2 import L2Flusher, get_flusher, l2_flush, l2_size_bytes
from .repeat import Repeats, Stopwatch, repeat_timed
from .profiler import profiler_window, profiler_window_enabled, set_profiler_window
from .stats import relative_noise, summarize
from .stopping import Criterion, RelativeNoise, SampleCount, Stopper, TimeBudget, stopper_for
from .timer import (
    GraphCaptureError,
    Measurement,
    SyncedCall,
    TimingPolicy,
    capture_graph,
    measure,
    measure_graph,
    run_sampling,
    warm_up,
)

__all__ = [
    "ClockSampler", "Criterion", "GraphCaptureError", "L2Flusher", "Measurement", "RelativeNoise",
    "SampleCount", "Stopper", "SyncedCall", "TimeBudget", "TimingPolicy", "capture_graph", "device_info",
    "get_flusher", "l2_flush", "l2_size_bytes", "measure", "measure_ceilings", "host_gather_ceiling", "measure_graph",
    "profiler_window", "profiler_window_enabled", "random_row_ceiling", "relative_noise", "Repeats",
    "repeat_timed", "run_sampling", "Stopwatch",
    "set_profiler_window", "stopper_for", "summarize", "warm_up",
]
