"""What several GPU test files share: CUDA-event timing of a call, a backend class that
reads one shared table, and the expected bytes of a sharded lookup."""

from __future__ import annotations

import statistics

import torch

from ple_bench.backends.formats import int_view
from ple_bench.backends.synthetic import synthetic_rows


def event_ms(fn, iters: int = 20, *, stream: torch.cuda.Stream | None = None, warmup: int = 1) -> float:
    """Median CUDA-event time of ``fn()`` on ``stream`` (default: the current stream) over
    ``iters`` calls, after ``warmup`` untimed ones."""
    stream = stream if stream is not None else torch.cuda.current_stream()
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            a.record(stream)
            fn()
            z.record(stream)
        z.synchronize()
        times.append(a.elapsed_time(z))
    return statistics.median(times)


def sharing(cls: type, weight: torch.Tensor) -> type:
    """``cls`` whose table is ``weight`` (one pinned table shared by several paths)."""
    return type(f"Shared{cls.__name__}", (cls,), {"allocate_table": lambda self, r, d, dt: weight})


def expected(ids: torch.Tensor, dim: int, dtype: torch.dtype, start: int, end: int, seed: int) -> torch.Tensor:
    """The integer view of ``synthetic_rows`` for the ids this shard ``[start, end)`` owns, zeros elsewhere."""
    flat = ids.reshape(-1)
    rows = int_view(synthetic_rows(flat, dim, seed, dtype))
    owned = (flat >= start) & (flat < end)
    return torch.where(owned.unsqueeze(1), rows, torch.zeros_like(rows))


def same(rows: torch.Tensor, want: torch.Tensor) -> bool:
    return torch.equal(int_view(rows).reshape(want.shape), want)
