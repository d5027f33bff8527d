"""Run a ``ple_bench`` verb in this process, as ``python -m ple_bench`` would, and return what a
subprocess would (exit status, stdout, stderr): the CLI's own ``main``, without a new interpreter
importing torch for each call (on a 2-core machine that start cost 5-30 s a call)."""

from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass

from ple_bench.cli import main
from ple_bench.env import FORCE_CPU_ENV


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


@contextlib.contextmanager
def _forced_cpu():
    """``PLE_BENCH_FORCE_CPU`` set for the call, as ``tests/test_cli.py``'s subprocesses have it."""
    before = os.environ.get(FORCE_CPU_ENV)
    os.environ[FORCE_CPU_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(FORCE_CPU_ENV, None)
        else:
            os.environ[FORCE_CPU_ENV] = before


def run_cli(*argv: str, cpu: bool = False) -> Ran:
    """``main(argv)`` with its output captured; ``cpu=True``: behave as on a machine without a GPU
    (``PLE_BENCH_FORCE_CPU``), whatever this one has."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        if cpu:
            stack.enter_context(_forced_cpu())
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        code = main([str(a) for a in argv])
    return Ran(int(code or 0), out.getvalue(), err.getvalue())
