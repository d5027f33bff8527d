"""``python -m ple_bench.report {report,compare} ...``: the report verbs without the main CLI
(the nightly script uses this so it does not depend on other verbs being installed).  An entry
point, in the layer of ``ple_bench.__main__``: it wires in the verbs' modules of ``commands/``."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from ..commands.compare import add_compare_args, run_compare
from ..commands.report import add_report_args, run_report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ple_bench.report")
    sub = parser.add_subparsers(dest="verb", required=True)
    add_report_args(sub.add_parser("report", help="HTML report of a stored run"))
    add_compare_args(sub.add_parser("compare", help="compare stored runs (BASE CAND, or BASE... --vs CAND...)"))
    args = parser.parse_args(argv)
    return run_report(args) if args.verb == "report" else run_compare(args)


if __name__ == "__main__":
    sys.exit(main())
