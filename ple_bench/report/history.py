"""The history of a results directory, as asv draws it: each case's run median over the ordered runs.

``scripts/nightly.sh`` keeps every run it makes under its results directory (each a
``meta.json`` + ``records.jsonl``, never rewritten) and the accepted baseline as a directory
of symlinks to some of them (``results/baseline``).  :func:`load_history` reads the runs of
one suite there, oldest first (:func:`ple_bench.report.data.run_order_key`), and gives each
case its run medians (:func:`ple_bench.report.data.run_median`: throttle-filtered, the
observation the run-median compare tests); :func:`write_history_html` draws one matplotlib
PNG per case -- x: the runs in order, labelled with the commit's short hash, y: the run
median, the baseline runs' range shaded -- into one self-contained HTML page (the PNGs
inlined as the report's plots are, :func:`ple_bench.report.plots.figure_uri`).

CLI: ``python -m ple_bench compare --history RESULTS_DIR [BASE...] [--suite S]
[--history-last N] [--out PATH]`` (the baseline is the positional runs, else
``RESULTS_DIR/baseline`` when it exists).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from .data import BadRunError, Run, case_label, load_run, run_median, run_order_key
from .html import render_page

BASELINE_DIR = "baseline"  # nightly.sh's default baseline: RESULTS_DIR/baseline/<run_id> -> ../<run_id>


@dataclass
class CaseHistory:
    case_id: str
    label: str
    medians: list[float | None]  # one per run of the history (None: not measured ok in that run)
    baseline: list[float] = field(default_factory=list)  # the baseline runs' medians of this case
    plot_uri: str = ""

    @property
    def band(self) -> tuple[float, float] | None:
        """The baseline runs' range (lowest, highest run median)."""
        return (min(self.baseline), max(self.baseline)) if self.baseline else None


@dataclass
class History:
    results_dir: Path
    suite: str
    runs: list[Run]
    baseline_ids: list[str]
    cases: list[CaseHistory]

    @property
    def commits(self) -> list[str]:
        return [short_commit(r) for r in self.runs]


def short_commit(run: Run) -> str:
    """The run's commit as a short hash (``-dirty`` kept as ``*``), or ``?`` when the run has none."""
    commit = run.meta.git_commit or ""
    if not commit:
        return "?"
    dirty = commit.endswith("-dirty")
    return commit.removesuffix("-dirty")[:7] + ("*" if dirty else "")


def _runs_in(results_dir: Path) -> list[Run]:
    """Every run directory in ``results_dir`` (a symlink counts as the run it points at, once)."""
    runs, seen = [], set()
    for p in sorted(results_dir.iterdir()):
        if not (p / "meta.json").is_file():
            continue
        real = p.resolve()
        if real in seen:
            continue
        seen.add(real)
        try:
            runs.append(load_run(real))
        except BadRunError:
            continue
    return runs


def load_history(results_dir: str | Path, baseline_dirs: Sequence[str | Path] | None = None,
                 suite: str | None = None, last: int = 0) -> History:
    """The runs of one suite in ``results_dir``, oldest first, and each case's run medians.

    ``baseline_dirs``: the baseline runs (default: the runs linked from ``results_dir/baseline``);
    ``suite``: default the baseline's suite, else the newest run's; ``last``: only the newest N runs.
    Raises :class:`BadRunError` when there is nothing to draw."""

    root = Path(results_dir)
    if not root.is_dir():
        raise BadRunError(f"{root}: no such results directory")
    if baseline_dirs is None:
        linked = root / BASELINE_DIR
        baseline_dirs = ([linked] if (linked / "meta.json").is_file()
                         else sorted(p for p in linked.iterdir() if (p / "meta.json").is_file())
                         if linked.is_dir() else [])
    baseline = [load_run(d) for d in baseline_dirs]
    runs = _runs_in(root)
    if not runs:
        raise BadRunError(f"{root}: no runs (no directory with a meta.json)")
    if suite is None:
        suite = baseline[0].suite if baseline else max(runs, key=run_order_key).suite
    runs = sorted((r for r in runs if r.suite == suite), key=run_order_key)
    if last > 0:
        runs = runs[-last:]
    if not runs:
        raise BadRunError(f"{root}: no runs of suite {suite!r}")
    medians: dict[str, list[float | None]] = {}
    labels: dict[str, str] = {}
    for i, run in enumerate(runs):
        for rec in run.ok:
            cid = str(rec["case_id"])
            medians.setdefault(cid, [None] * len(runs))[i] = run_median(rec)
            labels[cid] = case_label(rec)
    cases = []
    for cid in sorted(medians):
        band = [m for m in (run_median(r) for b in baseline for r in b.ok if r.get("case_id") == cid)
                if m is not None]
        cases.append(CaseHistory(case_id=cid, label=labels[cid], medians=medians[cid], baseline=band))
    return History(results_dir=root, suite=suite, runs=runs, baseline_ids=[b.run_id for b in baseline],
                   cases=cases)


def plot_case(history: History, case: CaseHistory) -> str:
    """One case's run medians over the runs (a data: URI of a PNG)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # matplotlib: only a page with plots
    from matplotlib.figure import Figure  # (heavy, imported when drawn)

    from .plots import finish_axes, figure_uri  # plots imports matplotlib

    fig = Figure(figsize=(9, 3.0), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    xs = [i for i, m in enumerate(case.medians) if m is not None]
    ys = [case.medians[i] for i in xs]
    ax.plot(xs, ys, marker="o", markersize=4, color="C0", label="run median")
    in_base = [i for i in xs if history.runs[i].run_id in history.baseline_ids]
    if in_base:
        ax.plot(in_base, [case.medians[i] for i in in_base], "s", color="C2", markersize=7, fillstyle="none",
                label="baseline run")
    if case.band:
        lo, hi = case.band
        ax.axhspan(lo, hi, color="C2", alpha=0.18, label="baseline range")
    n = len(history.runs)
    step = max(1, n // 30)  # at most ~30 labels
    ticks = list(range(0, n, step))
    ax.set_xticks(ticks, [history.commits[i] for i in ticks], rotation=45, ha="right", fontsize=7)
    ax.set_xlim(-0.5, n - 0.5)
    ax.set_title(f"{case.case_id}\n{case.label}", fontsize=9)
    finish_axes(ax, "commit (runs oldest to newest)", "run median ms")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return figure_uri(fig)


def write_history_html(history: History, out: str | Path) -> Path:
    for case in history.cases:
        case.plot_uri = plot_case(history, case)
    html = render_page("history.html", history=history, commits=history.commits,
                       run_ids=[r.run_id for r in history.runs])
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html, encoding="utf-8")
    return out


def run_history(args: argparse.Namespace) -> int:
    """``compare --history RESULTS_DIR``: write the history page; 2 on bad input."""
    if args.vs is not None:
        print("ple_bench compare: --history draws the runs kept in RESULTS_DIR; it takes no --vs "
              "(the positional runs are the baseline)", file=sys.stderr)
        return 2
    try:
        history = load_history(args.history, baseline_dirs=list(args.runs) or None, suite=args.suite,
                               last=args.history_last)
    except BadRunError as exc:
        print(f"ple_bench compare: {exc}", file=sys.stderr)
        return 2
    out = args.out or Path(args.reports_dir) / f"history-{history.suite}.html"
    try:
        path = write_history_html(history, out)
    except OSError as exc:
        print(f"ple_bench compare: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    print(f"history of {len(history.cases)} cases over {len(history.runs)} runs of suite {history.suite} "
          f"(baseline: {', '.join(history.baseline_ids) or 'none'}): {path}")
    return 0


__all__ = ["History", "CaseHistory", "load_history", "write_history_html", "short_commit", "run_history"]
