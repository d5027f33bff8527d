"""Reports and comparisons of stored runs (never measures).

- :func:`build_report` (html.py): ``reports/<run folder name>/index.html``, self-contained.
- :func:`compare_runs` (compare.py): baseline vs candidate runs (one or several a side), threshold + Mann-Whitney U.
- findings.py: plain-word findings; plots.py: matplotlib (Agg) PNGs inlined as base64;
  data.py: tolerant loading of run directories and grouping helpers.

Imports are lazy so that ``import ple_bench.report`` stays cheap for the CLI.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "build_report": "html", "add_report_args": "html", "run_report": "html", "report_main": "html",
    "compare_runs": "compare", "CompareResult": "compare", "CaseComparison": "compare",
    "add_compare_args": "compare", "run_compare": "compare", "compare_main": "compare",
    "write_compare_html": "compare",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        module = importlib.import_module(f".{_EXPORTS[name]}", __name__)
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
