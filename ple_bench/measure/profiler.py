"""The capture window for external profilers (Nsight Systems ``--capture-range
=cudaProfilerApi``, Nsight Compute ``--profile-from-start off``).

``set_profiler_window(True)`` (the runner does so for the ``profile`` verb) makes
:func:`profiler_window` call ``cudaProfilerStart`` / ``cudaProfilerStop``
(through ``torch.cuda.profiler``) around its body, after draining the GPU so
the window holds exactly the enclosed work.  Otherwise, and always on a
machine without CUDA, it is a no-op.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

_enabled = False


def set_profiler_window(flag: bool) -> None:
    global _enabled
    _enabled = bool(flag)


def profiler_window_enabled() -> bool:
    return _enabled


def _active() -> bool:
    return _enabled and torch.cuda.is_available()


@contextlib.contextmanager
def profiler_window() -> Iterator[bool]:
    """``with profiler_window() as on:`` -- ``on`` says whether the window opened."""
    if not _active():
        yield False
        return
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    try:
        yield True
    finally:
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
