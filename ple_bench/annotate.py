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

from torch.profiler import record_function

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


class _Range:
    """One NVTX range of the ple_bench domain, its event attributes built once:
    entering it is one push (about 0.1 us), not an attribute lookup per call."""

    __slots__ = ("name", "color", "_attr")

    def __init__(self, name: str, color: str) -> None:
        self.name, self.color = name, color
        self._attr = None

    def __enter__(self) -> None:
        if self._attr is None:
            self._attr = _domain().get_event_attributes(self.name, color=self.color)
        _domain().push_range(self._attr)

    def __exit__(self, *exc) -> None:
        _domain().pop_range()


_ranges: dict[tuple[str, str], _Range] = {}
_the_domain = None


def _domain():
    global _the_domain
    if _the_domain is None:
        _the_domain = _nvtx.get_domain(DOMAIN)
    return _the_domain


def annotate(name: str, color: str = "blue"):
    """``with annotate("lookup"): ...`` -> an NVTX push/pop range in domain ple_bench
    (and a torch.profiler range while a torch trace records)."""
    if _torch_ranges:
        return _torch_and_nvtx(name, color)
    if _nvtx is None or not _enabled:
        return contextlib.nullcontext()
    rng = _ranges.get((name, color))
    if rng is None:
        rng = _ranges[(name, color)] = _Range(name, color)
    return rng


@contextlib.contextmanager
def _torch_and_nvtx(name: str, color: str) -> Iterator[None]:
    with record_function(name), _nvtx_range(name, color):
        yield


def _nvtx_range(name: str, color: str):
    if _nvtx is None or not _enabled:
        return contextlib.nullcontext()
    return _nvtx.annotate(name, color=color, domain=DOMAIN)
