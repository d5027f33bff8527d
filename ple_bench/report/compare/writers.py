"""compare's outputs: the aligned text table (stdout), the HTML diff, and the per-case summary as a
pandas frame written as CSV and markdown; the rule and the default file name they share."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from ..data import Run, fmt, safe_name, varying_axes
from ..html import Column, render_page
from .result import NOT_COMPARABLE, STATUS, VERDICTS, CaseComparison, CompareResult, device_name
from .stats import RUNS_ALPHA, MIN_RUNS, MIN_SAMPLES, smallest_one_sided_p


def _runs_tag(runs: Sequence[Run]) -> str:
    return runs[0].run_id + (f"+{len(runs) - 1}" if len(runs) > 1 else "")


def _folders_tag(runs: Sequence[Run]) -> str:
    return safe_name(runs[0].path.name) + (f"+{len(runs) - 1}" if len(runs) > 1 else "")


def default_html_name(result: CompareResult) -> str:
    """``compare-BASE-vs-CAND.html`` named after the run FOLDERS (a copy of a run shares its
    meta.json's run id, not its folder name); with several runs a side, the first one and ``+N``."""
    return f"compare-{_folders_tag(result.baselines)}-vs-{_folders_tag(result.candidates)}.html"


def rule_text(result: CompareResult) -> str:
    """The verdict rule of this comparison, in one sentence."""
    procs = [c for c in result.cases if c.basis == "processes"]
    lead = ""
    if procs:
        lead = (f"repeated cases ({len(procs)}): one observation per worker process (its mean over rounds), "
                f"a mean change beyond {result.threshold_pct:g}% and a one-sided Welch t-test on the log process "
                f"means, Holm-adjusted over the {len(result.tested)} tested cases (family-wise error <= "
                f"{RUNS_ALPHA:g} unless --alpha is given)")
        if len(procs) == len(result.cases):
            return lead
        lead += "; the other cases: "
    if result.mode == "runs":
        nb, nc = len(result.baselines), len(result.candidates)
        m = len(result.tested)
        adjust = (f"Holm-adjusted over the {m} tested cases (family-wise error <= {result.alpha:g}) "
                  if result.p_adjust == "holm" else "per case, unadjusted ")
        return lead + (f"verdict on run medians ({nb} vs {nc} runs): a change of the median of run medians beyond "
                f"{result.threshold_pct:g}% and a one-sided exact Mann-Whitney U test on the run medians with p "
                f"{adjust}<= {result.alpha:g} (smallest raw p {smallest_one_sided_p(nb, nc):.3g}); throttled "
                "samples are dropped before each run's median; a case timed differently on the two sides is not "
                "comparable")
    return lead + (f"verdict on pooled samples ({len(result.baselines)} vs {len(result.candidates)} "
            f"run{'s' if len(result.candidates) != 1 else ''}): a median change beyond {result.threshold_pct:g}% "
            f"and a two-sided Mann-Whitney U test on the raw samples with p <= {result.alpha:g}; throttled "
            "samples are dropped from the median and the test alike; a case timed differently on the two sides "
            "is not comparable")


def _p(v: float | None) -> str:
    return "" if v is None else f"{v:.2g}"


def _case_text(c: CaseComparison) -> str:
    return f"{c.case_id}  ({c.timers_text})" if c.verdict == NOT_COMPARABLE else c.case_id


def format_table(result: CompareResult, show_all: bool = False) -> str:
    """An aligned text table (changed cases, or every case with ``show_all``)."""
    runs = result.mode == "runs"
    n_head = "runs" if runs else "n"
    header = ("verdict", "change", "p", "p adj", "baseline ms", "candidate ms", n_head, "case")
    rows = []
    for c in result.cases:
        if not show_all and c.verdict == "same":
            continue
        rows.append((
            c.verdict,
            "" if c.change_pct is None else f"{c.change_pct:+.1f}%",
            _p(c.p_value), _p(c.p_adjusted),
            fmt(c.baseline_ms), fmt(c.candidate_ms), f"{c.n_baseline}/{c.n_candidate}", _case_text(c),
        ))
    for b in result.broken:
        rows.append(("broken", "", "", "", "", "", "", f"{b['case_id']}  ({b['status']}: {b['reason']})"))
    if not runs:  # pooled mode: no adjusted p
        header = header[:3] + header[4:]
        rows = [r[:3] + r[4:] for r in rows]
    lines = []
    if rows:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        right = set(range(1, len(header) - 1))

        def line(cells: Sequence[str]) -> str:
            return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                             for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
        lines.append(line(header))
        lines.append(line(["-" * w for w in widths]))
        lines += [line(r) for r in rows]
    hidden = len(result.with_verdict("same")) if not show_all else 0
    if hidden:
        lines.append(f"({hidden} cases within {result.threshold_pct:g}% or not significant: same; --all shows them)")
    if result.only_in_baseline:
        lines.append(f"only in baseline ({len(result.only_in_baseline)}): " + ", ".join(result.only_in_baseline))
    if result.only_in_candidate:
        lines.append(f"only in candidate ({len(result.only_in_candidate)}): " + ", ".join(result.only_in_candidate))
    if result.not_compared:
        lines.append(f"in both but not measured in both ({len(result.not_compared)}): "
                     + ", ".join(result.not_compared))
    lines += [f"warning: {w}" for w in result.warnings]
    lines.append(f"rule: {rule_text(result)}")
    if result.advisory_text:
        lines.append(result.advisory_text)
    elif result.caveat:
        lines.append(f"note: {result.caveat}")
    lines += [f"offload verdict, {v}" for v in result.offload_verdicts()]
    lines.append(result.summary())
    return "\n".join(lines)


def _slug(verdict: str) -> str:
    return verdict.replace(" ", "-")


def _timer_cell(rec: dict[str, Any]) -> str:
    """One timer, or ``baseline → candidate`` when they differ."""
    b, c = rec["baseline_timer"], rec["candidate_timer"]
    return b if b == c else f"{b} → {c}"


def write_compare_html(result: CompareResult, out: str | Path) -> Path:
    runs = result.mode == "runs"
    test = "p (one-sided Mann–Whitney, run medians)" if runs else "p (Mann–Whitney, pooled samples)"
    columns = [
        Column("verdict", "verdict", "text"),
        Column("change_pct", "change %", formatter=lambda v: "" if v is None else f"{v:+.1f}%"),
        Column("case_id", "case", "text"),
        Column("baseline_ms", "baseline median of run medians ms" if runs else "baseline median ms"),
        Column("candidate_ms", "candidate median of run medians ms" if runs else "candidate median ms"),
        Column("p_value", test),
    ]
    if runs:
        columns.append(Column("p_adjusted", "p adjusted (Holm)" if result.p_adjust == "holm" else "p (unadjusted)",
                              help="the p the verdict used"))
    columns += [
        Column("baseline_noise_pct", "baseline noise %", formatter=lambda v: "" if v is None else f"{v:.1f}%",
               help="std / mean of the " + ("run medians" if runs else "samples")),
        Column("candidate_noise_pct", "candidate noise %", formatter=lambda v: "" if v is None else f"{v:.1f}%"),
        Column("n_baseline", "baseline runs" if runs else "baseline samples"),
        Column("n_candidate", "candidate runs" if runs else "candidate samples"),
        Column("timer", "timer", "text", getter=_timer_cell),
        Column("label", "what", "text"),
    ]
    rows = []
    for c in result.cases:
        rec = vars(c)
        cells = [{"text": c.verdict, "v": None, "cls": f"verdict-{_slug(c.verdict)}"}]
        cells += [col.cell(rec) for col in columns[1:]]
        rows.append({"status": c.verdict, "cells": cells})
    code = result.exit_code
    banner = {0: "good", 1: "bad", 2: "warn"}[code]
    if code == 0 and (result.no_verdict or (result.advisory and result.regressions)):
        banner = "warn"

    def ids(side: Sequence[Run]) -> str:
        return ", ".join(r.run_id for r in side)

    def devices(side: Sequence[Run]) -> str:
        return ", ".join(dict.fromkeys(device_name(r) for r in side))

    html = render_page(
        "compare.html", base_id=ids(result.baselines), cand_id=ids(result.candidates),
        base_device=devices(result.baselines), cand_device=devices(result.candidates), summary=result.summary(),
        offload=result.offload_verdicts(),
        banner_class=banner, threshold=f"{result.threshold_pct:g}", alpha=f"{result.alpha:g}",
        min_samples=MIN_SAMPLES, min_runs=MIN_RUNS, mode=result.mode, n_base=len(result.baselines),
        n_cand=len(result.candidates), caveat=result.caveat, advisory=result.advisory,
        p_adjust=result.p_adjust, n_tested=len(result.tested), no_verdict=result.no_verdict,
        p_floor=f"{smallest_one_sided_p(len(result.baselines), len(result.candidates)):.3g}",
        warnings=result.warnings, columns=columns, rows=rows,
        verdicts=[v for v in VERDICTS if result.with_verdict(v)], broken=result.broken,
        not_comparable=result.not_comparable,
        only_base=result.only_in_baseline, only_cand=result.only_in_candidate,
        not_compared=result.not_compared,
    )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html, encoding="utf-8")
    return out


# ----------------------------------------------------------- machine-readable summaries

def summary_frame(result: CompareResult):
    """One row per case, as nvbench_compare prints them: ``case_id``, the axes that differ across the
    compared cases, both times (ms), both noises (%), the change (%), raw and adjusted p and a status
    (:data:`STATUS`), plus a note (both timers of a not-comparable case, a broken case's reason).
    A pandas DataFrame (what :func:`write_csv` and :func:`write_markdown` write)."""
    import pandas as pd  # pandas: heavy, only the CSV/markdown tables

    axes = varying_axes([c.axes for c in result.cases], exclude=("seed",))
    rows = []
    for c in result.cases:
        note = c.timers_text if c.verdict == NOT_COMPARABLE else (
            "compute calibrated to different matmul counts" if c.verdict == "workload" else "")
        rows.append({"case_id": c.case_id, **{a: c.axes.get(a) for a in axes},
                     "baseline_ms": c.baseline_ms, "baseline_noise_pct": c.baseline_noise_pct,
                     "candidate_ms": c.candidate_ms, "candidate_noise_pct": c.candidate_noise_pct,
                     "change_pct": c.change_pct, "p": c.p_value, "p_adjusted": c.p_adjusted,
                     "status": STATUS[c.verdict], "note": note})
    for b in result.broken:
        rows.append({"case_id": b["case_id"], "status": STATUS["broken"], "note": f"{b['status']}: {b['reason']}"})
    columns = ["case_id", *axes, "baseline_ms", "baseline_noise_pct", "candidate_ms", "candidate_noise_pct",
               "change_pct", "p", "p_adjusted", "status", "note"]
    return pd.DataFrame(rows, columns=columns)


def write_csv(result: CompareResult, out: str | Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    summary_frame(result).to_csv(out, index=False)
    return out


def _md_cell(column: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if column in ("change_pct",):
        return f"{value:+.1f}%"
    if column.endswith("_pct"):
        return f"{value:.1f}%"
    if column in ("p", "p_adjusted"):
        return f"{value:.3g}"
    if column.endswith("_ms"):
        return fmt(value)
    return str(value).replace("|", "\\|").replace("\n", " ")


_MD_HEADERS = {"baseline_ms": "baseline ms", "baseline_noise_pct": "baseline noise", "candidate_ms": "candidate ms",
               "candidate_noise_pct": "candidate noise", "change_pct": "change", "p_adjusted": "p adjusted"}


def markdown_summary(result: CompareResult) -> str:
    """The summary line, the rule, any advisory and warnings, then the :func:`summary_frame` table."""
    df = summary_frame(result)
    lines = [f"## ple_bench compare: {_runs_tag(result.baselines)} vs {_runs_tag(result.candidates)}", "",
             f"**{result.summary()}**", "", f"Rule: {rule_text(result)}.", ""]
    lines += [f"- offload verdict, {v}" for v in result.offload_verdicts()]
    if result.advisory_text:
        lines += ["", f"*{result.advisory_text}.*"]
    if result.warnings:
        lines += [""] + [f"- warning: {w}" for w in result.warnings]
    lines += ["", "| " + " | ".join(_MD_HEADERS.get(c, c) for c in df.columns) + " |",
              "|" + "|".join("---" for _ in df.columns) + "|"]
    for rec in df.to_dict("records"):
        lines.append("| " + " | ".join(_md_cell(c, rec[c]) for c in df.columns) + " |")
    return "\n".join(lines) + "\n"


def write_markdown(result: CompareResult, out: str | Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown_summary(result), encoding="utf-8")
    return out
