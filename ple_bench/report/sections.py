"""Side-by-side views of a run, shared by findings, plots and the HTML page.

Owns two comparisons:

* **lookup paths**: single-GPU lookups grouped by *workload* (every
  case axis except the ones that pick the path: impl, kernel, cache_rows), one
  record per path (``impl · kernel``, see :func:`data.path_label`), with GB/s
  and rows/s as shares of the ceilings stored in ``meta.json``;
* **serving**: ``kind=serve`` records as the serving verdict reads them
  (:func:`serving_answers`: :func:`ple_bench.serving.slo.serving_verdict`), and the served steps
  themselves (:func:`served_steps`);
* **decode-step overlap**: ``kind=step`` records at the
  Qwen4Exp-like decode shape (fp8, dim 160, 16 heads) when the run has it,
  labelled by path, prefetch, graph mode, stream priority, grid share and
  SM limit.

Nothing here measures or formats prose; see findings.py for the words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..record import Record, as_record
from ..serving.slo import ServingAnswer, serving_verdict
from .data import (
    AXES, REFERENCE_PATH, Run, axis_value, fmt, fmt_bytes, is_number, key_of, order_key, single_rank,
)

# Axes that choose the lookup path rather than the work; everything else defines a workload.
PATH_AXES = ("impl", "kernel", "cache_rows", "grid_frac", "sm_limit")
WORKLOAD_AXES = tuple(a for a in AXES if a not in PATH_AXES)
DECODE_SHAPE = {"dtype": "fp8", "dim": 160, "num_heads": 16}


def serving_answers(run: Run, tpot_ms: float | None = None) -> list[ServingAnswer]:
    """The serving verdict of every scenario of the run's serve records ([] when it has none)."""
    return serving_verdict(run.records, tpot_ms)


def served_steps(run: Run) -> list[dict[str, Any]]:
    """The run's serve records (ok and not), by model, context, KV dtype, placement, batch."""
    return sorted((r for r in run.records if r.get("kind") == "serve"),
                  key=lambda r: (str(r.get("model")), str(r.get("kv_dtype")), r.table_bytes or 0,
                                 r.context_len or 0, str(r.get("placement")),
                                 r.serve_batch or 0))


def path_of(record: dict[str, Any]) -> str:
    return str(axis_value(record, "path"))


def lookups(run: Run) -> list[dict[str, Any]]:
    """Measured single-GPU lookups with a median time."""
    return [r for r in run.ok if (r.get("kind") or "lookup") == "lookup" and single_rank(r)
            and r.median_ms]


def hit_rate(record: dict[str, Any]) -> float | None:
    """The hot cache's hit rate (0..1) when the record stores one (top level, typed, or in the
    record's ``extra``: the JSON object it is)."""
    record = as_record(record)
    extra = record.extra if isinstance(record.extra, dict) else {}
    for src in (record, extra):
        for key in ("hit_rate", "cache_hit_rate", "last_hit_rate"):
            v = src.get(key)
            if is_number(v):
                return v / 100.0 if v > 1.0 else float(v)
    return None


def workload_label(record: Mapping[str, Any], *, with_shape: bool = True) -> str:
    record = as_record(record)
    parts = []
    rb = record.row_bytes
    if with_shape:
        parts.append(f"{record.get('dtype')} {int(rb)} B rows" if rb else str(record.get("dtype")))
    if record.table_bytes is not None:
        parts.append(f"{fmt_bytes(record['table_bytes'])} table")
    tokens, heads = record.num_tokens, record.num_heads
    if tokens is not None:
        parts.append(f"{int(tokens)} tokens" + (f" × {int(heads)} heads" if heads and heads > 1 else ""))
    if record.get("ids"):
        parts.append(f"{record['ids']} ids")
    if record.get("graph") not in (None, "", "eager"):
        parts.append(f"graph {record['graph']}")
    if record.get("prefetch"):
        parts.append("prefetch")
    return ", ".join(parts)


@dataclass
class PathGroup:
    """One workload measured on several paths; ``records`` fastest first."""

    key: tuple
    label: str
    records: list[Record]

    @property
    def fastest(self) -> Record:
        return self.records[0]

    @property
    def reference(self) -> Record | None:
        return next((r for r in self.records if path_of(r) == REFERENCE_PATH), None)

    @property
    def paths(self) -> list[str]:
        return [path_of(r) for r in self.records]


def path_groups(run: Run, min_paths: int = 2) -> list[PathGroup]:
    """Workloads measured on at least ``min_paths`` paths.  A path measured twice
    at one workload (kernel "" and its default named) counts once: the record
    that names its kernel is kept."""
    by_key: dict[tuple, dict[str, dict[str, Any]]] = {}
    for r in lookups(run):
        paths = by_key.setdefault(key_of(r, WORKLOAD_AXES), {})
        p = path_of(r)
        if p not in paths or (r.get("kernel") and not paths[p].get("kernel")):
            paths[p] = r
    groups = []
    for key, paths in by_key.items():
        if len(paths) < min_paths:
            continue
        recs = sorted(paths.values(), key=lambda r: r.median_ms)
        groups.append(PathGroup(key=key, label=workload_label(recs[0]), records=recs))
    groups.sort(key=lambda g: tuple(order_key(axis_value(g.fastest, a)) for a in
                                    ("dtype", "row_bytes", "num_tokens", "table_bytes", "ids", "graph", "prefetch")))
    return groups


# ------------------------------------------------------------- decode steps

def steps(run: Run) -> list[dict[str, Any]]:
    return [r for r in run.ok if r.get("kind") == "step" and single_rank(r)]


def decode_steps(run: Run) -> tuple[list[dict[str, Any]], str]:
    """Step records at the decode shape (fp8, dim 160, 16 heads) and a text naming
    the shape; all single-GPU steps (and "") when the run has none at that shape."""
    all_steps = steps(run)
    at_shape = [r for r in all_steps if all(axis_value(r, k) == v for k, v in DECODE_SHAPE.items())]
    if at_shape:
        return at_shape, "fp8, dim 160, 16 heads"
    return all_steps, ""


def step_config_axes(records: Sequence[dict[str, Any]], with_table: bool = False) -> list[str]:
    """Axes besides path that name a step configuration (only those that vary); ``with_table``:
    the table size too (``vocab_size``, labelled by its bytes), so that plots and tables never
    merge steps of different tables into one line."""
    out = ["prefetch"]
    for axis in ("graph", "ids_on", "stream_priority", "grid_frac", "sm_limit", "ids", "cache_rows") + (
            ("vocab_size",) if with_table else ()):
        if len({axis_value(r, axis) for r in records}) > 1:
            out.append(axis)
    return out


def step_config_label(record: dict[str, Any], axes: Sequence[str]) -> str:
    parts = [path_of(record)]
    for axis in axes:
        v = axis_value(record, axis)
        if axis == "prefetch":
            parts.append("prefetch" if v else "no prefetch")
        elif axis == "graph":
            parts.append(f"graph {v}" if v not in (None, "") else "")
        elif axis == "stream_priority":
            parts.append(f"prio {fmt(v)}")
        elif axis == "grid_frac":
            parts.append(f"grid {fmt(v)}")
        elif axis == "ids_on":
            parts.append(f"ids on {v or 'device'}")
        elif axis == "sm_limit":
            parts.append(f"{fmt(v)} SMs" if v else "all SMs")
        elif axis == "vocab_size":
            parts.append(fmt_bytes(record.get("table_bytes")) + " table")
        else:
            parts.append(f"{axis}={fmt(v) if not isinstance(v, str) else v}")
    return ", ".join(p for p in parts if p)


__all__ = [
    "PATH_AXES", "WORKLOAD_AXES", "DECODE_SHAPE", "PathGroup", "path_groups", "path_of", "lookups", "hit_rate",
    "workload_label", "steps", "decode_steps", "step_config_axes", "step_config_label",
]
