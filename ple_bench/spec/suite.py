"""Suites: TOML files in ``suites/`` turned into validated, de-duplicated cases.

A suite is a TOML file ``suites/<name>.toml``::

    [suite]
    description = "what it is for"          # required
    notes = "free text"                      # optional
    gpu_only = true                          # optional (default false): needs a CUDA GPU
    functional_fallback = "smoke"            # optional: suite to run instead on a machine without GPU

    [suite.timing]                           # optional: the suite's timing policy, passed to the runner
    warmup_ms = 200        # number >= 0     time spent warming up before sampling
    min_samples = 10       # integer >= 1
    max_samples = 2000     # integer >= min_samples
    min_time_s = 0.5       # number >= 0     sample at least this long ...
    max_time_s = 3.0       # number >= min_time_s  ... and at most this long
    max_noise = 0.02       # number >= 0     stop once the relative noise is below this
    cold_l2 = true         # bool            flush L2 before each sample
    hot = true             # bool            also measure back-to-back (hot) repetitions
    graph = true           # bool            also time by replaying a CUDA graph of the timed loop
    throttle_threshold = 0.75  # in [0, 1]   drop samples whose SM clock fell below this share
    # these are the keys of ple_bench.measure.TimingPolicy; the runner turns the table into one

    [defaults]                               # optional: axes shared by every group (a group overrides them)
    dtype = "fp8"

    [[group]]                                # one or more; the cases are the union of the groups' cases
    name = "vocab sweep"                     # optional (default "group<N>")
    description = "..."                      # optional
    tags = ["needs_4_gpus"]                  # optional free-form labels, kept with the group
    impl = ["device", "pinned_uva"]          # axes: a scalar, a list, or a range table
    table_bytes = ["64MiB", "1GiB"]          # instead of vocab_size: vocab = bytes // row_bytes
    num_tokens = {start = 256, stop = 32768, mul = 4}
    variants = [{tp = 1, etp = 2, dp = 2}, {tp = 2, etp = 2, dp = 1}]   # optional: zipped axes
    exclude = [{impl = "device", prefetch = "on"}]                       # optional
    constraints = ["etp % tp == 0", "num_tokens * num_heads <= 65536"]  # optional

Axes are exactly the fields of :class:`ple_bench.spec.case.Case` (kind, impl, kernel,
vocab_size, dim, dtype, num_heads, num_tokens, tp, etp, dp, prefetch, graph, ids,
seed, compute_us, hidden, stream_priority, grid_frac, sm_limit, cache_rows, ids_on,
gather_threads, host_alloc, compute, decoder_shape, decoder_layers, context_len), plus
``table_bytes`` (an integer or a size string such as ``"64MiB"``/``"32GiB"``;
a group gives either ``vocab_size`` or ``table_bytes``) and ``extra.<key>`` (free
axes of plug-in backends, e.g. ``extra.block = [64, 128]``).

* Values: a scalar; a list (its items scalars or range tables); or a range table
  with an *inclusive* stop: ``{start, stop, mul}`` (geometric, mul > 1),
  ``{start, stop, step}`` (arithmetic, step > 0), ``{pow2 = [lo, hi]}``
  (2^lo .. 2^hi).
* ``prefetch`` accepts true/false or "on"/"off".  ``ids`` is "uniform",
  "zipf:<a>" (a > 0), "ngram" / "ngram:<orders>" or real text "text:<corpus>[+lower]"
  (corpus code, docs, prose; see :mod:`ple_bench.workload`, :mod:`ple_bench.traces`).
  ``impl`` is a registered backend name or an import path "pkg.mod:Class"; an
  import path is imported when the suite is loaded and must name a subclass of
  ``ple_bench.backends.PLEEmbedding`` (otherwise the suite is bad: exit 2).
* The cases of a group are the product of its axes (and of its ``variants``,
  each a table of axes that go together).  They are ordered so that cases sharing
  a table (same impl, topology, dtype, dim, vocab, seed) are adjacent.
* ``exclude``: a case matching every key of any entry is dropped (an entry's
  value may be a list: any of them matches).
* ``constraints``: a case is kept only if every constraint is true.  A
  constraint is either a name (``valid_topology``: TP/ETP/DP form a possible
  topology; ``ngram_heads``: num_heads divides among the n-gram orders) or a
  simple expression over the axes and ``world_size``, ``replicas`` (ETP/TP),
  ``row_bytes``, ``table_bytes``, ``num_ids`` (tokens x heads): integer and
  string literals, ``+ - * / // % **``, comparisons, ``in``, ``and``/``or``/
  ``not``.  It is parsed, never ``eval``-ed.
* ``sm_limit`` (an integer >= 0; 0, the default, = no limit) limits the
  prefetch side stream to a green context of that many SMs (the driver rounds
  up to its granularity; the record says ``sm_limit_granted``).  It needs
  ``prefetch = true``: a case with ``sm_limit`` > 0 and prefetch off is an
  error (filter it with ``exclude``).  A ``kind = "lookup"`` case with prefetch
  runs its lookup on that stream, the main stream waiting for it.
* ``ids_on`` is "device" (default: the ids are produced on the GPU, as by an
  earlier kernel) or "host" (the ids are a pinned host tensor known when the
  lookup or step starts, as a server's scheduler knows them: kernel paths copy
  them to the device as part of their cost, host paths gather at once).
  ``gather_threads`` (0 = the cores torch sees, at most 16) is the CPU-gather
  path's thread count; other paths skip a case that sets it.
* ``host_alloc`` ("torch", the default; "exact"; "exact_huge") is how a pinned
  table's host memory is allocated: torch's caching allocator (power-of-two
  blocks), or exactly the table's bytes pinned with ``cudaHostRegister`` (on 2
  MiB transparent huge pages for "exact_huge"); see
  :mod:`ple_bench.backends.host_alloc`.  A backend whose table is not in host
  memory (``device``) skips a case with a mode other than "torch", with the
  reason.
* ``compute`` (steps) is "matmul" (default: a chain of square matmuls calibrated
  to ``compute_us``) or "decoder" (real decoder layers, :mod:`ple_bench.compute`:
  ``decoder_layers`` >= 1 layers of the named ``decoder_shape`` -- "qwen3-8b",
  "tiny" -- over KV caches of ``context_len`` >= 1 positions per sequence, one
  sequence per token).  The decoder's time is measured, not targeted: a decoder
  case with ``compute_us`` > 0 is an error (filter it with ``exclude``); its
  ``hidden`` is the shape's (giving another is an error).  Matmul cases reset the
  decoder axes to their defaults.
* For ``kind = "lookup"`` the step-only axes (``compute_us``, ``hidden``, and
  the compute axes) are reset to their defaults (so a mixed group does not repeat a lookup per compute
  time); cases that become equal, within or across groups, are kept once.

Every remaining case is then checked (topology via
:class:`ple_bench.parallel.Topology`, n-gram heads, vocab >= heads, ...).  Any
problem raises :class:`SuiteError` with one message naming the file, the place
(group, key) and what is allowed.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import json
import math
import operator
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ModuleNotFoundError:  # pragma: no cover
        tomllib = None  # type: ignore[assignment]

from .case import (COMPUTE_KINDS, DECODER_AXES, GRAPH_MODES, HOST_ALLOC_MODES, IDS_ON, KINDS, Case,
                   with_baselines)
from ..compute import DECODER_SHAPES
from ..parallel import Topology, TopologyError
from ..units import DTYPE_BYTES, BadValue, format_bytes, parse_size
from .. import workload

SUITES_ENV = "PLE_BENCH_SUITES_DIR"
REPO_SUITES_DIR = Path(__file__).resolve().parents[2] / "suites"

STEP_ONLY_AXES = ("compute_us", "hidden", "compute") + DECODER_AXES
MAX_GROUP_PRODUCT = 200_000
MAX_RANGE_VALUES = 10_000


class SuiteError(ValueError):
    """A suite file that cannot be loaded; the message names file, key and what is allowed."""


# ------------------------------------------------------------------ data
@dataclass
class SuiteGroup:
    name: str
    description: str = ""
    tags: list[str] = field(default_factory=list)
    case_ids: list[str] = field(default_factory=list)  # cases first produced by this group


@dataclass
class Suite:
    name: str
    path: Path
    description: str
    cases: list[Case]
    timing: dict[str, Any] = field(default_factory=dict)
    gpu_only: bool = False
    notes: str = ""
    functional_fallback: str | None = None
    groups: list[SuiteGroup] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.cases)

    @property
    def max_world_size(self) -> int:
        return max((c.world_size for c in self.cases), default=1)

    def group_of(self, case_id: str) -> SuiteGroup | None:
        for group in self.groups:
            if case_id in group.case_ids:
                return group
        return None


# ------------------------------------------------------------------ finding files
def suite_dirs() -> list[Path]:
    """Where suites are looked up: ``$PLE_BENCH_SUITES_DIR`` (``os.pathsep``-separated), then the repo's ``suites/``."""
    dirs = [Path(p) for p in os.environ.get(SUITES_ENV, "").split(os.pathsep) if p]
    dirs.append(REPO_SUITES_DIR)
    return dirs


def _suite_files() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for d in suite_dirs():
        if d.is_dir():
            for p in sorted(d.glob("*.toml")):
                found.setdefault(p.stem, p)
    return found


def find_suite(name: str) -> Path:
    files = _suite_files()
    if name not in files:
        raise SuiteError(
            f"unknown suite {name!r}; known suites: {sorted(files)} "
            f"(searched {[str(d) for d in suite_dirs()]}), or give a path to a .toml file"
        )
    return files[name]


def load_suite(name_or_path: str | os.PathLike) -> Suite:
    """A suite by name (``suites/<name>.toml``) or by path to a TOML file."""
    text = os.fspath(name_or_path)
    if isinstance(name_or_path, os.PathLike) or text.endswith(".toml") or os.sep in text:
        path = Path(text)
        if not path.is_file():
            raise SuiteError(f"{path}: no such suite file")
    else:
        path = find_suite(text)
    return _SuiteParser(path).parse()


def list_suites() -> list[Suite]:
    """Every suite found, loaded (a broken suite file raises its SuiteError)."""
    return [load_suite(p) for _, p in sorted(_suite_files().items())]


# ------------------------------------------------------------------ output helpers
def case_json(case: Case) -> dict[str, Any]:
    return {"case_id": case.case_id, **case.axes()}


def format_cases(cases: list[Case]) -> str:
    """An aligned table: one row per case; axes equal in every case are listed once above it."""
    if not cases:
        return "(no cases)"
    names = [f.name for f in dataclasses.fields(Case)]
    rows = [case_json(c) for c in cases]
    defaults = case_json(Case())

    def key(v: Any) -> str:
        return json.dumps(v, sort_keys=True, default=str)

    varying = [n for n in names if len({key(r[n]) for r in rows}) > 1]
    common = [n for n in names if n not in varying and key(rows[0][n]) != key(defaults[n])]
    header = ["#", "case_id"] + varying + ["table"]
    body = [
        [str(i), r["case_id"]] + [_cell(r[n]) for n in varying] + [format_bytes(_table_bytes(c))]
        for i, (r, c) in enumerate(zip(rows, cases), 1)
    ]
    widths = [max(len(row[j]) for row in [header] + body) for j in range(len(header))]
    numeric = [all(_is_number(row[j]) for row in body) for j in range(len(header))]

    def line(row: list[str]) -> str:
        cells = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric)]
        return "  ".join(cells).rstrip()

    out = []
    if common:
        out.append("common: " + " ".join(f"{n}={_cell(rows[0][n])}" for n in common))
    out += [line(header), line(["-" * w for w in widths])]
    out += [line(row) for row in body]
    out.append(f"{len(cases)} case{'s' if len(cases) != 1 else ''}")
    return "\n".join(out)


def format_cases_narrow(suite: "Suite", width: int = 100) -> str:
    """``list --suite S``: the cases by group, each group headed by the axes that vary in it;
    a case on one line: its number (as in :func:`format_cases`), its table size (in the group's
    head when one size serves the group) and ``case_id``, which spells the axes that differ from
    their defaults."""
    import textwrap

    if not suite.cases:
        return "(no cases)"
    number = {c.case_id: i for i, c in enumerate(suite.cases, 1)}
    by_id = {c.case_id: c for c in suite.cases}
    groups = [(g.name, [by_id[cid] for cid in g.case_ids if cid in by_id]) for g in suite.groups]
    grouped = {cid for _, cases in groups for cid in (c.case_id for c in cases)}
    rest = [c for c in suite.cases if c.case_id not in grouped]
    if rest:
        groups.append(("(other)", rest))
    names = [f.name for f in dataclasses.fields(Case)]
    digits = len(str(len(suite.cases)))
    out = []
    for name, cases in groups:
        if not cases:
            continue
        rows = [case_json(c) for c in cases]
        varying = [n for n in names if len({json.dumps(r[n], sort_keys=True, default=str) for r in rows}) > 1]
        sizes = {format_bytes(_table_bytes(c)) for c in cases}
        head = f"[{name}] {len(cases)} case{'s' if len(cases) != 1 else ''}" + (
            f", table {next(iter(sizes))}" if len(sizes) == 1 else "") + (
            ", varying " + ", ".join(varying) if varying else "")
        out += textwrap.wrap(head, width, subsequent_indent="    ")
        size_width = max(map(len, sizes))
        out += [f"{number[c.case_id]:>{digits}}  " + (f"{format_bytes(_table_bytes(c)):>{size_width}}  "
                                                       if len(sizes) > 1 else "") + c.case_id for c in cases]
    out.append(f"{len(suite.cases)} case{'s' if len(suite.cases) != 1 else ''} (--wide: every axis as a column)")
    return "\n".join(out)


def _table_bytes(case: Case) -> int:
    return case.vocab_size * case.dim * DTYPE_BYTES[case.dtype]


def _cell(v: Any) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, dict):
        return ",".join(f"{k}={x}" for k, x in sorted(v.items())) or "-"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v) if v != "" else "-"


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


# ------------------------------------------------------------------ value parsing
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


def _prefetch(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("on", "off"):
        return v.lower() == "on"
    raise BadValue(f"{v!r} is not a prefetch setting; allowed: true, false, 'on', 'off'")


def _ids(v: Any) -> str:
    try:
        return workload.parse_ids_spec(v).canonical
    except ValueError as exc:
        raise BadValue(str(exc)) from None


_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


def _impl(v: Any) -> str:
    from ..backends.registry import backend_names

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
    from ..backends.registry import get_backend

    try:
        get_backend(path)
    except Exception as exc:  # noqa: BLE001  (a module may raise anything while importing)
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise BadValue(f"impl {path!r} does not load as a backend: {why}") from None


def _kernel(v: Any) -> str:
    from ..backends.kernels import kernel_names

    names = kernel_names()
    if v == "" or v in names:
        return v
    raise BadValue(f"unknown kernel {v!r}; allowed: '' (the backend's default), {', '.join(names)}")


def _extra_value(v: Any) -> Any:
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
    "ids": _ids,
    "seed": _int(0),
    "compute_us": _float(0.0),
    "hidden": _int(1),
    "stream_priority": _int(hi=0),
    "grid_frac": _float(0.0, 1.0, lo_open=True),
    "sm_limit": _int(0),
    "cache_rows": _int(0),
    "ids_on": _choice(IDS_ON, "ids_on"),
    "gather_threads": _int(0, 256),
    "host_alloc": _choice(HOST_ALLOC_MODES, "host_alloc"),
    "compute": _choice(COMPUTE_KINDS, "compute"),
    "decoder_shape": _choice(tuple(DECODER_SHAPES), "decoder_shape"),
    "decoder_layers": _int(1),
    "context_len": _int(1),
}
# Pseudo-axis: a table size, turned into vocab_size = table_bytes // row_bytes.
PSEUDO_AXES: dict[str, Callable[[Any], Any]] = {"table_bytes": parse_size}
assert set(AXES) | {"extra"} == {f.name for f in dataclasses.fields(Case)}, "AXES out of date with Case"

# Table-defining axes vary slowest, so cases that share a table are adjacent.
_PRODUCT_ORDER = ["impl", "tp", "etp", "dp", "seed", "dtype", "dim", "vocab_size", "table_bytes",
                  "num_heads", "kernel", "cache_rows", "host_alloc", "kind"]
_PRODUCT_ORDER += [a for a in AXES if a not in _PRODUCT_ORDER]

GROUP_META_KEYS = ("name", "description", "tags", "variants", "exclude", "constraints")
SUITE_KEYS = ("description", "notes", "gpu_only", "functional_fallback", "timing")
TOP_KEYS = ("suite", "defaults", "group")

TIMING: dict[str, tuple[Callable[[Any], Any], str]] = {
    "warmup_ms": (_float(0.0), "a number >= 0"),
    "min_samples": (_int(1), "an integer >= 1"),
    "max_samples": (_int(1), "an integer >= 1"),
    "min_time_s": (_float(0.0), "a number >= 0"),
    "max_time_s": (_float(0.0, lo_open=True), "a number > 0"),
    "max_noise": (_float(0.0), "a number >= 0"),
    "cold_l2": (lambda v: _bool(v), "true or false"),
    "hot": (lambda v: _bool(v), "true or false"),
    "graph": (lambda v: _bool(v), "true or false"),
    "throttle_threshold": (_float(0.0, 1.0), "a number in [0, 1]"),
    "id_sets": (_int(1), "an integer >= 1"),
    "remeasure_unstable": (lambda v: _bool(v), "true or false"),
}
# The same keys as ple_bench.measure.TimingPolicy (tests/test_suite.py keeps them in step).


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise BadValue(f"{v!r} is not a boolean")
    return v


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


def _expand(value: Any, conv: Callable[[Any], Any]) -> list[Any]:
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


# ------------------------------------------------------------------ constraints
def _valid_topology(env: dict[str, Any]) -> bool:
    try:
        Topology(env["tp"], env["etp"], env["dp"])
        return True
    except TopologyError:
        return False


def _ngram_heads(env: dict[str, Any]) -> bool:
    try:
        workload.check_ngram_heads(env["ids"], env["num_heads"])
        return True
    except ValueError:
        return False


NAMED_CONSTRAINTS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "valid_topology": _valid_topology,
    "ngram_heads": _ngram_heads,
}
CONSTRAINT_NAMES = sorted(set(AXES) | {"world_size", "replicas", "row_bytes", "table_bytes", "num_ids"})

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_CMPOPS = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
           ast.Gt: operator.gt, ast.GtE: operator.ge,
           ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
_LITERAL_NAMES = {"true": True, "false": False, "True": True, "False": False}


class Constraint:
    """A named constraint or a parsed expression, evaluated on a case's axes."""

    def __init__(self, text: str):
        if not isinstance(text, str):
            raise BadValue(f"{text!r} is not a string")
        self.text = text
        self.named = NAMED_CONSTRAINTS.get(text.strip())
        if self.named is None:
            try:
                self.tree = ast.parse(text.strip(), mode="eval").body
            except SyntaxError:
                raise BadValue(f"cannot parse constraint {text!r}; {self.help()}") from None
            self._check(self.tree)

    @staticmethod
    def help() -> str:
        return (
            f"allowed: a named constraint ({', '.join(NAMED_CONSTRAINTS)}) or an expression over "
            f"{', '.join(CONSTRAINT_NAMES)} with literals, + - * / // % **, comparisons, in, and/or/not"
        )

    def _check(self, node: ast.AST) -> None:
        ok = (ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd, ast.BinOp,
              ast.Compare, ast.Name, ast.Load, ast.Constant, ast.List, ast.Tuple,
              *_BINOPS, *_CMPOPS)
        for sub in ast.walk(node):
            if not isinstance(sub, ok):
                raise BadValue(f"constraint {self.text!r}: {type(sub).__name__} is not allowed; {self.help()}")
            if isinstance(sub, ast.Name) and sub.id not in CONSTRAINT_NAMES and sub.id not in _LITERAL_NAMES:
                raise BadValue(f"constraint {self.text!r}: unknown name {sub.id!r}; {self.help()}")
            if isinstance(sub, ast.Constant) and not isinstance(sub.value, (int, float, str)):
                raise BadValue(f"constraint {self.text!r}: literal {sub.value!r} is not allowed; {self.help()}")

    def __call__(self, env: dict[str, Any]) -> bool:
        if self.named is not None:
            return self.named(env)
        try:
            return bool(self._eval(self.tree, env))
        except (ZeroDivisionError, TypeError, OverflowError) as exc:
            raise BadValue(f"constraint {self.text!r} failed on {_brief(env)}: {exc}") from None

    def _eval(self, node: ast.AST, env: dict[str, Any]) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return _LITERAL_NAMES[node.id] if node.id in _LITERAL_NAMES else env[node.id]
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self._eval(e, env) for e in node.elts]
        if isinstance(node, ast.BoolOp):
            values = (self._eval(v, env) for v in node.values)
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.UnaryOp):
            v = self._eval(node.operand, env)
            return {ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos}[type(node.op)](v)
        if isinstance(node, ast.BinOp):
            left, right = self._eval(node.left, env), self._eval(node.right, env)
            if isinstance(node.op, ast.Pow) and (not isinstance(right, int) or abs(right) > 64):
                raise OverflowError("exponent must be an integer with |exponent| <= 64")
            return _BINOPS[type(node.op)](left, right)
        if isinstance(node, ast.Compare):
            left = self._eval(node.left, env)
            for op, comp in zip(node.ops, node.comparators):
                right = self._eval(comp, env)
                if not _CMPOPS[type(op)](left, right):
                    return False
                left = right
            return True
        raise TypeError(f"unsupported expression {type(node).__name__}")  # unreachable after _check


def _brief(axes: dict[str, Any]) -> str:
    keys = ("kind", "impl", "dtype", "dim", "vocab_size", "num_heads", "num_tokens", "tp", "etp", "dp", "ids")
    return "{" + ", ".join(f"{k}={axes[k]!r}" for k in keys if k in axes) + "}"


# ------------------------------------------------------------------ the parser
class _SuiteParser:
    def __init__(self, path: Path):
        self.path = path

    def fail(self, where: str, message: str) -> SuiteError:
        return SuiteError(f"{self.path}: {where}: {message}" if where else f"{self.path}: {message}")

    def parse(self) -> Suite:
        if tomllib is None:  # pragma: no cover
            raise SuiteError("reading suites needs Python >= 3.11 (tomllib) or the 'tomli' package")
        try:
            data = tomllib.loads(self.path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise self.fail("", f"not valid TOML: {exc}") from None
        except OSError as exc:
            raise self.fail("", f"cannot read: {exc}") from None
        self._unknown_keys(data, TOP_KEYS, "top level", "table")
        meta = data.get("suite")
        if not isinstance(meta, dict):
            raise self.fail("[suite]", "missing [suite] table (with at least description = \"...\")")
        self._unknown_keys(meta, SUITE_KEYS, "[suite]")
        description = meta.get("description")
        if not isinstance(description, str) or not description.strip():
            raise self.fail("[suite]", "key 'description': required, a non-empty string")
        notes = meta.get("notes", "")
        if not isinstance(notes, str):
            raise self.fail("[suite]", "key 'notes': must be a string")
        gpu_only = meta.get("gpu_only", False)
        if not isinstance(gpu_only, bool):
            raise self.fail("[suite]", f"key 'gpu_only': {gpu_only!r}; allowed: true or false")
        fallback = meta.get("functional_fallback")
        if fallback is not None:
            if not isinstance(fallback, str) or fallback == self.path.stem:
                raise self.fail("[suite]", f"key 'functional_fallback': {fallback!r}; allowed: the name of another suite")
            try:
                find_suite(fallback)
            except SuiteError as exc:
                raise self.fail("[suite]", f"key 'functional_fallback': {exc}") from None
        timing = self._timing(meta.get("timing", {}))

        defaults = data.get("defaults", {})
        if not isinstance(defaults, dict):
            raise self.fail("[defaults]", "must be a table of axes")
        default_axes = self._axes_of(defaults, "[defaults]", allow_meta=False)

        groups_raw = data.get("group")
        if not isinstance(groups_raw, list) or not groups_raw:
            raise self.fail("", "no [[group]] tables: a suite needs at least one group of cases")
        cases: dict[str, Case] = {}
        groups: list[SuiteGroup] = []
        for index, raw in enumerate(groups_raw, 1):
            group, group_cases = self._group(index, raw, default_axes)
            # a pinned step's resident baselines join its group (record.Peers needs them)
            for case in with_baselines(group_cases):
                if case.case_id not in cases:
                    cases[case.case_id] = case
                    group.case_ids.append(case.case_id)
            groups.append(group)
        return Suite(
            name=self.path.stem, path=self.path, description=description.strip(),
            cases=list(cases.values()), timing=timing, gpu_only=gpu_only, notes=notes.strip(),
            functional_fallback=fallback, groups=groups,
        )

    def _unknown_keys(self, table: dict, allowed: tuple[str, ...], where: str, what: str = "key") -> None:
        for key in table:
            if key not in allowed:
                raise self.fail(where, f"unknown {what} {key!r}; allowed: {', '.join(allowed)}")

    def _timing(self, timing: Any) -> dict[str, Any]:
        where = "[suite.timing]"
        if not isinstance(timing, dict):
            raise self.fail(where, "must be a table")
        out = {}
        for key, value in timing.items():
            if key not in TIMING:
                raise self.fail(where, f"unknown key {key!r}; allowed: {', '.join(TIMING)}")
            conv, allowed = TIMING[key]
            try:
                out[key] = conv(value)
            except BadValue:
                raise self.fail(where, f"key {key!r}: {value!r}; allowed: {allowed}") from None
        for lo, hi in (("min_samples", "max_samples"), ("min_time_s", "max_time_s")):
            if lo in out and hi in out and out[hi] < out[lo]:
                raise self.fail(where, f"key {hi!r}: {out[hi]!r} is less than {lo} = {out[lo]!r}")
        return out

    def _axes_of(self, table: dict, where: str, allow_meta: bool) -> dict[str, list[Any]]:
        """Axis name -> list of normalised values (``extra.<k>`` flattened)."""
        out: dict[str, list[Any]] = {}
        for key, value in table.items():
            if allow_meta and key in GROUP_META_KEYS:
                continue
            if key == "extra":
                if not isinstance(value, dict):
                    raise self.fail(where, "key 'extra': must be a table of plug-in axes, e.g. extra.block = [64, 128]")
                for sub, subvalue in value.items():
                    out[f"extra.{sub}"] = self._expand(subvalue, _extra_value, where, f"extra.{sub}")
                continue
            conv = AXES.get(key) or PSEUDO_AXES.get(key)
            if conv is None:
                allowed = list(AXES) + list(PSEUDO_AXES) + ["extra.<name>"]
                if allow_meta:
                    allowed += list(GROUP_META_KEYS)
                raise self.fail(where, f"unknown axis {key!r}; allowed: {', '.join(allowed)}")
            out[key] = self._expand(value, conv, where, key)
        if "vocab_size" in out and "table_bytes" in out:
            raise self.fail(where, "keys 'vocab_size' and 'table_bytes' both given; allowed: one of them")
        return out

    def _expand(self, value: Any, conv: Callable[[Any], Any], where: str, key: str) -> list[Any]:
        try:
            return _expand(value, conv)
        except BadValue as exc:
            raise self.fail(where, f"key {key!r}: {exc}") from None

    def _group(self, index: int, raw: Any, default_axes: dict[str, list[Any]]) -> tuple[SuiteGroup, list[Case]]:
        where = f"[[group]] #{index}"
        if not isinstance(raw, dict):
            raise self.fail(where, "must be a table")
        name = raw.get("name", f"group{index}")
        if not isinstance(name, str):
            raise self.fail(where, "key 'name': must be a string")
        where = f"[[group]] #{index} ({name!r})"
        description = raw.get("description", "")
        tags = raw.get("tags", [])
        if not isinstance(description, str):
            raise self.fail(where, "key 'description': must be a string")
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise self.fail(where, "key 'tags': must be a list of strings")
        group = SuiteGroup(name=name, description=description.strip(), tags=list(tags))

        own = self._axes_of(raw, where, allow_meta=True)
        variants = self._variants(raw.get("variants"), where, own)
        size_keys = {"vocab_size", "table_bytes"}
        axes = {k: v for k, v in default_axes.items() if k not in own}
        if own.keys() & size_keys:  # a group's table size replaces the default's, whichever way given
            for key in size_keys:
                axes.pop(key, None)
        axes.update(own)
        excludes = self._excludes(raw.get("exclude", []), where)
        constraints = self._constraints(raw.get("constraints", []), where)

        order = sorted(axes, key=lambda k: _PRODUCT_ORDER.index(k) if k in _PRODUCT_ORDER else len(_PRODUCT_ORDER))
        total = len(variants) * math.prod(len(axes[k]) for k in order)
        if total > MAX_GROUP_PRODUCT:
            raise self.fail(where, f"the product of the axes has {total} cases; allowed: at most {MAX_GROUP_PRODUCT}")

        cases: list[Case] = []
        seen: set[str] = set()
        for variant in variants:
            for combo in itertools.product(*(axes[k] for k in order)):
                assignment = dict(zip(order, combo))
                if variant.keys() & size_keys:
                    for key in size_keys:
                        assignment.pop(key, None)
                assignment.update(variant)  # variants never repeat a group axis: they override defaults
                case = self._make_case(assignment, where, excludes, constraints)
                if case is not None and case.case_id not in seen:
                    seen.add(case.case_id)
                    cases.append(case)
        if not cases:
            raise self.fail(where, "produces zero cases (every case was excluded or failed a constraint)")
        return group, cases

    def _variants(self, raw: Any, where: str, own: dict[str, list[Any]]) -> list[dict[str, Any]]:
        if raw is None:
            return [{}]
        if not isinstance(raw, list) or not raw or not all(isinstance(v, dict) for v in raw):
            raise self.fail(where, "key 'variants': must be a non-empty list of tables of axis values")
        out = []
        for i, table in enumerate(raw, 1):
            variant: dict[str, Any] = {}
            for key, values in self._axes_of(table, f"{where} variants[{i}]", allow_meta=False).items():
                if len(values) != 1:
                    raise self.fail(where, f"variants[{i}] key {key!r}: one value per variant; allowed: a scalar")
                if key in own or (key in ("vocab_size", "table_bytes") and own.keys() & {"vocab_size", "table_bytes"}):
                    raise self.fail(where, f"variants[{i}] key {key!r}: also given as a group axis; allowed: one of them")
                variant[key] = values[0]
            out.append(variant)
        return out

    def _excludes(self, raw: Any, where: str) -> list[dict[str, list[Any]]]:
        if not isinstance(raw, list) or not all(isinstance(e, dict) and e for e in raw):
            raise self.fail(where, "key 'exclude': must be a list of non-empty tables like {impl = \"device\", prefetch = true}")
        return [self._axes_of(entry, f"{where} exclude[{i}]", allow_meta=False) for i, entry in enumerate(raw, 1)]

    def _constraints(self, raw: Any, where: str) -> list[Constraint]:
        if not isinstance(raw, list):
            raise self.fail(where, "key 'constraints': must be a list of strings")
        out = []
        for i, text in enumerate(raw, 1):
            try:
                out.append(Constraint(text))
            except BadValue as exc:
                raise self.fail(where, f"constraints[{i}]: {exc}") from None
        return out

    def _make_case(
        self, assignment: dict[str, Any], where: str,
        excludes: list[dict[str, list[Any]]], constraints: list[Constraint],
    ) -> Case | None:
        axes = {k: v for k, v in assignment.items() if not k.startswith("extra.")}
        extra = {k[len("extra."):]: v for k, v in assignment.items() if k.startswith("extra.")}
        defaults = Case()
        dtype = axes.get("dtype", defaults.dtype)
        dim = axes.get("dim", defaults.dim)
        row_bytes = dim * DTYPE_BYTES[dtype]
        table_bytes = axes.pop("table_bytes", None)
        if table_bytes is not None:
            vocab = table_bytes // row_bytes
            if vocab < 1:
                raise self.fail(where, f"key 'table_bytes': {table_bytes} bytes is less than one row "
                                       f"({row_bytes} bytes for dim={dim} {dtype})")
            axes["vocab_size"] = vocab
        if axes.get("kind", defaults.kind) == "lookup":
            for key in STEP_ONLY_AXES:
                axes.pop(key, None)
        if axes.get("compute", defaults.compute) == "decoder":
            shape = DECODER_SHAPES[axes.get("decoder_shape", defaults.decoder_shape)]
            axes.setdefault("hidden", shape.hidden)  # the shape's; another given is refused in _validate
        else:
            for key in DECODER_AXES:
                axes.pop(key, None)
        full = {f.name: getattr(defaults, f.name) for f in dataclasses.fields(Case) if f.name != "extra"}
        full.update(axes)
        env = dict(full, world_size=full["tp"] * full["dp"], replicas=full["etp"] // full["tp"],
                   row_bytes=row_bytes, table_bytes=full["vocab_size"] * row_bytes,
                   num_ids=full["num_tokens"] * full["num_heads"])
        for entry in excludes:
            if all(self._matches(env, extra, table_bytes, k, vs) for k, vs in entry.items()):
                return None
        for constraint in constraints:
            try:
                if not constraint(env):
                    return None
            except BadValue as exc:
                raise self.fail(where, f"key 'constraints': {exc}") from None
        self._validate(full, where)
        return Case.from_axes(dict(axes, extra=extra))

    @staticmethod
    def _matches(env: dict, extra: dict, table_bytes: int | None, key: str, values: list[Any]) -> bool:
        if key.startswith("extra."):
            return extra.get(key[len("extra."):], object()) in values
        if key == "table_bytes":
            return (table_bytes if table_bytes is not None else env["table_bytes"]) in values
        return env[key] in values

    def _validate(self, axes: dict[str, Any], where: str) -> None:
        case = _brief(axes)
        try:
            Topology(axes["tp"], axes["etp"], axes["dp"])
        except TopologyError as exc:
            raise self.fail(where, f"keys 'tp'/'etp'/'dp': impossible topology in case {case}: {exc} "
                                   "(filter with constraints = [\"valid_topology\"])") from None
        try:
            workload.check_ngram_heads(axes["ids"], axes["num_heads"])
        except ValueError as exc:
            raise self.fail(where, f"keys 'ids'/'num_heads': {exc} (case {case})") from None
        if axes["sm_limit"] and not axes["prefetch"]:
            raise self.fail(where, f"key 'sm_limit': {axes['sm_limit']} limits the prefetch side stream's SMs "
                                   f"and needs prefetch = true; prefetch is off in case {case} "
                                   "(filter with exclude = [{prefetch = false, sm_limit = [...]}])")
        if axes["compute"] == "decoder":
            shape = DECODER_SHAPES[axes["decoder_shape"]]
            if axes["compute_us"]:
                raise self.fail(where, f"key 'compute_us': {axes['compute_us']:g} us asked of compute = 'decoder' in "
                                       f"case {case}; the decoder's time is measured, not targeted (it is set by "
                                       "decoder_layers, context_len and num_tokens): give compute_us only to "
                                       "compute = 'matmul' (filter with exclude = [{compute = \"decoder\", "
                                       "compute_us = [...]}])")
            if axes["hidden"] != shape.hidden:
                raise self.fail(where, f"key 'hidden': {axes['hidden']} in case {case}; compute = 'decoder' takes "
                                       f"decoder_shape {shape.name!r}'s hidden size, {shape.hidden}")
        if axes["vocab_size"] < axes["num_heads"]:
            raise self.fail(where, f"key 'vocab_size': {axes['vocab_size']} rows is fewer than "
                                   f"num_heads={axes['num_heads']}; every head needs rows (case {case})")
