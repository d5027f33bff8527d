"""The ``list`` verb's views of a suite's cases: one JSON object per case, an aligned table with the
axes that vary, and a narrow table by group (case_id and table size)."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from typing import Any, TYPE_CHECKING

from ..units import format_bytes
from .case import Case

if TYPE_CHECKING:  # a type only: the suite module imports nothing from here
    from .suite import Suite


def case_json(case: Case) -> dict[str, Any]:
    return {"case_id": case.case_id, **case.axes()}


def format_cases(cases: list[Case]) -> str:
    """An aligned table: one row per case; axes equal in every case are listed once above it."""
    if not cases:
        return "(no cases)"
    names = [f.name for f in dataclasses.fields(Case)]
    rows = [case_json(c) for c in cases]
    defaults = case_json(Case())

    def key(v: Any) -> str:
        return json.dumps(v, sort_keys=True, default=str)

    varying = [n for n in names if len({key(r[n]) for r in rows}) > 1]
    common = [n for n in names if n not in varying and key(rows[0][n]) != key(defaults[n])]
    header = ["#", "case_id"] + varying + ["table"]
    body = [
        [str(i), r["case_id"]] + [_cell(r[n]) for n in varying] + [format_bytes(c.table_bytes)]
        for i, (r, c) in enumerate(zip(rows, cases), 1)
    ]
    widths = [max(len(row[j]) for row in [header] + body) for j in range(len(header))]
    numeric = [all(_is_number(row[j]) for row in body) for j in range(len(header))]

    def line(row: list[str]) -> str:
        cells = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric)]
        return "  ".join(cells).rstrip()

    out = []
    if common:
        out.append("common: " + " ".join(f"{n}={_cell(rows[0][n])}" for n in common))
    out += [line(header), line(["-" * w for w in widths])]
    out += [line(row) for row in body]
    out.append(f"{len(cases)} case{'s' if len(cases) != 1 else ''}")
    return "\n".join(out)


def format_cases_narrow(suite: "Suite", width: int = 100) -> str:
    """``list --suite S``: the cases by group, each group headed by the axes that vary in it;
    a case on one line: its number (as in :func:`format_cases`), its table size (in the group's
    head when one size serves the group) and ``case_id``, which spells the axes that differ from
    their defaults."""
    if not suite.cases:
        return "(no cases)"
    number = {c.case_id: i for i, c in enumerate(suite.cases, 1)}
    by_id = {c.case_id: c for c in suite.cases}
    groups = [(g.name, [by_id[cid] for cid in g.case_ids if cid in by_id]) for g in suite.groups]
    grouped = {cid for _, cases in groups for cid in (c.case_id for c in cases)}
    rest = [c for c in suite.cases if c.case_id not in grouped]
    if rest:
        groups.append(("(other)", rest))
    names = [f.name for f in dataclasses.fields(Case)]
    digits = len(str(len(suite.cases)))
    out = []
    for name, cases in groups:
        if not cases:
            continue
        rows = [case_json(c) for c in cases]
        varying = [n for n in names if len({json.dumps(r[n], sort_keys=True, default=str) for r in rows}) > 1]
        sizes = {format_bytes(c.table_bytes) for c in cases}
        head = f"[{name}] {len(cases)} case{'s' if len(cases) != 1 else ''}" + (
            f", table {next(iter(sizes))}" if len(sizes) == 1 else "") + (
            ", varying " + ", ".join(varying) if varying else "")
        out += textwrap.wrap(head, width, subsequent_indent="    ")
        size_width = max(map(len, sizes))
        out += [f"{number[c.case_id]:>{digits}}  " + (f"{format_bytes(c.table_bytes):>{size_width}}  "
                                                       if len(sizes) > 1 else "") + c.case_id for c in cases]
    out.append(f"{len(suite.cases)} case{'s' if len(suite.cases) != 1 else ''} (--wide: every axis as a column)")
    return "\n".join(out)


def _cell(v: Any) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, dict):
        return ",".join(f"{k}={x}" for k, x in sorted(v.items())) or "-"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v) if v != "" else "-"


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False
