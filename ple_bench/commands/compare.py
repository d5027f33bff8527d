"""``compare``: compare stored runs; exit 1 on a significant regression (or a broken case), 2 on bad
input.  Its flags (:func:`add_compare_args`) and the verb (:func:`run_compare`): the statistics,
the matching and the writers are :mod:`ple_bench.report.compare`'s, the history page
:mod:`ple_bench.report.history`'s."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from ..report.compare import (MIN_RUNS, P_ADJUST, RUNS_ALPHA, SAMPLES_ALPHA, compare_runs, default_html_name,
                              format_table, write_compare_html, write_csv, write_markdown)
from ..report.data import BadRunError
from ..report.history import run_history
from ..results import RunFileError, ensure_writable_dir


def add_compare_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("runs", nargs="*", metavar="RUN",
                        help="BASE CAND (two run directories, results/<run_id>), or with --vs: the baseline runs "
                             "(with --history: the baseline runs whose band is shaded)")
    parser.add_argument("--vs", nargs="+", metavar="CAND", default=None,
                        help=f"the candidate runs; the positional runs are then all baselines. With >= {MIN_RUNS} "
                             "runs a side the verdict is on run medians")
    parser.add_argument("--threshold", type=float, default=5.0, metavar="PCT",
                        help="smallest median change (in %%) that can count (default 5)")
    parser.add_argument("--alpha", type=float, default=None,
                        help=f"significance level (default {RUNS_ALPHA:g} on run medians: family-wise after Holm; "
                             f"{SAMPLES_ALPHA:g} on pooled samples)")
    parser.add_argument("--p-adjust", choices=P_ADJUST, default="holm",
                        help="run medians: holm (default; the chance that an unchanged night fails on any case is "
                             "<= alpha) or none (per case)")
    parser.add_argument("--strict-pooled", action="store_true",
                        help="pooled samples (< 3 runs a side): exit 1 on a regression (default: advisory, exit 0)")
    parser.add_argument("--reports-dir", default="reports", help="where the HTML goes (default: reports)")
    parser.add_argument("--out", default=None, help="HTML path (default: REPORTS_DIR/compare-BASE-vs-CAND.html; "
                                                    "--history: REPORTS_DIR/history-SUITE.html)")
    parser.add_argument("--markdown", default=None, metavar="PATH",
                        help="also write the per-case summary as a markdown table (status SAME/FAST/SLOW/NOISY/...)")
    parser.add_argument("--csv", default=None, metavar="PATH", help="also write the same table as CSV")
    parser.add_argument("--all", action="store_true", help="print unchanged cases too")
    parser.add_argument("--history", default=None, metavar="RESULTS_DIR",
                        help="instead of a compare: plot each case's run median over the runs kept in RESULTS_DIR "
                             "(oldest to newest, commit on the x axis, the baseline runs' band shaded) into one HTML")
    parser.add_argument("--suite", default=None,
                        help="--history: the suite to plot (default: the baseline's, else the newest run's)")
    parser.add_argument("--history-last", type=int, default=0, metavar="N",
                        help="--history: only the newest N runs (default: all)")
    return parser


def run_compare(args: argparse.Namespace) -> int:
    if getattr(args, "history", None):
        return run_history(args)
    if args.vs is not None:
        baselines, candidates = list(args.runs), list(args.vs)
        if not baselines:
            print("ple_bench compare: --vs needs the baseline runs before it", file=sys.stderr)
            return 2
    elif len(args.runs) == 2:
        baselines, candidates = [args.runs[0]], [args.runs[1]]
    else:
        print(f"ple_bench compare: {len(args.runs)} runs given without --vs: give BASE CAND, "
              "or BASE1 BASE2 ... --vs CAND1 CAND2 ... (or --history RESULTS_DIR)", file=sys.stderr)
        return 2
    try:  # every output is checked before the comparison: a gate must not read a verdict whose page is unwritten
        _check_outputs(args)
    except RunFileError as exc:
        print(f"ple_bench compare: {exc}", file=sys.stderr)
        return 2
    try:
        result = compare_runs(baselines, candidates, threshold_pct=args.threshold, alpha=args.alpha,
                              p_adjust=args.p_adjust, strict_pooled=args.strict_pooled)
    except (BadRunError, ValueError) as exc:
        print(f"ple_bench compare: {exc}", file=sys.stderr)
        return 2
    answer = result.summary()
    print(answer)  # the answer first: PASS / FAIL and its counts, then what it rests on
    for label, side in (("baseline ", result.baselines), ("candidate", result.candidates)):
        for run in side:
            print(f"{label} {run.run_id}  ({run.path})")
    table = format_table(result, show_all=getattr(args, "all", False)).splitlines()
    print("\n".join(table[:-1] if table and table[-1] == answer else table))  # said once, at the top
    out = args.out or Path(args.reports_dir) / default_html_name(result)
    try:
        print(f"HTML diff: {write_compare_html(result, out)}")
    except OSError as exc:  # bad input, as for report: no page, no verdict to gate on
        print(f"ple_bench compare: cannot write the HTML diff {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    try:
        if args.markdown:
            print(f"markdown: {write_markdown(result, args.markdown)}")
        if args.csv:
            print(f"CSV: {write_csv(result, args.csv)}")
    except OSError as exc:
        print(f"ple_bench compare: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    code = result.exit_code
    if code == 2:
        print("ple_bench compare: no case measured in both runs; different suites with nothing in common "
              "is not a pass", file=sys.stderr)
    return code


def _check_outputs(args: argparse.Namespace) -> None:
    """``RunFileError`` naming the flag (and folder) that cannot be written: --out's folder, else
    --reports-dir; --markdown's and --csv's folders."""
    if args.out:
        ensure_writable_dir(Path(args.out).parent, "--out")
    else:
        ensure_writable_dir(args.reports_dir, "--reports-dir")
    for flag, path in (("--markdown", args.markdown), ("--csv", args.csv)):
        if path:
            ensure_writable_dir(Path(path).parent, flag)


def compare_main(argv: Sequence[str] | None = None) -> int:
    parser = add_compare_args(argparse.ArgumentParser(
        prog="ple_bench compare", description="Compare stored runs (threshold + Mann-Whitney U)"))
    return run_compare(parser.parse_args(argv))

main = run_compare


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("compare", help="compare runs (BASE CAND, or BASE... --vs CAND...); "
                                       "exit 1 on a significant regression")
    add_compare_args(p)
    p.set_defaults(func=main)
    return p
