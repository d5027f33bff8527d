"""Units, once: bytes per element of each storage dtype (by name), sizes written as text ("64MiB",
"47.7 GiB", "8GB") and bytes formatted for people.  No torch: a case, a record and a report all read
these without a GPU stack (:data:`ple_bench.backends.formats.DTYPES` maps the same names to torch
dtypes)."""

from __future__ import annotations

import re
from typing import Any

try:  # the TOML reader of suites and machine descriptions, one place for the Python 3.10 fallback
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ModuleNotFoundError:  # pragma: no cover
        tomllib = None  # type: ignore[assignment]

#: bytes per element of each storage dtype; its keys are the ``dtype`` axis' values
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}

SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
SIZE_UNITS = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
              "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


class BadValue(ValueError):
    """A value that is not what its place takes; the caller adds the place (file, key, flag)."""


def parse_size(value: Any, *, exact: bool = True) -> int:
    """Bytes from an integer or a string like "64MiB", "1.5 GiB", "8GB".  ``exact``: a size that is not a
    whole number of bytes is refused (a suite wants them exact); otherwise it is rounded."""
    if isinstance(value, bool):
        raise BadValue(f"{value!r} is not a size")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str) and (m := SIZE_RE.match(value)):
        f = float(m.group(1)) * SIZE_UNITS[(m.group(2) or "B").lower()]
        if exact and f != int(f):
            raise BadValue(f"size {value!r} is not a whole number of bytes")
        n = int(f) if exact else int(round(f))
    else:
        raise BadValue(f"{value!r} is not a size; allowed: a positive integer or a string like '64MiB', '32GiB'")
    if n < 1:
        raise BadValue(f"size {value!r} must be positive")
    return n


def format_bytes(n: float) -> str:
    """Approximate size for display, 3 significant digits in the largest unit it reaches: a table of
    ``bytes // row_bytes`` rows a few bytes short of 1 GiB still shows as "1 GiB"."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 0.9995 * (1 << shift):  # 1,073,741,760 B reads "1 GiB", not "1.02e+03 MiB"
            return f"{n / (1 << shift):.3g} {unit}"
    return f"{n:.0f} B"
