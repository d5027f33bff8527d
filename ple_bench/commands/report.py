"""``report``: (re)build the HTML report of a run.  Its flags and its verb live with the report
(``report.html``: ``add_report_args``, ``run_report``); this module wires them in."""

from __future__ import annotations

import argparse

from ..report import add_report_args, run_report

main = run_report


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("report", help="(re)build the HTML report of a run")
    add_report_args(p)
    p.set_defaults(func=main)
    return p
