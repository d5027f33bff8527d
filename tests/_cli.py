"""Run a ``ple_bench`` verb in this process, as ``python -m ple_bench`` would, and return what a
subprocess would (exit status, stdout, stderr): the CLI's own ``main``, without a new interpreter
importing torch for each call (on a 2-core machine that start cost 5-30 s a call)."""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass

from ple_bench.cli import main


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*argv: str) -> Ran:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return Ran(int(code or 0), out.getvalue(), err.getvalue())
