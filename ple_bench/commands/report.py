"""``report``: (re)build the HTML report of a stored run and its summaries; its flags
(:func:`add_report_args`) and the verb (:func:`run_report`).  The page is
:func:`ple_bench.report.html.write_report`'s, the summaries :mod:`ple_bench.report.export`'s.

Exit 2 on bad input, named: a folder that is not a run, a ``--reports-dir`` that cannot be
written, and lines of ``records.jsonl`` that cannot be read (the page is still written, naming
them: the records that can be read are worth a page, but a gate must not take it as whole)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from ..report.data import BadRunError, load_run
from ..report.html import history_runs, write_report
from . import EXIT_BAD_USAGE


def add_report_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("run_dir", help="a stored run: results/<run_id>")
    parser.add_argument("--reports-dir", default="reports",
                        help="where reports go (default: reports): <reports-dir>/<the run folder's name>/index.html")
    parser.add_argument("--history", nargs="*", default=[], metavar="RUN_DIR",
                        help="earlier runs for the trend section")
    parser.add_argument("--history-last", type=int, default=0, metavar="N",
                        help="also take the last N runs of the same suite stored beside RUN_DIR")
    return parser


def run_report(args: argparse.Namespace) -> int:
    history = [Path(p) for p in (args.history or [])]
    if getattr(args, "history_last", 0):
        history += [p for p in history_runs(args.run_dir, args.history_last) if p not in history]
    try:
        run = load_run(args.run_dir)  # names each unreadable line on stderr
        path = write_report(run, args.reports_dir, history or None)
    except BadRunError as exc:
        print(f"ple_bench report: {exc}", file=sys.stderr)
        return EXIT_BAD_USAGE
    except OSError as exc:  # the reports folder cannot be made or written: bad input, named
        print(f"ple_bench report: cannot write the report into --reports-dir {args.reports_dir}: "
              f"{exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else ""), file=sys.stderr)
        return EXIT_BAD_USAGE

    try:  # the run's summaries beside its records, as a run writes them
        from ..report.export import write_exports  # pandas: only once the page is written
        write_exports(args.run_dir)
    except OSError as exc:
        print(f"ple_bench report: warning: summaries not written: {exc}", file=sys.stderr)
    print(path)
    if not run.records:
        print(f"ple_bench report: warning: {run.path / 'records.jsonl'} holds no records: the report has "
              "nothing measured", file=sys.stderr)
    if run.lost:
        print(f"ple_bench report: {len(run.lost)} line(s) of {run.path / 'records.jsonl'} could not be read "
              f"(line {', '.join(str(x.line) for x in run.lost)}): the report leaves them out and says so; "
              f"`run --resume {run.path}` measures their cases again", file=sys.stderr)
        return EXIT_BAD_USAGE
    return 0


def report_main(argv: Sequence[str] | None = None) -> int:
    parser = add_report_args(argparse.ArgumentParser(prog="ple_bench report",
                                                     description="HTML report of a stored run"))
    return run_report(parser.parse_args(argv))


main = run_report


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("report", help="(re)build the HTML report of a run")
    add_report_args(p)
    p.set_defaults(func=main)
    return p
