"""Backends by name: the built-in lookup paths as a table of ``"impl": "module:Class"`` names,
imported when one is asked for, or any external implementation by import path
(``package.module:Class``) so a user can benchmark their own class.

Nothing here imports a backend module at import time, and no backend module imports this one: the
table names its plug-ins, so there is no import circle through the registry.  A built-in whose
module fails to import is an error naming the impl and the cause (never a name that silently
disappears from the list); an unknown name is an error listing the known ones.
"""

from __future__ import annotations

import importlib
from typing import Callable

from .base import PLEEmbedding

#: each built-in lookup path: its ``impl`` name (suites, records, case ids) -> ``module:Class``;
#: the module is named after the impl and the class declares ``name = impl``
BUILTIN: dict[str, str] = {
    "device": "ple_bench.backends.device:DeviceResidentEmbedding",
    "pinned_uva": "ple_bench.backends.pinned_uva:PinnedUVAEmbedding",
    "pinned_cpu_gather": "ple_bench.backends.pinned_cpu_gather:PinnedCPUGatherEmbedding",
    "pinned_hot_cache": "ple_bench.backends.pinned_hot_cache:PinnedHotCacheEmbedding",
    "pinned_copy_engine": "ple_bench.backends.pinned_copy_engine:PinnedCopyEngineEmbedding",
    "pinned_host_graph": "ple_bench.backends.pinned_host_graph:PinnedHostGraphEmbedding",
    "pinned_host_flag": "ple_bench.backends.pinned_host_flag:PinnedHostFlagEmbedding",
}

#: names a user's code added at run time with :func:`register_backend`
_REGISTERED: dict[str, type] = {}


class BackendImportError(ImportError):
    """A built-in backend's module did not import (its cause is chained and in the message)."""


def register_backend(name: str) -> Callable[[type], type]:
    """Give a user's own ``PLEEmbedding`` subclass a short name for this process (the built-ins
    are in :data:`BUILTIN`; a suite can also name any class by import path)."""

    def deco(cls: type) -> type:
        if name in BUILTIN or (name in _REGISTERED and _REGISTERED[name] is not cls):
            raise ValueError(f"backend name {name!r} is already registered")
        cls.name = name
        _REGISTERED[name] = cls
        return cls

    return deco


def backend_names() -> list[str]:
    """Every name :func:`get_backend` knows (imports nothing)."""
    return sorted(BUILTIN.keys() | _REGISTERED.keys())


def _import_path(path: str) -> type:
    """The class at ``package.module:Class``, checked to be a backend."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import backend module {module_name!r}: {exc}") from exc
    cls = getattr(module, attr, None)
    if cls is None:
        raise ValueError(f"module {module_name!r} has no attribute {attr!r}")
    if not (isinstance(cls, type) and issubclass(cls, PLEEmbedding)):
        raise ValueError(f"{path!r} is not a subclass of ple_bench.backends.PLEEmbedding")
    return cls


def _load_builtin(impl: str, table: dict[str, str]) -> type:
    """Import a built-in's module now; any failure is an error naming the impl and its cause."""
    path = table[impl]
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001  (a module may raise anything while importing; re-raised)
        raise BackendImportError(
            f"built-in backend {impl!r} does not import ({module_name}): {type(exc).__name__}: {exc}") from exc
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, PLEEmbedding)):
        raise BackendImportError(f"built-in backend {impl!r}: {path} is not a PLEEmbedding subclass")
    if cls.name != impl:
        raise BackendImportError(f"built-in backend {impl!r}: {path} declares name = {cls.name!r}")
    return cls


def get_backend(name: str, *, builtin: dict[str, str] | None = None) -> type:
    """A backend class by name (a built-in or a :func:`register_backend` name) or by
    ``package.module:Class``.  ``builtin`` replaces :data:`BUILTIN` (for tests of this loader)."""
    table = BUILTIN if builtin is None else builtin
    if ":" in name:
        return _import_path(name)
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in table:
        return _load_builtin(name, table)
    raise ValueError(
        f"unknown backend {name!r}; known: {sorted(table.keys() | _REGISTERED.keys())} "
        "(or give an import path 'package.module:Class')"
    )
