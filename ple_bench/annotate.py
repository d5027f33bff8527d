"""NVTX ranges in the ``ple_bench`` domain, through the ``nvtx`` package.

Ranges cost nothing measurable when no profiler is attached; where the package
is missing they degrade to no-ops (``available()`` says which)."""

from __future__ import annotations

import contextlib
from typing import Iterator

try:  # pragma: no cover - depends on the environment
    import nvtx as _nvtx
except ImportError:  # pragma: no cover
    _nvtx = None

DOMAIN = "ple_bench"
_enabled = True


def available() -> bool:
    return _nvtx is not None


def set_enabled(flag: bool) -> None:
    global _enabled
    _enabled = flag


@contextlib.contextmanager
def annotate(name: str, color: str = "blue") -> Iterator[None]:
    """``with annotate("lookup"): ...`` -> an NVTX push/pop range in domain ple_bench."""
    if _nvtx is None or not _enabled:
        yield
        return
    with _nvtx.annotate(name, color=color, domain=DOMAIN):
        yield
