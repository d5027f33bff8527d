"""Reading stored runs for reports, comparisons and exports.

Owns the tolerant view of a run directory (``meta.json`` + ``records.jsonl``):
missing keys and ``None`` values from older or CPU runs are normal here, never
an error.  Also the small helpers every report layer shares: the axes that
describe a case, number formatting, sample lists and grouping records into
plot series.  Nothing here measures; no torch import.
"""

from __future__ import annotations

import math
import numbers
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..impl_facts import impls_where
from ..record import Record, as_record
from ..results import LostLine, kept_samples, load_records, not_reached
from ..run_meta import RunMeta, as_meta
from ..units import format_bytes

# Case axes, in the order a person reads them.  ``seed`` and ``extra`` are
# not varied axes for plotting purposes (extra is shown in the table).
AXES = (
    "kind", "impl", "kernel", "vocab_size", "dim", "dtype", "num_heads", "num_tokens",
    "tp", "etp", "dp", "prefetch", "graph", "ids", "compute_us", "hidden",
    "stream_priority", "grid_frac", "sm_limit", "cache_rows",
    "compute", "decoder_shape", "decoder_layers", "context_len",
)
ALL_AXES = AXES + ("seed", "extra")


# The kernel a backend used when a case named none (kernel ""), for records without
# ``kernel_ran`` (runs before 2026-12-02: the device default was torch_masked then; records
# since carry the kernel they ran).  A lookup *path* is impl + the kernel it ran.
DEFAULT_KERNELS = {"device": "torch_masked", "pinned_uva": "triton_reference", "pinned_hot_cache": "triton_tuned"}
# Paths with no GPU gather kernel of their own (the kernel axis does not apply): as the backends
# declare them (ple_bench.impl_facts).
KERNEL_FREE_IMPLS = impls_where(kernel_free=True)
# The path other paths are compared against (the default pinned-host path).
REFERENCE_PATH = "pinned_uva · triton_reference"
# Derived axes: name -> the case axes they are made of.
DERIVED_AXES = {"path": ("impl", "kernel")}


class BadRunError(Exception):
    """A path that is not a readable ple_bench run."""


@dataclass
class Run:
    """One stored run: its directory, meta.json (typed: :class:`~ple_bench.run_meta.RunMeta`) and records."""

    path: Path
    meta: RunMeta
    records: list[Record] = field(default_factory=list)  # typed read-only views (normalize)
    lost: list[LostLine] = field(default_factory=list)  # lines of records.jsonl that are not records

    def __post_init__(self) -> None:
        # a run built in memory reads its meta and records through the same typed views as a loaded one
        self.meta = as_meta(self.meta)
        self.records = [as_record(r) for r in self.records]

    @property
    def run_id(self) -> str:
        return self.meta.run_id or self.path.name

    @property
    def suite(self) -> str:
        return self.meta.suite or "?"

    @property
    def ok(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("status") == "ok"]

    @property
    def mode(self) -> str:
        """gpu | functional; a run whose meta says nothing takes its records' word."""
        mode = self.meta.mode
        if mode:
            return mode
        modes = {r.get("mode") for r in self.records if r.get("mode")}
        if modes == {"functional"}:
            return "functional"
        return "gpu" if modes else "unknown"

    @property
    def functional(self) -> bool:
        return self.mode == "functional"

    @property
    def ceilings(self) -> dict[str, float]:
        """Bandwidth ceilings (GB/s): the positive ``*gbps*`` figures of meta's ceilings."""
        return self.meta.ceilings.gbps

    @property
    def ceiling_notes(self) -> dict[str, Any]:
        """The other entries of meta's ceilings (rows/s figures, timer, how long they took), as stored."""
        gbps = self.ceilings
        return {str(k): v for k, v in self.meta.ceilings.raw.items() if str(k) not in gbps}

    def ceiling_value(self, name: str) -> float | None:
        """One positive number from meta's ceilings (GB/s or rows/s), or None."""
        return self.meta.ceilings.positive(name)

    def row_ceiling(self, base: str, row_bytes: float | int | None) -> tuple[str, float] | None:
        """``base`` measured at this row size (``<base>_<N>B``) when stored, else ``base``."""
        names = ([f"{base}_{int(row_bytes)}B"] if row_bytes is not None else []) + [base]
        for name in names:
            v = self.ceiling_value(name)
            if v is not None:
                return name, v
        return None

    @property
    def not_reached(self) -> dict[str, list[str]]:
        """The cases the run was to record and did not (an interrupted or aborted run), by suite
        group; empty for a finished run and for a run whose meta.json does not list its cases."""
        return not_reached(self.meta, (r.case_id for r in self.records)) or {}

    @property
    def n_expected(self) -> int:
        """How many cases the run was to record: its records and the cases not reached (a run
        that predates the list: ``num_cases``, if larger)."""
        listed = len(self.records) + sum(map(len, self.not_reached.values()))
        return max(listed, self.meta.num_cases or 0)

    @property
    def started_at(self) -> str:
        return self.meta.started_at or ""


def load_run(run_dir: str | Path, warn: bool = True) -> Run:
    """Load a run; raises :class:`BadRunError` with a plain reason when it is not one.  ``warn``:
    name its lost lines on stderr (``False``: the caller names them, as compare's warnings do)."""
    path = Path(run_dir)
    if not path.exists():
        raise BadRunError(f"{path}: no such run directory")
    if not path.is_dir():
        raise BadRunError(f"{path}: not a directory")
    if not (path / "meta.json").exists():
        raise BadRunError(f"{path}: not a ple_bench run (no meta.json)")
    try:
        meta = RunMeta.load(path)
        lost: list[LostLine] = []
        records = load_records(path, lost=lost, warn=warn)
    except (OSError, ValueError) as exc:
        raise BadRunError(f"{path}: unreadable run ({exc})") from exc
    return Run(path=path, meta=meta, records=[normalize(r) for r in records], lost=lost)


def path_label(record: dict[str, Any]) -> str:
    """``impl · kernel`` with the kernel the case ran filled in for kernel "" (``kernel_ran``, or
    for older records the default then: ``pinned_uva`` -> ``pinned_uva · triton_reference``);
    kernel-free paths are just the impl."""
    impl = str(record.get("impl") or "?")
    if impl in KERNEL_FREE_IMPLS:
        return impl
    kernel = record.get("kernel") or record.get("kernel_ran") or DEFAULT_KERNELS.get(impl, "")
    return f"{impl} · {kernel}" if kernel else impl


def normalize(record: Mapping[str, Any]) -> Record:
    """The read-only typed view of a record (:class:`ple_bench.record.Record`) with the report's
    display label ``path`` (impl · kernel).  Record fields are read as loaded (typed and, for older
    records, upgraded by :func:`ple_bench.results.load_records`); nothing is recomputed here."""
    r = dict(record)
    r.setdefault("status", "ok")
    r.setdefault("case_id", "?")
    r["path"] = path_label(r)
    return Record(r)



def samples_of(record: Mapping[str, Any]) -> list[float]:
    """The raw per-sample times (ms) of a record: ``samples_ms``, else ``step_samples_ms``."""
    r = as_record(record)
    for values in (r.samples_ms, r.step_samples_ms):
        out = [v for v in values or () if v is not None]
        if out:
            return out
    return []


def measured_samples(record: Mapping[str, Any]) -> list[float]:
    """The samples a record's median stands for: :func:`samples_of` without those its
    ``samples_throttled`` flags (the rule is :func:`ple_bench.results.kept_samples`, the
    one the timer's summary uses).  Without per-sample flags, every sample."""
    r = as_record(record)
    for values in (r.samples_ms, r.step_samples_ms):
        if not values:
            continue
        flags = r.samples_throttled
        if flags is None or len(flags) != len(values):
            flags = [False] * len(values)
        pairs = [(v, bool(t)) for v, t in zip(values, flags) if v is not None]
        if pairs:
            return kept_samples([f for f, _ in pairs], [t for _, t in pairs])
    return []


def unflagged_throttled(record: Mapping[str, Any]) -> bool:
    """True when the record counts throttled samples (``throttled_samples`` > 0) but does not flag
    which ones (no ``samples_throttled`` of the samples' length: runs older than that field)."""
    r = as_record(record)
    if (r.throttled_samples or 0) <= 0:
        return False
    flags, values = r.samples_throttled, r.samples_ms or r.step_samples_ms
    return not (flags is not None and values is not None and len(flags) == len(values))


def topology(record: Mapping[str, Any]) -> tuple[int, int, int]:
    r = as_record(record)
    return (int(r.tp or 1), int(r.etp or 1), int(r.dp or 1))


def topology_label(record: dict[str, Any]) -> str:
    tp, etp, dp = topology(record)
    return f"tp{tp} etp{etp} dp{dp}"


def single_rank(record: dict[str, Any]) -> bool:
    return topology(record) == (1, 1, 1)


def axis_value(record: dict[str, Any], axis: str) -> Any:
    if axis == "path":
        return record.get("path") or path_label(record)
    value = record.get(axis)
    if isinstance(value, (dict, list)):
        return repr(value) if value else None
    return value


def is_number(value: Any) -> bool:
    """``value`` is a finite number (an int or float, not a bool).  A type test of a typed value
    (a :class:`Record`'s field, a figure of :class:`~ple_bench.run_meta.RunMeta`, a JSON number of
    an untyped object such as a record's ``extra``): no text is read as a number here."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def fmt(value: Any, digits: int = 4) -> str:
    """Human formatting: 4 significant digits, thousands separators, '' for None; text (and a
    NaN or infinity) as it is."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, numbers.Integral):
        return f"{value:,}"
    if not is_number(value):
        return str(value)
    f = float(value)
    if f == 0:
        return "0"
    if abs(f) >= 10 ** digits:
        return f"{f:,.0f}"
    if abs(f) < 1e-3:
        return f"{f:.{digits - 1}e}"
    return f"{f:.{digits}g}"


def safe_name(name: str) -> str:
    """``name`` as a file or folder name: every character but letters, digits, ``_ - . +`` as ``_``;
    ``run`` for an empty name."""
    return re.sub(r"[^\w.+-]", "_", name) or "run"


def fmt_bytes(n: float | int | None) -> str:
    """A byte count for display (:func:`ple_bench.units.format_bytes`); "" where there is none."""
    return format_bytes(float(n)) if is_number(n) else ""


def describe(record: dict[str, Any], axes: Iterable[str] = ("impl", "dtype")) -> str:
    """A short plain label of a record on the given axes, e.g. ``pinned_uva fp8``."""
    parts = []
    for axis in axes:
        value = axis_value(record, axis)
        if value in (None, "", False) and axis != "prefetch":
            continue
        if axis == "prefetch":
            parts.append("prefetch" if value else "no prefetch")
        elif axis in ("impl", "dtype", "kind", "graph", "ids", "kernel", "path"):
            parts.append(str(value))
        elif axis in ("tp", "etp", "dp"):
            parts.append(f"{axis}{value}")
        else:
            parts.append(f"{axis}={fmt(value)}")
    return " ".join(parts)


def varying_axes(records: Sequence[dict[str, Any]], exclude: Iterable[str] = ()) -> list[str]:
    excluded = set(exclude)
    out = []
    for axis in AXES:
        if axis in excluded:
            continue
        if len({_hashable(axis_value(r, axis)) for r in records}) > 1:
            out.append(axis)
    return out


def _hashable(value: Any) -> Any:
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)


def key_of(record: dict[str, Any], axes: Sequence[str]) -> tuple:
    return tuple(_hashable(axis_value(record, a)) for a in axes)


# Axes that are determined by x (so they do not count as "other" axes of a series).
_DETERMINED_BY = {
    "table_bytes": ("vocab_size",),
    "row_bytes": ("dim",),
    "topology": ("tp", "etp", "dp"),
}


@dataclass
class Slice:
    """Records grouped into series for one plot or one finding."""

    series: dict[tuple, list[dict[str, Any]]]  # label axes values -> records
    label_axes: list[str]  # axes whose values name a series
    fixed: dict[str, Any]  # axes pinned to one value to keep the plot readable

    def label(self, key: tuple) -> str:
        rec = dict(zip(self.label_axes, key))
        return describe(rec, self.label_axes) or "all"

    def fixed_text(self) -> str:
        if not self.fixed:
            return ""
        return ", ".join(f"{k}={fmt(v) if not isinstance(v, str) else v}" for k, v in self.fixed.items())


def slice_series(records: Sequence[dict[str, Any]], x: str, series_axes: Sequence[str],
                 max_series: int = 8) -> Slice:
    """Group ``records`` into series along ``x``.

    Every axis that varies (other than ``x``, what ``x`` is made of, and the
    series axes) also splits series, so that one line never mixes cases that
    differ in something unnamed.  When that gives more than ``max_series``
    lines, the other axes are pinned one by one to their most common value
    (the plot says which)."""
    records = list(records)
    exclude = set(series_axes) | {x} | set(_DETERMINED_BY.get(x, ()))
    for a in series_axes:
        exclude |= set(DERIVED_AXES.get(a, ()))
    others = varying_axes(records, exclude=exclude)
    series_axes = [a for a in series_axes if a in AXES or a in DERIVED_AXES]
    fixed: dict[str, Any] = {}
    while True:
        label_axes = list(series_axes) + others
        groups: dict[tuple, list[dict[str, Any]]] = {}
        for r in records:
            groups.setdefault(key_of(r, label_axes), []).append(r)
        if len(groups) <= max_series or not others:
            return Slice(series=groups, label_axes=label_axes, fixed=fixed)
        # Pin the axis with the fewest distinct values to its most common value
        # (ties: the largest value, usually the most realistic size).
        others.sort(key=lambda a: len({_hashable(axis_value(r, a)) for r in records}))
        axis = others.pop(0)
        counts = Counter(_hashable(axis_value(r, axis)) for r in records)
        best = max(counts.items(), key=lambda kv: (kv[1], order_key(kv[0])))[0]
        fixed[axis] = best
        records = [r for r in records if _hashable(axis_value(r, axis)) == best]


def order_key(value: Any) -> tuple:
    """How axis values sort: numbers by value first, then anything else by its text."""
    return (0, float(value), "") if is_number(value) else (1, 0.0, str(value))


def x_value(record: dict[str, Any], x: str) -> Any:
    if x == "topology":
        return topology_label(record)
    return record.get(x)


def points(records: Sequence[dict[str, Any]], x: str, y: str) -> list[tuple[float, float]]:
    """(x, median y) pairs sorted by x; several records at one x give their median."""
    by_x: dict[float, list[float]] = {}
    for r in map(as_record, records):
        xv, yv = x_value(r, x), r.get(y)
        if not (is_number(xv) and is_number(yv)):
            continue
        by_x.setdefault(float(xv), []).append(float(yv))
    return [(xv, statistics.median(ys)) for xv, ys in sorted(by_x.items())]


def pairs(records: Sequence[dict[str, Any]], axis: str) -> list[dict[Any, dict[str, Any]]]:
    """Records that differ only in ``axis`` (and what it determines), as
    ``{axis value: record}`` groups with at least two members."""
    ignore = {axis, "seed"} | set(_DETERMINED_BY.get(axis, ()))
    if axis == "dtype":
        ignore |= {"row_bytes", "table_bytes"}
    rest = [a for a in AXES if a not in ignore]
    groups: dict[tuple, dict[Any, dict[str, Any]]] = {}
    for r in records:
        value = x_value(r, axis) if axis == "topology" else _hashable(axis_value(r, axis))
        groups.setdefault(key_of(r, rest), {})[value] = r
    return [g for g in groups.values() if len(g) >= 2]


def status_counts(records: Sequence[dict[str, Any]]) -> dict[str, int]:
    counts = Counter(str(r.get("status")) for r in records)
    return {s: counts.get(s, 0) for s in ("ok", "skipped", "failed", "invalid")} | {
        s: c for s, c in counts.items() if s not in ("ok", "skipped", "failed", "invalid")
    }


def run_order_key(run: Run) -> tuple:
    return (run.started_at or "", run.run_id)


def median_or_stored(samples: list[float], records: Sequence[Mapping[str, Any]]) -> float | None:
    """The median of ``samples``, else of the records' stored ``median_ms`` (records that kept no samples)."""
    if samples:
        return statistics.median(samples)
    stored = [m for m in (as_record(r).median_ms for r in records) if m is not None]
    return statistics.median(stored) if stored else None


def run_median(record: dict[str, Any]) -> float | None:
    """One run's observation of a case: the median of its throttle-filtered samples
    (the stored ``median_ms`` when the record kept no samples)."""
    return median_or_stored(measured_samples(record), [record])


def case_label(record: dict[str, Any]) -> str:
    """What a case is, in a few words (the case id hides some axes in its hash)."""
    axes = ["kind", "impl", "dtype", "num_tokens"]
    if record.get("kind") == "step":
        axes += ["prefetch", "compute_us"]
    text = describe(record, axes)
    tp, etp, dp = (record.get(k) or 1 for k in ("tp", "etp", "dp"))
    if (tp, etp, dp) != (1, 1, 1):
        text += f" tp{tp} etp{etp} dp{dp}"
    return text
