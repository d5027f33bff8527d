"""Backends by name, or any external implementation by import path
(``package.module:Class``) so a user can benchmark their own class."""

from __future__ import annotations

import importlib
from typing import Callable

from .base import PLEEmbedding

_BACKENDS: dict[str, type] = {}


def register_backend(name: str) -> Callable[[type], type]:
    def deco(cls: type) -> type:
        if name in _BACKENDS and _BACKENDS[name] is not cls:
            raise ValueError(f"backend name {name!r} is already registered")
        cls.name = name
        _BACKENDS[name] = cls
        return cls

    return deco


def _load_builtin() -> None:
    from . import device, pinned_uva  # noqa: F401  (register themselves)

    try:
        from . import pinned_cpu_gather  # noqa: F401  (optional alternative lookup paths)
    except ImportError:
        pass
    try:
        from . import pinned_copy_engine  # noqa: F401  (row copies by the copy engines)
    except ImportError:
        pass
    try:
        from . import pinned_host_graph  # noqa: F401  (the host gather as graph-capturable host nodes)
    except ImportError:
        pass
    try:
        from . import pinned_host_flag  # noqa: F401  (the host gather posted after the graph's launch; the graph polls a flag)
    except ImportError:
        pass


def backend_names() -> list[str]:
    _load_builtin()
    return sorted(_BACKENDS)


def get_backend(name: str) -> type:
    """A backend class by registered name or by ``package.module:Class``."""
    _load_builtin()
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(f"cannot import backend module {module_name!r}: {exc}") from exc
        cls = getattr(module, attr, None)
        if cls is None:
            raise ValueError(f"module {module_name!r} has no attribute {attr!r}")
        if not (isinstance(cls, type) and issubclass(cls, PLEEmbedding)):
            raise ValueError(
                f"{name!r} is not a subclass of ple_bench.backends.PLEEmbedding"
            )
        return cls
    try:
        return _BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"unknown backend {name!r}; known: {sorted(_BACKENDS)} "
            "(or give an import path 'package.module:Class')"
        ) from None
