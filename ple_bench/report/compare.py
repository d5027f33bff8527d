"""Regression compare of two stored runs: baseline vs candidate.

Cases are matched by ``case_id``; only cases measured (status ok) in both are
compared.  A case is a **regression** (or **improvement**) only when its
median moved by more than ``threshold_pct`` *and* a two-sided Mann-Whitney U
test on the raw samples gives ``p < alpha`` (the asv rule: a threshold alone
cries wolf on noisy cases, a test alone flags tiny real changes).  A change over
the threshold that is not significant is **noisy**; fewer than
:data:`MIN_SAMPLES` samples on either side is **insufficient**.  A case that was
ok in the baseline and failed or was invalid in the candidate is **broken**.

Exit codes of the CLI (``python -m ple_bench compare BASE CAND``):
0 no regression; 1 at least one regression or broken case; 2 bad input
(missing run, no meta.json, or no case measured in both runs — different
suites with nothing in common is not a pass).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .data import BadRunError, Run, describe, fmt, load_run, num, samples_of

MIN_SAMPLES = 5
VERDICTS = ("regression", "broken", "improvement", "noisy", "insufficient", "same")


@dataclass
class CaseComparison:
    case_id: str
    label: str
    baseline_ms: float | None
    candidate_ms: float | None
    change_pct: float | None  # (candidate - baseline) / baseline * 100; > 0 is slower
    p_value: float | None
    n_baseline: int
    n_candidate: int
    verdict: str


@dataclass
class CompareResult:
    baseline: Run
    candidate: Run
    threshold_pct: float
    alpha: float
    cases: list[CaseComparison] = field(default_factory=list)
    only_in_baseline: list[str] = field(default_factory=list)
    only_in_candidate: list[str] = field(default_factory=list)
    broken: list[dict[str, Any]] = field(default_factory=list)  # ok in baseline, failed/invalid now
    not_compared: list[str] = field(default_factory=list)  # in both, not ok in both (e.g. skipped)
    warnings: list[str] = field(default_factory=list)

    def with_verdict(self, verdict: str) -> list[CaseComparison]:
        return [c for c in self.cases if c.verdict == verdict]

    @property
    def regressions(self) -> list[CaseComparison]:
        return self.with_verdict("regression")

    @property
    def improvements(self) -> list[CaseComparison]:
        return self.with_verdict("improvement")

    @property
    def exit_code(self) -> int:
        if self.regressions or self.broken:
            return 1
        if not self.cases:
            return 2
        return 0

    def summary(self) -> str:
        counts = {v: len(self.with_verdict(v)) for v in VERDICTS if v != "broken"}
        if not self.cases and not self.broken:
            return ("No case was measured in both runs: nothing to compare "
                    "(different suites with nothing in common is not a pass).")
        parts = [f"{len(self.cases)} cases compared"]
        parts += [f"{n} {v}{'s' if n != 1 and v in ('regression', 'improvement') else ''}"
                  for v, n in counts.items() if n]
        if self.broken:
            parts.append(f"{len(self.broken)} broken")
        head = "FAIL" if self.exit_code == 1 else "PASS"
        return f"{head}: " + ", ".join(parts) + f" (threshold {self.threshold_pct:g}%, alpha {self.alpha:g})."


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided Mann-Whitney U p-value; 1.0 when the test cannot separate them (all values tied)."""
    from scipy.stats import mannwhitneyu

    if not a or not b:
        return 1.0
    if len(set(a) | set(b)) == 1:
        return 1.0
    p = float(mannwhitneyu(a, b, alternative="two-sided").pvalue)
    return 1.0 if math.isnan(p) else p


def compare_case(base: dict[str, Any], cand: dict[str, Any], threshold_pct: float, alpha: float,
                 min_samples: int = MIN_SAMPLES) -> CaseComparison:
    bs, cs = samples_of(base), samples_of(cand)
    bm = num(base.get("median_ms"))
    cm = num(cand.get("median_ms"))
    bm = bm if bm is not None else (statistics.median(bs) if bs else None)
    cm = cm if cm is not None else (statistics.median(cs) if cs else None)
    change = (cm - bm) / bm * 100 if bm and cm is not None else None
    p_value = None
    if len(bs) < min_samples or len(cs) < min_samples or change is None:
        verdict = "insufficient"
    else:
        p_value = mann_whitney_p(bs, cs)
        if abs(change) > threshold_pct and p_value < alpha:
            verdict = "regression" if change > 0 else "improvement"
        elif abs(change) > threshold_pct:
            verdict = "noisy"
        else:
            verdict = "same"
    label = _label(cand)
    return CaseComparison(case_id=str(cand.get("case_id")), label=label, baseline_ms=bm, candidate_ms=cm,
                          change_pct=change, p_value=p_value, n_baseline=len(bs), n_candidate=len(cs),
                          verdict=verdict)


def _label(record: dict[str, Any]) -> str:
    """What a case is, in a few words (the case id hides some axes in its hash)."""
    axes = ["kind", "impl", "dtype", "num_tokens"]
    if record.get("kind") == "step":
        axes += ["prefetch", "compute_us"]
    text = describe(record, axes)
    tp, etp, dp = (record.get(k) or 1 for k in ("tp", "etp", "dp"))
    if (tp, etp, dp) != (1, 1, 1):
        text += f" tp{tp} etp{etp} dp{dp}"
    return text


def compare_runs(baseline_dir: str | Path, candidate_dir: str | Path, threshold_pct: float = 5.0,
                 alpha: float = 0.01, min_samples: int = MIN_SAMPLES) -> CompareResult:
    """Compare two stored runs; raises :class:`BadRunError` when either is not a run."""
    if threshold_pct < 0:
        raise ValueError("threshold_pct must be >= 0")
    if not 0 < alpha < 1:
        raise ValueError("alpha must be in (0, 1)")
    base, cand = load_run(baseline_dir), load_run(candidate_dir)
    result = CompareResult(baseline=base, candidate=cand, threshold_pct=threshold_pct, alpha=alpha)
    b_by_id = {r["case_id"]: r for r in base.records}
    c_by_id = {r["case_id"]: r for r in cand.records}
    result.only_in_baseline = sorted(set(b_by_id) - set(c_by_id))
    result.only_in_candidate = sorted(set(c_by_id) - set(b_by_id))
    for cid in sorted(set(b_by_id) & set(c_by_id)):
        b, c = b_by_id[cid], c_by_id[cid]
        if b.get("status") == "ok" and c.get("status") == "ok":
            result.cases.append(compare_case(b, c, threshold_pct, alpha, min_samples))
        elif b.get("status") == "ok" and c.get("status") in ("failed", "invalid"):
            result.broken.append({"case_id": cid, "status": c.get("status"), "reason": c.get("reason") or ""})
        else:
            result.not_compared.append(cid)
    order = {v: i for i, v in enumerate(VERDICTS)}
    result.cases.sort(key=lambda c: (order[c.verdict], -abs(c.change_pct or 0.0), c.case_id))
    result.warnings = _warnings(base, cand)
    return result


def _warnings(base: Run, cand: Run) -> list[str]:
    out = []

    def device(run: Run) -> str:
        d = run.meta.get("device")
        return str(d.get("name") if isinstance(d, dict) else d)

    if device(base) != device(cand):
        out.append(f"The runs were on different devices ({device(base)} vs {device(cand)}).")
    if base.mode != cand.mode:
        out.append(f"The runs have different modes ({base.mode} vs {cand.mode}).")
    if "functional" in (base.mode, cand.mode):
        out.append("A CPU functional run (host timer) is involved: its times are not GPU performance.")
    bt, ct = base.meta.get("timer"), cand.meta.get("timer")
    if bt and ct and bt != ct:
        out.append(f"The runs used different timers ({bt} vs {ct}).")
    for run in (base, cand):
        if run.meta.get("status") not in (None, "complete"):
            out.append(f"Run {run.run_id} has status “{run.meta.get('status')}”: it did not finish.")
    return out


# ------------------------------------------------------------------ output

def format_table(result: CompareResult, show_all: bool = False) -> str:
    """An aligned text table (changed cases, or every case with ``show_all``)."""
    header = ("verdict", "change", "p", "baseline ms", "candidate ms", "n", "case")
    rows = []
    for c in result.cases:
        if not show_all and c.verdict == "same":
            continue
        rows.append((
            c.verdict,
            "" if c.change_pct is None else f"{c.change_pct:+.1f}%",
            "" if c.p_value is None else f"{c.p_value:.2g}",
            fmt(c.baseline_ms), fmt(c.candidate_ms), f"{c.n_baseline}/{c.n_candidate}", c.case_id,
        ))
    for b in result.broken:
        rows.append(("broken", "", "", "", "", "", f"{b['case_id']}  ({b['status']}: {b['reason']})"))
    lines = []
    if rows:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        right = {1, 2, 3, 4, 5}

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
    lines.append(result.summary())
    return "\n".join(lines)


def write_compare_html(result: CompareResult, out: str | Path) -> Path:
    from .html import Column, render_page

    columns = [
        Column("verdict", "verdict", "text"),
        Column("change_pct", "change %", formatter=lambda v: "" if v is None else f"{v:+.1f}%"),
        Column("case_id", "case", "text"),
        Column("baseline_ms", "baseline median ms"),
        Column("candidate_ms", "candidate median ms"),
        Column("p_value", "p (Mann–Whitney)"),
        Column("n_baseline", "baseline samples"),
        Column("n_candidate", "candidate samples"),
        Column("label", "what", "text"),
    ]
    rows = []
    for c in result.cases:
        rec = vars(c)
        cells = [{"text": c.verdict, "v": None, "cls": f"verdict-{c.verdict}"}] + [col.cell(rec) for col in columns[1:]]
        rows.append({"status": c.verdict, "cells": cells})
    code = result.exit_code
    banner = {0: "good", 1: "bad", 2: "warn"}[code]

    def device(run: Run) -> str:
        d = run.meta.get("device")
        return str(d.get("name") if isinstance(d, dict) else d)

    html = render_page(
        "compare.html", base_id=result.baseline.run_id, cand_id=result.candidate.run_id,
        base_device=device(result.baseline), cand_device=device(result.candidate), summary=result.summary(),
        banner_class=banner, threshold=f"{result.threshold_pct:g}", alpha=f"{result.alpha:g}",
        min_samples=MIN_SAMPLES, warnings=result.warnings, columns=columns, rows=rows,
        verdicts=[v for v in VERDICTS if result.with_verdict(v)], broken=result.broken,
        only_base=result.only_in_baseline, only_cand=result.only_in_candidate,
        not_compared=result.not_compared,
    )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html, encoding="utf-8")
    return out


# --------------------------------------------------------------------- CLI

def add_compare_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("baseline", help="baseline run directory (results/<run_id>)")
    parser.add_argument("candidate", help="candidate run directory")
    parser.add_argument("--threshold", type=float, default=5.0, metavar="PCT",
                        help="smallest median change (in %%) that can count (default 5)")
    parser.add_argument("--alpha", type=float, default=0.01,
                        help="significance level of the Mann-Whitney U test (default 0.01)")
    parser.add_argument("--reports-dir", default="reports", help="where the HTML diff goes (default: reports)")
    parser.add_argument("--out", default=None, help="HTML diff path (default: REPORTS_DIR/compare-BASE-vs-CAND.html)")
    parser.add_argument("--all", action="store_true", help="print unchanged cases too")
    return parser


def run_compare(args: argparse.Namespace) -> int:
    try:
        result = compare_runs(args.baseline, args.candidate, threshold_pct=args.threshold, alpha=args.alpha)
    except BadRunError as exc:
        print(f"ple_bench compare: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"ple_bench compare: {exc}", file=sys.stderr)
        return 2
    print(f"baseline  {result.baseline.run_id}  ({result.baseline.path})")
    print(f"candidate {result.candidate.run_id}  ({result.candidate.path})")
    print(format_table(result, show_all=getattr(args, "all", False)))
    out = args.out or Path(args.reports_dir) / f"compare-{result.baseline.run_id}-vs-{result.candidate.run_id}.html"
    path = write_compare_html(result, out)
    print(f"HTML diff: {path}")
    code = result.exit_code
    if code == 2:
        print("ple_bench compare: no case measured in both runs; different suites with nothing in common "
              "is not a pass", file=sys.stderr)
    return code


def compare_main(argv: Sequence[str] | None = None) -> int:
    parser = add_compare_args(argparse.ArgumentParser(
        prog="ple_bench compare", description="Compare two stored runs (threshold + Mann-Whitney U)"))
    return run_compare(parser.parse_args(argv))
