"""An axis entry as written in a suite (a scalar, a list, range tables) -> its values, each through
the axis' validator, in order, once each."""

from __future__ import annotations

import math
from typing import Any, Callable

from ..units import BadValue

MAX_RANGE_VALUES = 10_000


def _range_values(spec: dict[str, Any], conv: Callable[[Any], Any]) -> list[Any]:
    """Values of a range table (inclusive stop)."""
    keys = set(spec)
    if keys == {"pow2"}:
        bounds = spec["pow2"]
        if (
            not isinstance(bounds, list) or len(bounds) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and 0 <= b <= 62 for b in bounds)
            or bounds[0] > bounds[1]
        ):
            raise BadValue(f"bad range {spec!r}: pow2 takes [lo, hi], integers 0 <= lo <= hi <= 62")
        return [1 << e for e in range(bounds[0], bounds[1] + 1)]
    if keys not in ({"start", "stop", "mul"}, {"start", "stop", "step"}):
        raise BadValue(
            f"bad range {spec!r}; allowed range tables: {{start, stop, mul}}, {{start, stop, step}}, "
            "{pow2 = [lo, hi]} (stop is inclusive)"
        )
    start, stop = conv(spec["start"]), conv(spec["stop"])
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (start, stop)):
        raise BadValue(f"bad range {spec!r}: start and stop must be numbers")
    if start > stop:
        raise BadValue(f"bad range {spec!r}: start > stop")
    is_int = isinstance(start, int) and isinstance(stop, int)
    values: list[Any] = []
    if "mul" in spec:
        mul = spec["mul"]
        if isinstance(mul, bool) or not isinstance(mul, (int, float)) or mul <= 1 or start <= 0:
            raise BadValue(f"bad range {spec!r}: mul must be a number > 1 and start > 0")
        is_int = is_int and isinstance(mul, int)
        x = start
        while x <= stop * (1 + 1e-12):
            values.append(x)
            if len(values) > MAX_RANGE_VALUES:
                break
            x = x * mul
    else:
        step = spec["step"]
        if isinstance(step, bool) or not isinstance(step, (int, float)) or step <= 0:
            raise BadValue(f"bad range {spec!r}: step must be a number > 0")
        is_int = is_int and isinstance(step, int)
        count = int(math.floor((stop - start) / step + 1e-9)) + 1
        if count > MAX_RANGE_VALUES:
            raise BadValue(f"bad range {spec!r}: more than {MAX_RANGE_VALUES} values")
        values = [start + i * step for i in range(count)]
    if len(values) > MAX_RANGE_VALUES:
        raise BadValue(f"bad range {spec!r}: more than {MAX_RANGE_VALUES} values")
    if not is_int:
        values = [round(float(v), 12) for v in values]
    return values


def expand(value: Any, conv: Callable[[Any], Any]) -> list[Any]:
    """All normalised values of one axis entry (scalar, list, or range table)."""
    items = value if isinstance(value, list) else [value]
    out: list[Any] = []
    for item in items:
        if isinstance(item, dict):
            raw = _range_values(item, conv)
        elif isinstance(item, list):
            raise BadValue(f"nested list {item!r}; an axis takes a scalar, a list of scalars or range tables")
        else:
            raw = [item]
        for v in raw:
            v = conv(v)
            if v not in out:
                out.append(v)
    if not out:
        raise BadValue("empty list: an axis needs at least one value")
    return out
