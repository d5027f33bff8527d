"""The HTML report of one run: ``reports/<run folder name>/index.html``.

Built from the stored records alone (never measures): run metadata and
ceilings, findings in plain words, inline PNG plots, an optional trend over
earlier runs, the full sortable/filterable record table and the cases that
were not measured with their reasons.  The page is self-contained (CSS, JS and
images inline) and opens from disk with no network.

Its command line (``python -m ple_bench report RUN_DIR ...``) is :mod:`ple_bench.commands.report`.
"""

from __future__ import annotations

import datetime as _dt
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .. import __version__
from .data import (
    ALL_AXES, BadRunError, Run, fmt, fmt_bytes, is_number, load_run, run_order_key, safe_name, status_counts,
    topology_label,
)
from .findings import GROUP_TITLES, findings, key_findings, pct_of_ceiling
from ..serving.slo import SUMMARY_HEADERS
from .sections import decode_steps, hit_rate, path_groups, path_of, serving_answers, served_steps, step_config_axes
from ..verdict import EQUAL_PCT, entry_text, first_scope, headline, scope_label, verdicts

TEMPLATES = Path(__file__).with_name("templates")
STATUS_ORDER = ("ok", "skipped", "failed", "invalid")


def _env():
    import jinja2  # imported here: the CLI imports this module just to build its parser

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=jinja2.select_autoescape(["html"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render_page(template: str, **context: Any) -> str:
    """Render one of our templates with the shared CSS/JS inlined."""
    css = (TEMPLATES / "style.css").read_text(encoding="utf-8")
    js = (TEMPLATES / "table.js").read_text(encoding="utf-8")
    if "</script" in js.lower() or "</style" in css.lower():
        raise ValueError("inline JS/CSS must not close its own tag")
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return _env().get_template(template).render(css=css, js=js, version=__version__, generated_at=now,
                                                 **context)


# ---------------------------------------------------------------- table model

@dataclass
class Column:
    key: str
    header: str
    type: str = "num"  # num | text
    help: str = ""
    getter: Any = None  # record -> raw value (default: record[key])
    formatter: Any = None  # raw -> text
    cls: str = ""

    def raw(self, record: dict[str, Any]) -> Any:
        return self.getter(record) if self.getter else record.get(self.key)

    def cell(self, record: dict[str, Any]) -> dict[str, Any]:
        value = self.raw(record)
        if isinstance(value, (list, dict, tuple)):
            value = ", ".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else str(value)
        text = self.formatter(value) if self.formatter else fmt(value)
        if self.type == "num":
            return {"text": text, "v": repr(float(value)) if is_number(value) else None,
                    "cls": ("num " + self.cls).strip()}
        return {"text": text, "v": None, "cls": self.cls}


def _status_cell(record: dict[str, Any]) -> dict[str, Any]:
    return {"text": str(record.get("status")), "v": None, "cls": f"status status-{record.get('status')}"}


def record_columns(records: Sequence[dict[str, Any]]) -> list[Column]:
    """The record table's columns; a column that is empty for every record is left out."""
    cols = [
        Column("status", "status", "text"),
        Column("case_id", "case", "text"),
        Column("kind", "kind", "text"),
        Column("impl", "backend", "text"),
        Column("dtype", "dtype", "text"),
        Column("table_bytes", "table", formatter=fmt_bytes),
        Column("num_tokens", "tokens"),
        Column("topology", "topology", "text", getter=topology_label),
        Column("prefetch", "prefetch", "text"),
        Column("compute_us", "compute µs"),
        Column("median_ms", "median ms", help="median of the samples"),
        Column("p10_ms", "p10 ms"),
        Column("p90_ms", "p90 ms"),
        Column("cv", "CV", help="coefficient of variation of the samples"),
        Column("gbps", "GB/s"),
        Column("pct_of_ceiling", "% of ceiling", getter=pct_of_ceiling),
        Column("ceiling", "ceiling", "text"),
        Column("rows_per_s", "rows/s"),
        Column("step_ms", "step ms"),
        Column("lookup_ms", "lookup ms"),
        Column("compute_ms", "compute ms"),
        Column("exposed_ms", "exposed ms"),
        Column("overlap_efficiency", "overlap eff."),
        Column("compute_slowdown", "compute slowdown"),
        Column("offload_overhead", "offload overhead"),
        Column("graph_break_cost_ms", "graph break cost ms"),
        Column("gather_ms", "gather ms"),
        Column("reduce_ms", "reduce ms"),
        Column("rank_spread_ms", "rank spread ms"),
        Column("hot_median_ms", "hot ms", help="warm-L2 median"),
        Column("graph_median_ms", "graph ms", help="CUDA-graph replay median"),
        Column("n_samples", "samples", getter=lambda r: r.get("n_samples") if r.get("n_samples") is not None
               else (len(r["samples_ms"]) if isinstance(r.get("samples_ms"), list) and r["samples_ms"] else None)),
        Column("throttled_samples", "throttled"),
        Column("kernel", "kernel", "text"),
        Column("vocab_size", "rows in table"),
        Column("dim", "dim"),
        Column("row_bytes", "row B"),
        Column("num_heads", "heads"),
        Column("graph", "graph", "text"),
        Column("ids", "ids", "text"),
        Column("cache_rows", "cache rows"),
        Column("host_alloc", "host alloc", "text", help="how the pinned table was allocated (torch | exact | exact_huge)"),
        Column("pinned_bytes", "pinned", formatter=fmt_bytes, help="bytes pinned for the table (this rank)"),
        Column("table_alloc_s", "alloc s", help="seconds to allocate and pin the table"),
        Column("table_fill_s", "fill s", help="seconds to fill the table"),
        Column("grid_frac", "grid frac"),
        Column("sm_limit", "SM limit", help="SMs the prefetch side stream may use (green context); 0 = all"),
        Column("sm_limit_granted", "SMs granted", help="SMs the driver gave the green context (rounded up)"),
        Column("stream_priority", "stream prio"),
        Column("hidden", "hidden"),
        Column("seed", "seed"),
        Column("extra", "extra", "text"),
        Column("timer", "timer", "text"),
        Column("reason", "reason", "text", cls="wrap"),
    ]
    always = {"status", "case_id"}

    def present(c: Column) -> bool:
        for r in records:
            v = c.raw(r)
            if v not in (None, "", {}, [], ()):
                return True
        return False

    return [c for c in cols if c.key in always or present(c)]


def table_rows(columns: Sequence[Column], records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in records:
        cells = [_status_cell(r) if c.key == "status" else c.cell(r) for c in columns]
        rows.append({"status": str(r.get("status")), "cells": cells})
    return rows


def _sorted_records(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    def key(r: dict[str, Any]) -> tuple:
        s = str(r.get("status"))
        return (STATUS_ORDER.index(s) if s in STATUS_ORDER else 9, str(r.get("kind")), str(r.get("impl")),
                str(r.get("case_id")))
    return sorted(records, key=key)


# ------------------------------------------------------- side-by-side tables

def _pct(v: float | None) -> str:
    return "" if v is None else f"{v:.0f}%"


def _times(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}×"


def _share(spec: str) -> Any:
    """A formatter of a fraction as a percentage (``spec``: its format, e.g. ``+.1f``)."""
    return lambda v: "" if v is None else f"{v * 100:{spec}}%"


def _fixed(spec: str) -> Any:
    """A formatter of a number in the format ``spec`` (``.2f``), or ``fmt``'s 4 digits (``""``)."""
    return lambda v: "" if v is None else (f"{v:{spec}}" if spec else fmt(v, 4))


def path_table(run: Run) -> tuple[list[Column], list[dict[str, Any]]]:
    """Every lookup path at each workload measured on two or more paths, with
    GB/s and rows/s as shares of the stored ceilings and the time ratios."""
    rows: list[dict[str, Any]] = []
    for g in path_groups(run):
        t0 = g.fastest.median_ms
        ref = g.reference
        for r in g.records:
            t = r.median_ms
            row = {"workload": g.label, "table_bytes": r.get("table_bytes"), "path": path_of(r),
                   "cache_rows": r.get("cache_rows") or None,
                   "median_ms": t, "vs_fastest": t / t0, "status": "ok",
                   "vs_reference": t / ref.median_ms if ref is not None else None,
                   "gbps": r.get("gbps"), "rows_per_s": r.get("rows_per_s"), "hit_rate": hit_rate(r),
                   "host_thread_ms": r.get("host_thread_ms"), "case_id": r.get("case_id"),
                   "pct_of_ceiling": pct_of_ceiling(r), "ceiling": r.get("ceiling")}
            rows.append(row)
    cols = [
        Column("workload", "workload", "text"),
        Column("table_bytes", "table", formatter=fmt_bytes, help="bytes of the whole table"),
        Column("path", "path (impl · kernel)", "text"),
        Column("cache_rows", "cache rows"),
        Column("median_ms", "median ms"),
        Column("vs_fastest", "× fastest's time", formatter=_times, help="time / the fastest path's time here"),
        Column("vs_reference", "× reference time", formatter=_times,
               help="time / pinned_uva · triton_reference's time at this workload"),
        Column("rows_per_s", "rows/s"),
        Column("gbps", "GB/s"),
        Column("pct_of_ceiling", "% of ceiling", formatter=_pct,
               help="the record's pct_of_ceiling: GB/s against the ceiling that binds this path (next column)"),
        Column("ceiling", "ceiling", "text", help="the ceiling the record is held against (record schema)"),
        Column("hit_rate", "hit rate", formatter=_share(".1f")),
        Column("host_thread_ms", "host-thread CPU ms",
               help="CPU time of the path's own host threads per lookup (0: the path uses none)"),
        Column("case_id", "case", "text"),
    ]
    sizes = {r["table_bytes"] for r in rows}  # table rows: plain dicts of the report, of typed values
    cols = [c for c in cols if c.key in ("workload", "path") or (c.key == "table_bytes" and len(sizes) > 1)
            or (c.key != "table_bytes" and any(c.raw(r) not in (None, "") for r in rows))]
    return cols, table_rows(cols, rows)


def step_table(run: Run) -> tuple[list[Column], list[dict[str, Any]], str]:
    recs, shape = decode_steps(run)
    recs = sorted(recs, key=lambda r: (r.table_bytes or 0, r.num_tokens or 0, path_of(r),
                                       not r.get("prefetch"),
                                       str(r.get("graph")), r.stream_priority or 0,
                                       r.grid_frac or 1.0, r.sm_limit or 0,
                                       r.compute_us or 0))
    axes = step_config_axes(recs, with_table=True)
    cols = [
        Column("table_bytes", "table", formatter=fmt_bytes, help="bytes of the whole table"),
        Column("num_tokens", "tokens"),
        Column("path", "path (impl · kernel)", "text", getter=path_of),
        Column("prefetch", "prefetch", "text"),
        Column("graph", "graph", "text"),
        Column("stream_priority", "stream prio"),
        Column("grid_frac", "grid frac"),
        Column("sm_limit", "SM limit", help="SMs the prefetch side stream may use (green context); 0 = all"),
        Column("sm_limit_granted", "SMs granted", help="SMs the driver gave the green context (rounded up)"),
        Column("ids", "ids", "text"),
        Column("compute_us", "compute µs"),
        Column("step_ms", "step ms"),
        Column("lookup_ms", "lookup ms", help="the lookup alone"),
        Column("compute_ms", "compute ms"),
        Column("exposed_ms", "exposed ms", help="lookup time not hidden behind compute"),
        Column("overlap_efficiency", "overlap eff.", formatter=_share(".0f"),
               help="1 - exposed / exposed of the same step without prefetch (record overlap_twin); "
                    "negative: the prefetch made the step slower"),
        Column("compute_slowdown", "compute slowdown", formatter=_share("+.0f"),
               help="in-step compute / compute alone - 1"),
        Column("offload_baseline_ms", "HBM step ms",
               help="the resident step a server would run instead (ids on the device, same workload, its "
                    "fastest graph mode, this step's timer): record offload_baseline"),
        Column("offload_overhead", "vs HBM", formatter=_share("+.1f"),
               help="step ms / HBM step ms - 1"),
        Column("offload_overhead_same_graph", "vs HBM same graph", formatter=_share("+.1f"),
               help="against the resident step in this step's own graph mode (the graph break's cost apart)"),
        Column("timer", "timer", "text"),
        Column("graph_break_cost_ms", "graph break cost ms"),
        Column("case_id", "case", "text"),
    ]
    keep = {"num_tokens", "path", "prefetch", "compute_us"} | set(axes) | (
        {"table_bytes"} if "vocab_size" in axes else set())
    cols = [c for c in cols if c.key in keep or (c.key not in ("graph", "stream_priority", "grid_frac",
                                                                 "sm_limit", "ids", "table_bytes")
                                                   and any(c.raw(r) not in (None, "") for r in recs))]
    return cols, table_rows(cols, recs), shape


def serve_table(run: Run) -> tuple[list[Column], list[dict[str, Any]]]:
    """The served steps, one row per serve record (the serving answer's per-step detail)."""
    recs = served_steps(run)
    ms = _fixed("")
    cols = [
        Column("status", "status", "text"),
        Column("model", "model", "text"),
        Column("context_len", "context"),
        Column("kv_dtype", "KV", "text"),
        Column("table_bytes", "table", formatter=fmt_bytes),
        Column("placement", "placement", "text"),
        Column("impl", "path", "text"),
        Column("serve_batch", "sequences", help="sequences in the step = tokens per step"),
        Column("batch_fraction", "of largest", formatter=_fixed(".2f")),
        Column("max_batch", "largest batch", help="the capacity rule's largest batch for this placement"),
        Column("step_ms", "step ms", formatter=ms, help="median whole decode step"),
        Column("tpot_ms", "TPOT ms", formatter=ms, help="one token per sequence per step: the step"),
        Column("tokens_per_s", "tokens/s", help="serve_batch / step"),
        Column("cv", "CV"),
        Column("kv_bytes", "KV cache", formatter=fmt_bytes),
        Column("hbm_bytes_used", "HBM used", formatter=fmt_bytes, help="torch max allocated in the case"),
        Column("kv_source", "KV", "text", help="measured, or predicted (fp8 KV without a kernel)"),
        Column("timer", "timer", "text"),
        Column("case_id", "case", "text"),
        Column("reason", "reason", "text", cls="wrap"),
    ]
    cols = [c for c in cols if c.key in ("status", "placement", "serve_batch")
            or any(c.raw(r) not in (None, "") for r in recs)]
    return cols, table_rows(cols, recs)


def serving_view(run: Run) -> dict[str, Any] | None:
    """What the report leads with when the run has serve records: the answers (their sentences and
    one table of host beside HBM), the plot, the per-step detail; None without serve records."""
    answers = serving_answers(run)
    if not answers:
        return None
    from .plots_serving import plot_serving  # matplotlib: only a page with plots

    cols, rows = serve_table(run)
    return {"answers": answers, "headers": SUMMARY_HEADERS, "plot": plot_serving(run, answers), "columns": cols,
            "rows": rows}


# ----------------------------------------------------------------- metadata

def meta_rows(run: Run) -> list[tuple[str, str]]:
    m = run.meta
    device = m.get("device") if isinstance(m.get("device"), dict) else {"name": m.get("device")}
    rows: list[tuple[str, str]] = [
        ("run id", run.run_id), ("suite", run.suite), ("status", m.status or "unknown"),
        ("mode", run.mode), ("timer", m.timer or _record_value(run, "timer") or "unknown"),
    ]
    for key, value in sorted((device or {}).items(), key=lambda kv: (kv[0] != "name", kv[0])):
        if value is None:
            continue
        label = "device" if key == "name" else f"device {key.replace('_', ' ')}"
        rows.append((label, _value_text(key, value)))
    for key in ("torch", "triton", "python", "git_commit", "host", "started_at", "ended_at"):
        value = m.get(key)
        if value in (None, "", {}):
            continue
        rows.append((key.replace("_", " "), _value_text(key, value)))
    if m.get("argv"):
        argv = m["argv"]
        rows.append(("command", " ".join(map(str, argv)) if isinstance(argv, list) else str(argv)))
    known = {"run_id", "suite", "status", "mode", "timer", "device", "torch", "triton", "python", "git_commit",
             "host", "started_at", "ended_at", "argv", "ceilings"}
    for key in sorted(set(m) - known):
        value = m[key]
        if value in (None, "", {}, []):
            continue
        rows.append((key.replace("_", " "), _value_text(key, value)))
    return rows


def _value_text(key: str, value: Any) -> str:
    """A stored value as a person reads it: numbers to 3 significant figures (bytes in KiB/MiB/GiB),
    an object as ``key: value`` pairs, a list joined by commas."""
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_value_text(str(k), v)}" for k, v in value.items() if v not in (None, ""))
    if isinstance(value, (list, tuple)):
        return ", ".join(_value_text(key, v) for v in value)
    if not is_number(value):
        return fmt(value) if isinstance(value, bool) else str(value)
    return fmt_bytes(value) if str(key).endswith("bytes") else fmt(value, 3)


# ----------------------------------------------------------------- ceilings

# How a ceiling's field is headed in the report's tables (unit once, in the header).
_CEILING_HEADERS = {"gbps": "GB/s", "ms": "ms", "warm_ms": "warm ms", "torch_ms": "index_select ms",
                    "row_loop_ms": "row loop ms", "rows_per_s": "M rows/s", "table_bytes": "table",
                    "row_bytes": "row B", "num_heads": "heads", "id_sets": "id sets", "cold_l2": "cold L2",
                    "host_alloc": "host alloc", "warm_repeats": "warm repeats"}


def _sig3(v: Any) -> str:
    return fmt(v, 3)


def _millions(v: Any) -> str:
    """A rows/s figure in millions; "" for none (a per-case ceiling's entry is JSON as stored: a
    field that is no number shows nothing, as before)."""
    return fmt(v / 1e6, 3) if is_number(v) else ""


def machine_ceilings(run: Run) -> tuple[list[Column], list[dict[str, Any]], list[str]]:
    """The run's machine-wide ceilings as one table (GB/s, and rows/s where measured: the entry of
    the same name with ``rows_per_s`` for ``gbps``), and the other scalar facts stored beside them
    as short texts (how long the ceilings took, their timer)."""
    rows = []
    for name, gbps in sorted(run.ceilings.items()):
        rate = run.ceiling_value(name.replace("gbps", "rows_per_s"))
        rows.append({"status": "", "name": name, "gbps": gbps, "rows_per_s": rate})
    cols = [Column("name", "ceiling", "text"), Column("gbps", "GB/s", formatter=_sig3),
            Column("rows_per_s", "M rows/s", formatter=_millions)]
    if not any(r["rows_per_s"] is not None for r in rows):
        cols = cols[:2]
    shown = {r["name"] for r in rows} | {r["name"].replace("gbps", "rows_per_s") for r in rows if r["rows_per_s"]}
    notes = [f"{k}: {_value_text(k, v)}" for k, v in sorted(run.ceiling_notes.items())
             if k not in shown and not isinstance(v, dict)]
    return cols, table_rows(cols, rows), notes


@dataclass
class CeilingTable:
    name: str  # the meta.json ceilings entry (random_row, host_gather)
    columns: list[Column]
    rows: list[dict[str, Any]]


def per_case_ceilings(run: Run) -> list[CeilingTable]:
    """Each per-case ceiling family of meta.json (an object of objects: ``random_row``,
    ``host_gather``) as a table: one row per entry, its key first, the entry's fields as columns
    (3 significant figures, bytes as KiB/MiB/GiB)."""
    raw = run.meta.get("ceilings") if isinstance(run.meta.get("ceilings"), dict) else {}
    out = []
    for name, entries in sorted(raw.items()):
        if not isinstance(entries, dict) or not entries or not all(isinstance(e, dict) for e in entries.values()):
            continue
        fields: dict[str, None] = {}
        for key, entry in entries.items():
            for f, v in entry.items():
                if not (f == "key" and v == key):
                    fields.setdefault(f, None)
        cols = [Column("key", "key", "text")]
        for f in fields:
            values = [e.get(f) for e in entries.values() if e.get(f) is not None]
            numeric = bool(values) and all(is_number(v) for v in values)
            header = _CEILING_HEADERS.get(f, f.replace("_", " "))
            formatter = (fmt_bytes if f.endswith("bytes") else _millions if f.endswith("rows_per_s")
                         else _sig3 if numeric else None)
            cols.append(Column(f, header, "num" if numeric else "text", formatter=formatter))
        rows = [dict(entry, key=key, status="") for key, entry in entries.items()]
        out.append(CeilingTable(name, cols, table_rows(cols, rows)))
    return out


def run_line(run: Run) -> str:
    """One line on the run for the top of its Run section: device, software, commit, when, how."""
    m = run.meta
    parts = [_device_name(run)]
    for label, key in (("torch", "torch"), ("triton", "triton"), ("commit", "git_commit")):
        if m.get(key):
            value = str(m[key])
            parts.append(f"{label} {value[:12] + value[40:] if key == 'git_commit' else value}")
    when = " → ".join(str(m[k]) for k in ("started_at", "ended_at") if m.get(k))
    if when:
        parts.append(when)
    if isinstance(m.get("argv"), list):
        parts.append(" ".join(map(str, m["argv"][1:])))
    return " · ".join(parts)


def _record_value(run: Run, key: str) -> Any:
    values = {r.get(key) for r in run.records if r.get(key)}
    return ", ".join(sorted(map(str, values))) if values else None


def _device_name(run: Run) -> str:
    device = run.meta.device
    return device.name or "unknown device" if device is not None else "unknown device"


# -------------------------------------------------------------------- trend

@dataclass
class Trend:
    runs: list[Run]
    plot: Any
    columns: list[Column]
    rows: list[dict[str, Any]]
    skipped: list[str] = field(default_factory=list)


def key_cases(runs: Sequence[Run], current: Run, limit: int = 8) -> list[str]:
    """Cases of the current run seen ok in at least one other run: one per
    (kind, backend, dtype, prefetch), the largest table first, then others."""
    seen: dict[str, int] = {}
    for run in runs:
        for r in run.ok:
            seen[r["case_id"]] = seen.get(r["case_id"], 0) + 1
    candidates = [r for r in current.ok if seen.get(r["case_id"], 0) >= 2 and r.median_ms]
    candidates.sort(key=lambda r: (-seen[r["case_id"]], -(r.table_bytes or 0),
                                   -(r.num_tokens or 0), r["case_id"]))
    chosen, groups = [], set()
    for r in candidates:
        g = (r.get("kind"), r.get("impl"), r.get("dtype"), bool(r.get("prefetch")), topology_label(r))
        if g not in groups:
            groups.add(g)
            chosen.append(r["case_id"])
    for r in candidates:
        if r["case_id"] not in chosen:
            chosen.append(r["case_id"])
    return chosen[:limit]


def build_trend(current: Run, history_dirs: Sequence[str | Path]) -> Trend | None:
    runs: dict[str, Run] = {current.run_id: current}
    skipped = []
    for d in history_dirs:
        try:
            run = load_run(d)
        except BadRunError as exc:
            skipped.append(str(exc))
            continue
        runs.setdefault(run.run_id, run)
    ordered = sorted(runs.values(), key=run_order_key)
    if len(ordered) < 2:
        return None
    cases = key_cases(ordered, current)
    columns = [Column("case_id", "case", "text")]
    for i, run in enumerate(ordered):
        columns.append(Column(f"run{i}", run.run_id, help=f"median ms, {run.started_at}"))
    columns.append(Column("change", "last vs previous", formatter=lambda v: "" if v is None else f"{v:+.1f}%"))
    rows = []
    for cid in cases:
        rec: dict[str, Any] = {"case_id": cid, "status": None}
        values = []
        for i, run in enumerate(ordered):
            r = next((x for x in run.ok if x.get("case_id") == cid), None)
            rec[f"run{i}"] = r.median_ms if r else None
            if rec[f"run{i}"] is not None:
                values.append(rec[f"run{i}"])
        rec["change"] = (values[-1] / values[-2] - 1) * 100 if len(values) >= 2 and values[-2] else None
        rows.append({"status": "", "cells": [c.cell(rec) for c in columns]})
    from .plots import plot_trend  # plots imports matplotlib: only a page with plots

    return Trend(runs=ordered, plot=plot_trend(ordered, cases), columns=columns, rows=rows, skipped=skipped)


# ------------------------------------------------------------------- report

MAX_KEY_PLOTS = 3


def key_plots(plots: Sequence[Any]) -> list[Any]:
    """The plots that carry the verdict, shown right under it (at most three), the first one in the
    first screen: step time per path vs tokens with the resident baseline (the verdict's own
    comparison), else the row rate vs table size with its ceilings; then lookup time vs tokens
    where the run has no steps; exposed time vs compute per path at the largest token count
    measured."""
    by_key = {p.key: p for p in plots}
    steps = sorted((p for p in plots if p.key.startswith("step_overlap_t")),
                   key=lambda p: int(p.key.rsplit("_t", 1)[1]))
    chosen = [by_key.get("step_vs_tokens"), by_key.get("bandwidth_vs_table_bytes"),
              None if by_key.get("step_vs_tokens") else by_key.get("latency_vs_tokens"),
              steps[-1] if steps else None]
    return [p for p in chosen if p is not None][:MAX_KEY_PLOTS]


def build_report(run_dir: str | Path, reports_dir: str | Path = "reports",
                 history_dirs: Sequence[str | Path] | None = None) -> Path:
    """Write ``<reports_dir>/<run folder's name>/index.html`` for a stored run (:func:`report_dir`);
    returns its path."""
    return write_report(load_run(run_dir), reports_dir, history_dirs)


def write_report(run: Run, reports_dir: str | Path = "reports",
                 history_dirs: Sequence[str | Path] | None = None) -> Path:
    """:func:`build_report` of a loaded run (the caller reads its lost lines and records too)."""
    from .gallery import make_plots  # the plots import matplotlib: only a page with plots

    records = _sorted_records(run.records)
    columns = record_columns(records)
    not_measured = [r for r in records if r.get("status") != "ok"]
    nm_columns = [c for c in record_columns(not_measured)
                  if c.key in ("status", "case_id", "kind", "impl", "kernel", "dtype", "table_bytes", "dim",
                               "num_tokens", "topology", "prefetch", "graph", "ids", "reason")]
    counts = status_counts(run.records)
    ceiling_cols, ceiling_rows, ceiling_notes = machine_ceilings(run)
    trend = build_trend(run, history_dirs) if history_dirs else None
    all_findings = findings(run)
    entries = verdicts(run.records)  # the one verdict (report/verdict.py), as every screen prints it
    answer = first_scope(entries)
    other_verdicts = [f"{scope_label(e.table_bytes, e.compute, e.ids)}: {entry_text(e)}"
                      for e in entries if e not in answer]
    finding_groups = [(GROUP_TITLES[g], [f for f in all_findings if f.group == g])
                      for g in GROUP_TITLES if any(f.group == g for f in all_findings)]
    plots = make_plots(run)
    top = key_plots(plots)
    plots = [p for p in plots if p not in top]
    path_cols, path_rows = path_table(run)
    step_cols, step_rows, step_shape = step_table(run)
    serving = serving_view(run)
    html = render_page(
        "report.html",
        run=run, device_name=_device_name(run), timer=_record_value(run, "timer") or run.meta.timer or "?",
        counts=counts, n_records=len(records), run_status=run.meta.status or "unknown",
        findings=all_findings, finding_groups=finding_groups, meta_rows=meta_rows(run), run_line=run_line(run),
        ceiling_columns=ceiling_cols, ceiling_rows=ceiling_rows, ceiling_notes=ceiling_notes,
        case_ceilings=per_case_ceilings(run),
        headline=headline(entries, run.functional), answer=answer, other_verdicts=other_verdicts,
        equal_pct=EQUAL_PCT, key_plots=top, key_findings=key_findings(all_findings), n_findings=len(all_findings),
        plots=[p for p in plots if p.section == "general"],
        path_plots=[p for p in plots if p.section == "paths"], path_columns=path_cols, path_rows=path_rows,
        step_plots=[p for p in plots if p.section == "overlap"], step_columns=step_cols, step_rows=step_rows,
        step_shape=step_shape,
        trend=trend, columns=columns, rows=table_rows(columns, records), serving=serving,
        statuses=[s for s in counts if counts[s]],
        not_measured=not_measured, nm_columns=nm_columns, nm_rows=table_rows(nm_columns, not_measured),
        nm_statuses=[s for s in ("skipped", "failed", "invalid") if counts.get(s)],
        n_not_reached=sum(map(len, run.not_reached.values())),
        resume_command=shlex.join(["python", "-m", "ple_bench", "run", "--resume", str(run.path)]),
    )
    out_dir = report_dir(run.path, reports_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / SOURCE_FILE).write_text(str(run.path.resolve()) + "\n", encoding="utf-8")
    out = out_dir / "index.html"
    tmp = out.with_suffix(".html.tmp")
    tmp.write_text(html, encoding="utf-8")
    os.replace(tmp, out)
    return out


#: beside a report: the run folder it was built from (a second folder of the same name is refused)
SOURCE_FILE = "run_dir.txt"


def report_dir(run_dir: str | Path, reports_dir: str | Path) -> Path:
    """Where the report of ``run_dir`` goes: ``<reports_dir>/<the run folder's name>``, named after
    the folder (not meta.json's run_id, which a copy shares).  A report there built from another
    folder of the same name is not overwritten: :class:`BadRunError`."""
    run_dir = Path(run_dir).resolve()
    out_dir = Path(reports_dir) / safe_name(run_dir.name)
    source = out_dir / SOURCE_FILE
    if source.is_file():
        other = source.read_text(encoding="utf-8").strip()
        if other and Path(other) != run_dir:
            raise BadRunError(f"{out_dir} holds the report of {other}, another run folder of the same name: "
                              f"give this one ({run_dir}) its own --reports-dir")
    return out_dir


def history_runs(run_dir: str | Path, last: int) -> list[Path]:
    """The ``last`` runs of the same suite stored beside ``run_dir`` (excluding it), oldest first."""
    run_dir = Path(run_dir)
    try:
        suite = load_run(run_dir).suite
    except BadRunError:
        return []
    found, seen = [], {run_dir.resolve()}
    for p in sorted(run_dir.resolve().parent.iterdir()):
        real = p.resolve()  # a baseline symlink is the run it points at
        if real in seen or not (p / "meta.json").is_file():
            continue
        seen.add(real)
        try:
            run = load_run(real)
        except BadRunError:
            continue
        if run.suite == suite:
            found.append(run)
    found.sort(key=run_order_key)
    return [r.path for r in found[-last:]] if last > 0 else []


__all__ = ["build_report", "write_report", "render_page", "ALL_AXES"]
