"""``list``: the suites, or one suite's cases (a table, or one JSON object per case)."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap

from ..spec.listing import case_json, format_cases, format_cases_narrow
from . import EXIT_BAD_USAGE


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("list", help="list suites, or one suite's cases")
    p.add_argument("--suite", help="show this suite's cases")
    p.add_argument("--json", action="store_true", help="one JSON object per case (case_id and axes)")
    p.add_argument("--wide", action="store_true",
                   help="with --suite: one column per axis that varies (default: case_id and table size by group)")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    # suites load torch (spec -> workload, backends): imported here (see commands/__init__.py)
    from ..spec.suite import SuiteError, list_suites, load_suite
    if args.wide and not args.suite:
        print("error: --wide lists one suite's cases: give --suite S (the list of suites has no axes)", file=sys.stderr)
        return EXIT_BAD_USAGE
    try:
        suites = [load_suite(args.suite)] if args.suite else list_suites()
    except SuiteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_USAGE
    name_width = max(len(s.name) for s in suites) if suites else 0
    count_width = max(len(str(len(s.cases))) for s in suites) if suites else 0
    for suite in suites:
        if args.json:
            for case in suite.cases:
                obj = case_json(case)
                if not args.suite:
                    obj = {"suite": suite.name, **obj}
                print(json.dumps(obj, sort_keys=False))
        elif args.suite and args.wide:
            print(f"# {suite.name}: {suite.description} ({len(suite.cases)} cases)")
            print(format_cases(suite.cases))
        elif args.suite:
            print("\n".join(textwrap.wrap(f"# {suite.name}: {suite.description} ({len(suite.cases)} cases)",
                                          100, subsequent_indent="#   ")))
            print(format_cases_narrow(suite))
        else:
            print(f"{suite.name:<{name_width}}  {len(suite.cases):>{count_width}} cases  {suite.description}")
    return 0
