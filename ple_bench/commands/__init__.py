"""One module per verb of ``python -m ple_bench``: each has ``add_parser(sub)`` (its argparse
sub-command, flags and help) and ``main(args) -> int`` (the verb); ``ple_bench.cli`` only builds the
parser from them and dispatches.

Verbs that measure (run, profile, env) import the engine -- and so torch, seconds of start-up --
inside their functions, and so does list (a suite's validators read spec -> workload, backends).
report, compare and schema read stored records and never load torch (tests/test_cli_imports.py):
a command module imports nothing at its top that loads torch."""

from __future__ import annotations

EXIT_BAD_USAGE = 2
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """Bad usage found after parsing: ``cli.main`` prints it and exits 2."""
