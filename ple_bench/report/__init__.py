"""Reports and comparisons of stored runs (never measures).

- :func:`build_report` (html.py): ``reports/<run folder name>/index.html``, self-contained; its command
  line is ``ple_bench.commands.report``.
- :func:`compare_runs` (compare/): baseline vs candidate runs (one or several a side), threshold + Mann-Whitney U;
  its command line is ``ple_bench.commands.compare``.
- findings.py: plain-word findings; plots.py: matplotlib (Agg) PNGs inlined as base64;
  data.py: tolerant loading of run directories and grouping helpers; export.py: a run's summaries.
"""

from __future__ import annotations

from .compare import CaseComparison, CompareResult, compare_runs, write_compare_html
from .html import build_report, write_report

__all__ = ["CaseComparison", "CompareResult", "build_report", "compare_runs", "write_compare_html", "write_report"]
