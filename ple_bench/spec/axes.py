"""Every axis once: its validator (a value as written in a suite -> the value a case holds, or
:class:`~ple_bench.units.BadValue`), the pseudo-axis ``table_bytes``, the order axes vary in, the
axes only a decode step has, and the keys of ``[suite.timing]``."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Callable

from .. import workload
from ..backends.kernels import kernel_names
from ..backends.registry import backend_names, get_backend
from ..compute import DECODER_SHAPES
from ..measure.timer import TimingPolicy
from ..units import DTYPE_BYTES, BadValue, parse_size
from ..serving.models import KV_DTYPES, MODELS
from .case import COMPUTE_KINDS, DECODER_AXES, GRAPH_MODES, HOST_ALLOC_MODES, IDS_ON, KINDS, SERVE_AXES, Case

STEP_ONLY_AXES = ("compute_us", "hidden", "compute", "h2d_background") + DECODER_AXES


def _int(lo: int | None = None, hi: int | None = None) -> Callable[[Any], int]:
    def conv(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise BadValue(f"{v!r} is not an integer")
        if lo is not None and v < lo:
            raise BadValue(f"{v!r} must be >= {lo}")
        if hi is not None and v > hi:
            raise BadValue(f"{v!r} must be <= {hi}")
        return v

    return conv


def _float(lo: float, hi: float | None = None, lo_open: bool = False) -> Callable[[Any], float]:
    def conv(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise BadValue(f"{v!r} is not a number")
        if v < lo or (lo_open and v == lo):
            raise BadValue(f"{v!r} must be {'>' if lo_open else '>='} {lo:g}")
        if hi is not None and v > hi:
            raise BadValue(f"{v!r} must be <= {hi:g}")
        return float(v)

    return conv


def _choice(allowed: tuple[str, ...], what: str) -> Callable[[Any], str]:
    def conv(v: Any) -> str:
        if v not in allowed:
            raise BadValue(f"unknown {what} {v!r}; allowed: {', '.join(allowed)}")
        return v

    return conv


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise BadValue(f"{v!r} is not a string")
    return v


def _bool(what: str) -> Callable[[Any], bool]:
    def conv(v: Any) -> bool:
        if isinstance(v, bool):
            return v
        if isinstance(v, str) and v.lower() in ("on", "off"):
            return v.lower() == "on"
        raise BadValue(f"{v!r} is not a {what} setting; allowed: true, false, 'on', 'off'")

    return conv


_prefetch = _bool("prefetch")


def ids_value(v: Any) -> str:
    try:
        return workload.parse_ids_spec(v).canonical
    except ValueError as exc:
        raise BadValue(str(exc)) from None


_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


def _impl(v: Any) -> str:
    names = backend_names()
    if isinstance(v, str) and v in names:
        return v
    if isinstance(v, str) and _IMPORT_PATH.match(v):
        _check_import_path(v)
        return v
    raise BadValue(f"unknown impl {v!r}; allowed: {', '.join(names)} or an import path 'package.module:Class'")


def _check_import_path(path: str) -> None:
    """Import ``package.module:Class`` now: a plug-in backend that does not import, or is not a
    ``PLEEmbedding`` subclass, is a bad suite (exit 2), not a case skipped at run time."""
    try:
        get_backend(path)
    except Exception as exc:  # noqa: BLE001  (a module may raise anything while importing)
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise BadValue(f"impl {path!r} does not load as a backend: {why}") from None


def _kernel(v: Any) -> str:
    names = kernel_names()
    if v == "" or v in names:
        return v
    raise BadValue(f"unknown kernel {v!r}; allowed: '' (the backend's default), {', '.join(names)}")


def extra_value(v: Any) -> Any:
    if isinstance(v, (str, int, float, bool)):
        return v
    raise BadValue(f"{v!r} is not a scalar; extra axes take strings, numbers or booleans")


AXES: dict[str, Callable[[Any], Any]] = {
    "kind": _choice(KINDS, "kind"),
    "impl": _impl,
    "kernel": _kernel,
    "vocab_size": _int(1),
    "dim": _int(1),
    "dtype": _choice(tuple(DTYPE_BYTES), "dtype"),
    "num_heads": _int(1),
    "num_tokens": _int(1),
    "tp": _int(1),
    "etp": _int(1),
    "dp": _int(1),
    "prefetch": _prefetch,
    "graph": _choice(GRAPH_MODES, "graph mode"),
    "ids": ids_value,
    "seed": _int(0),
    "compute_us": _float(0.0),
    "hidden": _int(1),
    "stream_priority": _int(hi=0),
    "grid_frac": _float(0.0, 1.0, lo_open=True),
    "sm_limit": _int(0),
    "h2d_background": _bool("h2d_background"),
    "cache_rows": _int(0),
    "ids_on": _choice(IDS_ON, "ids_on"),
    "gather_threads": _int(0, 256),
    "host_alloc": _choice(HOST_ALLOC_MODES, "host_alloc"),
    "compute": _choice(COMPUTE_KINDS, "compute"),
    "decoder_shape": _choice(tuple(DECODER_SHAPES), "decoder_shape"),
    "decoder_layers": _int(1),
    "context_len": _int(1),
    "model": _choice(tuple(MODELS), "model"),
    "kv_dtype": _choice(KV_DTYPES, "kv_dtype"),
    "gpu_memory_utilization": _float(0.0, 1.0, lo_open=True),
    "batch_fraction": _float(0.0, 1.0, lo_open=True),
}
# Pseudo-axis: a table size, turned into vocab_size = table_bytes // row_bytes.
PSEUDO_AXES: dict[str, Callable[[Any], Any]] = {"table_bytes": parse_size}
assert set(AXES) | {"extra"} == {f.name for f in dataclasses.fields(Case)}, "AXES out of date with Case"

# Table-defining axes vary slowest, so cases that share a table are adjacent.
PRODUCT_ORDER = ["impl", "tp", "etp", "dp", "seed", "dtype", "dim", "vocab_size", "table_bytes",
                 "num_heads", "kernel", "cache_rows", "host_alloc", "kind"]
PRODUCT_ORDER += [a for a in AXES if a not in PRODUCT_ORDER]

TIMING: dict[str, tuple[Callable[[Any], Any], str]] = {
    "warmup_ms": (_float(0.0), "a number >= 0"),
    "min_samples": (_int(1), "an integer >= 1"),
    "max_samples": (_int(1), "an integer >= 1"),
    "min_time_s": (_float(0.0), "a number >= 0"),
    "max_time_s": (_float(0.0, lo_open=True), "a number > 0"),
    "max_noise": (_float(0.0), "a number >= 0"),
    "cold_l2": (lambda v: boolean(v), "true or false"),
    "hot": (lambda v: boolean(v), "true or false"),
    "graph": (lambda v: boolean(v), "true or false"),
    "throttle_threshold": (_float(0.0, 1.0), "a number in [0, 1]"),
    "id_sets": (_int(1), "an integer >= 1"),
    "remeasure_unstable": (lambda v: boolean(v), "true or false"),
}
assert set(TIMING) == {f.name for f in dataclasses.fields(TimingPolicy)}, "TIMING out of date with TimingPolicy"


def boolean(v: Any) -> bool:
    if not isinstance(v, bool):
        raise BadValue(f"{v!r} is not a boolean")
    return v
