"""NVTX ranges in the ``ple_bench`` domain, through the ``nvtx`` package.

Ranges cost nothing measurable when no profiler is attached; where the package
is missing they degrade to no-ops (``available()`` says which).

While a ``torch.profiler`` window records (``run --torch-trace``, the
``profile --tool torch`` verb), :func:`set_torch_ranges` makes every range a
``torch.profiler.record_function`` range as well, so the Kineto trace names the
same phases; otherwise that costs one flag check."""

from __future__ import annotations

import contextlib
from typing import Iterator

try:  # pragma: no cover - depends on the environment
    import nvtx as _nvtx
except ImportError:  # pragma: no cover
    _nvtx = None

DOMAIN = "ple_bench"
_enabled = True
_torch_ranges = False  # set only while a torch.profiler window records (measure/profiler.py)


def available() -> bool:
    return _nvtx is not None


def set_enabled(flag: bool) -> None:
    global _enabled
    _enabled = flag


def set_torch_ranges(flag: bool) -> None:
    """Also emit ``torch.profiler.record_function`` ranges (while a torch trace records)."""
    global _torch_ranges
    _torch_ranges = bool(flag)


def torch_ranges_enabled() -> bool:
    return _torch_ranges


@contextlib.contextmanager
def annotate(name: str, color: str = "blue") -> Iterator[None]:
    """``with annotate("lookup"): ...`` -> an NVTX push/pop range in domain ple_bench
    (and a torch.profiler range while a torch trace records)."""
    if _torch_ranges:
        from torch.profiler import record_function

        with record_function(name), _nvtx_range(name, color):
            yield
        return
    if _nvtx is None or not _enabled:
        yield
        return
    with _nvtx.annotate(name, color=color, domain=DOMAIN):
        yield


def _nvtx_range(name: str, color: str):
    if _nvtx is None or not _enabled:
        return contextlib.nullcontext()
    return _nvtx.annotate(name, color=color, domain=DOMAIN)
