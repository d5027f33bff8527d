"""Command line: ``python -m ple_bench {run,list,report,compare,profile,advise,env,schema}``.

Dispatch only: each verb is a module of ``ple_bench.commands`` (its flags in ``add_parser``, the
verb in ``main``); this module builds the parser from them and calls the chosen verb.

Exit codes: 0 success; 1 a case failed or was invalid (run) / a regression
(compare); 2 bad usage or a bad suite; 130 interrupted (results kept)."""

from __future__ import annotations

import argparse
import os
import sys

from .commands import EXIT_BAD_USAGE, EXIT_INTERRUPTED, UsageError
from .commands import advise, compare, env, profile, report, run, schema
from .commands import list as list_
from .results import RunFileError

# the verbs, in the order ``--help`` lists them (no command module loads torch at its top)
VERBS = (run, list_, report, compare, profile, advise, env, schema)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ple_bench",
                                     description="Benchmark PLE / n-gram embedding storage backends.")
    sub = parser.add_subparsers(dest="verb", required=True)
    for verb in VERBS:
        verb.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on bad usage already
        return int(exc.code or 0)

    try:
        return int(args.func(args) or 0)
    except (UsageError, RunFileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_USAGE
    except KeyboardInterrupt:  # Ctrl-C outside a suite loop (which keeps its records and says so)
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (``list --json | head``): stop quietly
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - so the interpreter's final flush does not fail
        except OSError:
            pass
        return 0
