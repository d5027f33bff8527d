"""``advise``: where the table should live and how it is looked up, ranked from measured runs.  Its
flags and its verb live with the answer (``advise.answer``: ``add_advise_args``, ``run_advise``);
this module wires them in."""

from __future__ import annotations

import argparse

from ..advise.answer import add_advise_args, run_advise

main = run_advise


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("advise", help="where should the table live, and how looked up: ranked from measured runs")
    add_advise_args(p)
    p.set_defaults(func=main)
    return p
