"""Machine-readable exports of a stored run, built from its records alone.

* ``results/<run_id>/verdict.json``: the one verdict (:mod:`ple_bench.report.verdict`), per
  table, compute, id distribution and token count;
* ``results/<run_id>/summary.md``: the verdict first (as the report's banner says it), then one markdown table row per case — the axes that vary in the
  run as columns, then time ms, noise %, GB/s, % of ceiling, status — for a pull request or a
  chat (as nvbench's and asv's markdown summaries);
* ``results/<run_id>/summary.csv``: every record's main fields (:data:`SUMMARY_FIELDS`), one
  row per record, written by pandas;
* ``results/<run_id>/pytest-benchmark.json``, in pytest-benchmark's JSON format, so its tooling
  (``pytest-benchmark compare``, github-action-benchmark ``tool: pytest``, dashboards that read
  ``--benchmark-json`` files) can read ple_bench results.

The pytest-benchmark document:
``results/<run_id>/pytest-benchmark.json``: ``machine_info``, ``commit_info``,
``benchmarks`` (one per *ok* record: ``group``, ``name``, ``fullname``,
``params``, ``param``, ``extra_info``, ``options``, ``stats``), ``datetime``,
``version``.  Times are in **seconds** as pytest-benchmark stores them; every
sample is one round of one iteration.  Built from the stored records alone.

CLI: ``python -m ple_bench.report.export RUN_DIR [--out PATH]`` (all three; ``--out``: the JSON's path).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
from bisect import bisect_left, bisect_right
from pathlib import Path
from typing import Any, Sequence

from ..record import keys_for
from ..serving.slo import SUMMARY_HEADERS, serving_verdict
from ..spec.case import Case
from .data import (
    ALL_AXES, BadRunError, Run, axis_value, fmt, fmt_bytes, load_run, samples_of, topology_label,
)
from ..verdict import compute_label, headline, verdicts, write_verdict_json

# Scalar record fields carried along in each benchmark's extra_info: the schema's
# (ple_bench/record.py) scalar measurement fields, lookups' and steps'.
_NOT_EXTRA = {"schema_version", "case_id", "status", "reason", "traceback", "finished_at", "host_alloc_note",
              "graph_break_cost_note", "upgraded_from"}
EXTRA_KEYS = tuple(k for k in dict.fromkeys(keys_for("lookup", scalar=True) + keys_for("step", scalar=True))
                   if k not in _NOT_EXTRA)
PYTEST_BENCHMARK_VERSION_FALLBACK = "5.2.3"


def _quartiles(data: Sequence[float]) -> tuple[float, float]:
    """q1, q3 exactly as pytest-benchmark's Stats computes them (so its tools agree with ours)."""
    s = sorted(data)
    n = len(s)
    if n == 1:
        return s[0], s[0]
    if n % 2:  # method 3
        k, q = n // 4, n % 4
        if q == 1:
            return 0.25 * s[k - 1] + 0.75 * s[k], 0.75 * s[3 * k] + 0.25 * s[3 * k + 1]
        return 0.75 * s[k] + 0.25 * s[k + 1], 0.25 * s[3 * k + 1] + 0.75 * s[3 * k + 2]
    return statistics.median(s[: n // 2]), statistics.median(s[n // 2:])


def benchmark_stats(samples_s: Sequence[float]) -> dict[str, Any]:
    """pytest-benchmark's ``stats`` dict of per-round times in seconds (one iteration per round)."""
    data = [float(v) for v in samples_s]
    if not data:
        raise ValueError("no samples")
    s = sorted(data)
    n = len(data)
    mean = statistics.fmean(data)
    stddev = statistics.stdev(data) if n > 1 else 0.0
    q1, q3 = _quartiles(data)
    iqr = q3 - q1
    lo, hi = q1 - 1.5 * iqr, q3 + 1.5 * iqr
    iqr_outliers = sum(1 for v in data if v < lo or v > hi)
    stddev_outliers = sum(1 for v in data if v < mean - stddev or v > mean + stddev)
    total = math.fsum(data)
    return {
        "min": s[0], "max": s[-1], "mean": mean, "stddev": stddev, "rounds": n,
        "median": statistics.median(data), "iqr": iqr, "q1": q1, "q3": q3,
        "iqr_outliers": iqr_outliers, "stddev_outliers": stddev_outliers,
        "outliers": f"{stddev_outliers};{iqr_outliers}",
        "ld15iqr": s[0] if n == 1 else s[bisect_left(s, lo)],
        "hd15iqr": s[0] if n == 1 else s[bisect_right(s, hi) - 1],
        "ops": n / total if total else 0.0, "total": total, "data": data, "iterations": 1,
    }


def _machine_info(run: Run) -> dict[str, Any]:
    m = run.meta
    device = m.get("device") if isinstance(m.get("device"), dict) else {"name": m.get("device")}
    python = str(m.get("python") or "")
    host = m.get("host")
    node = (host.get("hostname") or "") if isinstance(host, dict) else (host or "")
    platform = host.get("platform", "") if isinstance(host, dict) else ""
    return {
        # pytest-benchmark's own keys, from what the run stored (not from this machine).
        "node": str(node), "processor": "", "machine": "", "python_compiler": "", "platform": platform,
        "python_implementation": "CPython", "python_implementation_version": python,
        "python_version": python, "python_build": [], "release": "", "system": "", "cpu": {},
        # ple_bench's own: the GPU and software the run measured.
        "gpu": device or {}, "torch": m.get("torch"), "triton": m.get("triton"),
        "ceilings_gbps": m.get("ceilings") or {}, "mode": run.mode, "timer": m.get("timer"),
        "ple_bench_run_id": run.run_id, "ple_bench_suite": run.suite,
    }


def _commit_info(run: Run) -> dict[str, Any]:
    m = run.meta
    return {
        "id": m.get("git_commit") or "unknown", "time": m.get("git_commit_time"), "author_time": None,
        "dirty": bool(m.get("git_dirty", False)), "project": "ple_bench",
        "branch": m.get("git_branch") or "(unknown)",
    }


def to_pytest_benchmark(run: Run) -> dict[str, Any]:
    """The pytest-benchmark JSON document of a run (ok records with samples only)."""
    try:
        from pytest_benchmark import __version__ as pb_version  # optional: the version it writes for
    except ImportError:  # the export does not need pytest-benchmark installed
        pb_version = PYTEST_BENCHMARK_VERSION_FALLBACK
    benchmarks = []
    for r in sorted(run.ok, key=lambda r: str(r.get("case_id"))):
        samples = samples_of(r)
        if not samples:
            continue
        params = {a: r.get(a) for a in ALL_AXES if a in r}
        extra = {k: r.get(k) for k in EXTRA_KEYS if r.get(k) is not None}
        extra["status"] = r.get("status")
        cid = str(r.get("case_id"))
        benchmarks.append({
            "group": f"{r.get('kind') or 'lookup'}.{r.get('impl') or '?'}",
            "name": cid,
            "fullname": f"ple_bench/{run.suite}::{cid}",
            "params": params,
            "param": cid,
            "extra_info": extra,
            "options": {"disable_gc": False, "timer": str(r.get("timer") or run.meta.get("timer") or "unknown"),
                        "min_rounds": len(samples), "max_time": None, "min_time": None, "warmup": None},
            "stats": benchmark_stats([v / 1e3 for v in samples]),
        })
    return {
        "machine_info": _machine_info(run),
        "commit_info": _commit_info(run),
        "benchmarks": benchmarks,
        "datetime": run.meta.get("ended_at") or run.meta.get("started_at") or "",
        "version": pb_version,
    }


def write_pytest_benchmark_json(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write ``<run_dir>/pytest-benchmark.json`` (or ``out``); returns its path."""
    run = load_run(run_dir)
    doc = to_pytest_benchmark(run)
    path = Path(out) if out else Path(run_dir) / "pytest-benchmark.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=False, default=str), encoding="utf-8")
    os.replace(tmp, path)
    return path


# ------------------------------------------------------------------ summaries

# A case's axes: the fields of :class:`ple_bench.spec.case.Case` (their one definition).
CASE_AXES = tuple(f.name for f in dataclasses.fields(Case))
# The main fields of a record, as summary.csv has them (record fields, plus the report's ``path``
# and ``topology`` labels); the axes come after case_id and status.
SUMMARY_FIELDS = ("case_id", "status", "path", *CASE_AXES, "topology", "table_bytes",
                  "row_bytes", "rows", "median_ms", "p10_ms", "p90_ms", "cv", "noise", "n_samples", "gbps",
                  "rows_per_s", "pct_of_ceiling", "ceiling", "step_ms", "lookup_ms", "compute_ms", "exposed_ms",
                  "overlap_efficiency", "offload_overhead", "mode", "timer", "reason")


def summary_frame(run: Run):
    """The run's records as a DataFrame of :data:`SUMMARY_FIELDS` (a field no record has is left out)."""
    import pandas as pd  # pandas: heavy, only the summary tables

    rows = [{**r, "topology": topology_label(r)} for r in run.records]
    df = pd.DataFrame.from_records(rows)
    return df[[f for f in SUMMARY_FIELDS if f in df.columns and df[f].notna().any()]]


def summary_axes(run: Run) -> list[str]:
    """The axes that vary in the run, as summary.md's first columns: ``path`` for impl and kernel,
    the table's size (``table_bytes``) for vocab_size, ``topology`` for tp / etp / dp."""
    out: list[str] = []
    for axis in (a for a in CASE_AXES if len({repr(axis_value(r, a)) for r in run.records}) > 1):
        name = {"impl": "path", "kernel": "path", "vocab_size": "table_bytes", "tp": "topology",
                "etp": "topology", "dp": "topology"}.get(axis, axis)
        if name not in out:
            out.append(name)
    return out


_MD_HEADERS = {"path": "path (impl · kernel)", "table_bytes": "table", "num_tokens": "tokens", "num_heads": "heads",
               "compute_us": "compute µs"}


def _md_cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def summary_markdown(run: Run) -> str:
    """summary.md: a heading naming the run, then one row per record, in the order they were run."""
    axes = summary_axes(run)
    headers = [_MD_HEADERS.get(a, a) for a in axes] + ["time ms", "noise %", "GB/s", "% of ceiling", "status"]
    serving = serving_markdown(run)
    lines = [f"# ple_bench run {run.run_id}", ""] + serving
    if not serving or run.functional or verdicts(run.records):  # as the report: a serving run leads alone
        lines += ["## Verdict", ""] + verdict_markdown(run) + [""]
    lines += ["## Cases", "",
             f"suite `{run.suite}`, mode {run.mode}, {len(run.records)} records; time: the median "
             "(a step's: the step; a repeated case's: the mean over its processes); noise: the half-width of the "
             "95 % confidence interval, % of the time (a repeated case's: over its processes, else within one); "
             "GB/s and % of ceiling: lookups only (`pct_of_ceiling`, against the record's `ceiling`).", "",
             "| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for r in run.records:
        cells = []
        for a in axes:
            if a == "table_bytes":
                cells.append(fmt_bytes(r.get("table_bytes")))
            elif a == "topology":
                cells.append(topology_label(r))
            else:
                v = r.get(a)
                cells.append("" if v is None else str(v) if isinstance(v, str) else fmt(v, 3))
        noise = r.noise
        if r.ci_low_ms is not None and r.ci_high_ms is not None and r.median_ms:
            noise = (r.ci_high_ms - r.ci_low_ms) / 2 / r.median_ms  # a repeated case: over its processes
        pct = r.pct_of_ceiling
        status = str(r.get("status"))
        if status != "ok" and r.get("reason"):
            status += f": {r['reason']}"
        cells += [fmt(r.median_ms, 3), "" if noise is None else fmt(noise * 100, 2),
                  fmt(r.gbps, 3), "" if pct is None else f"{pct:.0f}", status]
        lines.append("| " + " | ".join(_md_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def serving_markdown(run: Run) -> list[str]:
    """summary.md's lead when the run has serve records: the serving verdict's sentences and its
    table (host beside HBM), as the report shows them; [] otherwise."""
    answers = serving_verdict(run.records)
    if not answers:
        return []
    lines = ["## What the placement buys", ""] + [f"- {a.sentence()}" for a in answers] + [""]
    lines += ["| " + " | ".join(SUMMARY_HEADERS) + " |", "|" + "|".join("---" for _ in SUMMARY_HEADERS) + "|"]
    lines += ["| " + " | ".join(_md_cell(c) for c in a.summary_cells()) + " |" for a in answers]
    return lines + [""]


def verdict_markdown(run: Run) -> list[str]:
    """summary.md's verdict: the headline, then one row per (table, compute, ids, tokens) with the
    pinned and the resident figure it compares (their case ids: the HBM figure may be the full
    graph inside a breakable record)."""
    entries = verdicts(run.records)
    lines = [headline(entries, run.functional)]
    if not entries:
        return lines
    headers = ["table", "compute", "ids", "tokens", "verdict", "pinned / HBM (95 % CI)", "pinned step", "ms",
               "HBM step", "ms"]
    lines += ["", "| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for e in entries:
        if e.ratio is None:
            cells = [fmt_bytes(e.table_bytes), compute_label(e.compute), e.ids, str(e.num_tokens), e.verdict,
                     e.reason or "", "", "", "", ""]
        else:
            cells = [fmt_bytes(e.table_bytes), compute_label(e.compute), e.ids, str(e.num_tokens), e.verdict,
                     e.ratio_text, f"{e.pinned_case_id} ({e.path})", f"{e.pinned_ms:.4f}",
                     f"{e.resident_case_id} ({e.resident_graph} graph, {e.timer})", f"{e.resident_ms:.4f}"]
        lines.append("| " + " | ".join(_md_cell(c) for c in cells) + " |")
    return lines


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_summaries(run_dir: str | Path) -> list[Path]:
    """Write ``<run_dir>/summary.md`` and ``<run_dir>/summary.csv``; returns their paths."""
    run = load_run(run_dir)
    md, csv = Path(run_dir) / "summary.md", Path(run_dir) / "summary.csv"
    _write_text(md, summary_markdown(run))
    _write_text(csv, summary_frame(run).to_csv(index=False))
    return [md, csv]


def write_exports(run_dir: str | Path) -> list[Path]:
    """Every export of a run beside its records: verdict.json, summary.md, summary.csv,
    pytest-benchmark.json."""
    verdict = write_verdict_json(run_dir, load_run(run_dir).records)
    return [verdict] + write_summaries(run_dir) + [write_pytest_benchmark_json(run_dir)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ple_bench.report.export",
                                     description="write a run's summary.md, summary.csv and pytest-benchmark JSON")
    parser.add_argument("run_dir")
    parser.add_argument("--out", default=None, help="default: RUN_DIR/pytest-benchmark.json")
    args = parser.parse_args(argv)
    try:
        for path in write_summaries(args.run_dir) + [write_pytest_benchmark_json(args.run_dir, args.out)]:
            print(path)
    except BadRunError as exc:
        print(f"ple_bench export: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
