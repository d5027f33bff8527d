"""Export of a stored run in pytest-benchmark's JSON format, so its tooling
(``pytest-benchmark compare``, github-action-benchmark ``tool: pytest``,
dashboards that read ``--benchmark-json`` files) can read ple_bench results.

``results/<run_id>/pytest-benchmark.json``: ``machine_info``, ``commit_info``,
``benchmarks`` (one per *ok* record: ``group``, ``name``, ``fullname``,
``params``, ``param``, ``extra_info``, ``options``, ``stats``), ``datetime``,
``version``.  Times are in **seconds** as pytest-benchmark stores them; every
sample is one round of one iteration.  Built from the stored records alone.

CLI: ``python -m ple_bench.export RUN_DIR [--out PATH]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from bisect import bisect_left, bisect_right
from pathlib import Path
from typing import Any, Sequence

from .record import keys_for
from .report.data import ALL_AXES, BadRunError, Run, load_run, samples_of

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
        from pytest_benchmark import __version__ as pb_version
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ple_bench.export",
                                     description="write a run's records in pytest-benchmark JSON format")
    parser.add_argument("run_dir")
    parser.add_argument("--out", default=None, help="default: RUN_DIR/pytest-benchmark.json")
    args = parser.parse_args(argv)
    try:
        print(write_pytest_benchmark_json(args.run_dir, args.out))
    except BadRunError as exc:
        print(f"ple_bench export: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
