"""``compare``: compare runs; exit 1 on a significant regression.  Its flags and its verb live with
its statistics and matching (``report.compare``: ``add_compare_args``, ``run_compare``); this module
wires them in."""

from __future__ import annotations

import argparse

from ..report.compare import add_compare_args, run_compare

main = run_compare


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("compare", help="compare runs (BASE CAND, or BASE... --vs CAND...); "
                                       "exit 1 on a significant regression")
    add_compare_args(p)
    p.set_defaults(func=main)
    return p
