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
    repeat = { processes = 4, rounds = 3 }  # optional: measure the group's cases (and their resident
                                            # baselines) in 4 fresh worker processes, 3 randomized
                                            # rounds each (ple_bench.run.replicate); with
                                            # target_pct = 2.5 and most = 8 the processes are chosen
                                            # from this machine's variance components (its profile)

Axes are exactly the fields of :class:`ple_bench.spec.case.Case` (kind, impl, kernel,
vocab_size, dim, dtype, num_heads, num_tokens, tp, etp, dp, prefetch, graph, ids,
seed, compute_us, hidden, stream_priority, grid_frac, sm_limit, h2d_background, cache_rows, ids_on,
gather_threads, host_alloc, compute, decoder_shape, decoder_layers, context_len, model, kv_dtype,
gpu_memory_utilization, batch_fraction), plus
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
* ``h2d_background`` (steps; true/false, default false): every measurement of the
  step runs with a host→device copy kept busy beside it on a stream of its own (the
  copy engine and the link shared, as a server's KV swaps or weight streams share
  them; :mod:`ple_bench.measure.background`); the record says the rate that copy got
  (``background_h2d_gbps``).  CUDA only: skipped elsewhere.
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
  :mod:`ple_bench.backends.cuda.host_alloc`.  A backend whose table is not in host
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
* ``kind = "serve"``: a model's whole decode step (:mod:`ple_bench.run.serve`) at
  ``round(max batch x batch_fraction)`` sequences of ``context_len`` tokens, the
  max batch from the capacity rule (:mod:`ple_bench.serving.capacity`) for the
  placement the ``impl`` gives (``device``: the table in HBM; ``pinned_host_flag``:
  in pinned host memory) with ``gpu_memory_utilization`` (default 0.90) of the
  GPU; ``model`` is a preset ("qwen3-8b", "qwen3-32b", "tiny"), ``kv_dtype``
  "bf16" or "fp8" (fp8 is skipped with the capacity rule's prediction: no kernel
  reads it).  The axes the step sets itself (``num_tokens``, ``graph``,
  ``prefetch``, ``ids_on``, the compute axes) are reset on serve cases; the serve
  axes are reset on other kinds.
* For ``kind = "lookup"`` the step-only axes (``compute_us``, ``hidden``, and
  the compute axes) are reset to their defaults (so a mixed group does not repeat a lookup per compute
  time); cases that become equal, within or across groups, are kept once.

Every remaining case is then checked (topology via
:class:`ple_bench.parallel.Topology`, n-gram heads, vocab >= heads, ...).  Any
problem raises :class:`SuiteError` with one message naming the file, the place
(group, key) and what is allowed.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


from .. import workload
from ..compute import DECODER_SHAPES
from ..parallel import Topology, TopologyError
from ..units import DTYPE_BYTES, BadValue, tomllib
from .axes import AXES, PRODUCT_ORDER, PSEUDO_AXES, STEP_ONLY_AXES, TIMING, extra_value
from .case import DECODER_AXES, SERVE_AXES, SERVE_DERIVED_AXES, Case, with_baselines
from .constraints import Constraint, brief
from .expand import expand

SUITES_ENV = "PLE_BENCH_SUITES_DIR"
REPO_SUITES_DIR = Path(__file__).resolve().parents[2] / "suites"

MAX_GROUP_PRODUCT = 200_000


class SuiteError(ValueError):
    """A suite file that cannot be loaded; the message names file, key and what is allowed."""


# ------------------------------------------------------------------ data
@dataclass
class SuiteGroup:
    name: str
    description: str = ""
    tags: list[str] = field(default_factory=list)
    case_ids: list[str] = field(default_factory=list)  # cases first produced by this group
    #: (processes, rounds): the group's cases are measured in that many fresh worker processes,
    #: that many randomized rounds in each (``repeat``; None: once, in the run's worker)
    repeat: tuple[int, int] | None = None
    #: the cases ``repeat`` applies to: the group's own and their resident baselines, also where
    #: another group produced them first (a pinned step and its baseline are measured together)
    repeated_ids: list[str] = field(default_factory=list)
    #: ``repeat.target_pct``: the 95 % half-width (% of the ratio) the processes are chosen for, from the
    #: variance components this machine's profile holds for the group's cases; ``repeat.most``: at most
    repeat_target_pct: float | None = None
    repeat_most: int | None = None


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

    def repeat_of(self, case_id: str) -> tuple[int, int] | None:
        """(processes, rounds) of the first group holding ``case_id`` that repeats its cases."""
        for group in self.groups:
            if group.repeat and case_id in group.repeated_ids:
                return group.repeat
        return None

    def repeat_group(self, case_id: str) -> SuiteGroup | None:
        """The first group holding ``case_id`` that repeats its cases."""
        for group in self.groups:
            if group.repeat and case_id in group.repeated_ids:
                return group
        return None

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


GROUP_META_KEYS = ("name", "description", "tags", "variants", "exclude", "constraints", "repeat")
#: the keys of a group's ``repeat`` table, their bounds
REPEAT_KEYS = {"processes": (1, 64), "rounds": (1, 64)}
#: the optional keys that choose the processes from measured variance: the target half-width, the most
REPEAT_CHOICE_KEYS = {"target_pct": (0.1, 50.0), "most": (2, 64)}
SUITE_KEYS = ("description", "notes", "gpu_only", "functional_fallback", "timing")
TOP_KEYS = ("suite", "defaults", "group")


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
            if group.repeat:
                group.repeated_ids = [c.case_id for c in with_baselines(group_cases)]
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
                    out[f"extra.{sub}"] = self._expand(subvalue, extra_value, where, f"extra.{sub}")
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
            return expand(value, conv)
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
        group = SuiteGroup(name=name, description=description.strip(), tags=list(tags),
                           repeat=self._repeat(raw.get("repeat"), where))
        if group.repeat:
            group.repeat_target_pct, group.repeat_most = self._repeat_choice(raw["repeat"], where, group.repeat[0])

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

        order = sorted(axes, key=lambda k: PRODUCT_ORDER.index(k) if k in PRODUCT_ORDER else len(PRODUCT_ORDER))
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

    def _repeat(self, raw: Any, where: str) -> tuple[int, int] | None:
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise self.fail(where, "key 'repeat': must be a table, e.g. repeat = { processes = 4, rounds = 3 }")
        for key in raw:
            if key not in REPEAT_KEYS and key not in REPEAT_CHOICE_KEYS:
                raise self.fail(where, f"key 'repeat.{key}': unknown; allowed: "
                                       f"{', '.join([*REPEAT_KEYS, *REPEAT_CHOICE_KEYS])}")
        out = []
        for key, (lo, hi) in REPEAT_KEYS.items():
            value = raw.get(key, 1)
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise self.fail(where, f"key 'repeat.{key}': {value!r}; allowed: an integer in [{lo}, {hi}]")
            out.append(value)
        return (out[0], out[1])

    def _repeat_choice(self, raw: dict, where: str, processes: int) -> tuple[float | None, int | None]:
        target, most = raw.get("target_pct"), raw.get("most")
        lo, hi = REPEAT_CHOICE_KEYS["target_pct"]
        if target is not None and (isinstance(target, bool) or not isinstance(target, (int, float))
                                   or not lo <= target <= hi):
            raise self.fail(where, f"key 'repeat.target_pct': {target!r}; allowed: a number in [{lo}, {hi}]")
        lo, hi = REPEAT_CHOICE_KEYS["most"]
        if most is not None and (isinstance(most, bool) or not isinstance(most, int) or not lo <= most <= hi):
            raise self.fail(where, f"key 'repeat.most': {most!r}; allowed: an integer in [{lo}, {hi}]")
        if most is not None and target is None:
            raise self.fail(where, "key 'repeat.most': given without 'repeat.target_pct' (the most processes a "
                                   "target may ask for)")
        if target is not None and most is not None and most < processes:
            raise self.fail(where, f"key 'repeat.most': {most} is less than repeat.processes = {processes}")
        return (float(target) if target is not None else None,
                (most if most is not None else max(processes, 8)) if target is not None else None)

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
        kind = axes.get("kind", defaults.kind)
        if kind != "serve":
            for key in SERVE_AXES:
                axes.pop(key, None)
        if kind == "lookup":
            for key in STEP_ONLY_AXES:
                axes.pop(key, None)
        if kind == "serve":  # the batch is the capacity rule's, the path the placement's
            for key in SERVE_DERIVED_AXES:
                axes.pop(key, None)
        elif axes.get("compute", defaults.compute) == "decoder":
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
        case = brief(axes)
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
