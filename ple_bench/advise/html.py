"""``advise --html PATH``: the answer as one self-contained page (the report's templates and
styles), the ranked tables with measured / predicted marked, and one plot: step time per path vs
tokens per step, the model's lines over the measured points, the resident steps in black."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from ..report.html import render_page
from ..report.plots import figure_uri


def advise_plot(advice: Any, args: argparse.Namespace, model_points: list | None = None) -> str | None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401  (imported by plots.figure_uri)
    from matplotlib.figure import Figure  # matplotlib: heavy, only the page draws


    m = advice.model
    if m is None or not m.answers:
        return None
    fig = Figure(figsize=(7.5, 4.4), layout="constrained")
    ax = fig.subplots()
    series: dict[tuple, list[tuple[int, float, str]]] = {}
    for ans in m.answers:
        for o in ans.options:
            series.setdefault((o.placement, o.path, o.prefetch, o.ids_on, o.graph), []).append(
                (ans.tokens, o.step_ms, o.source))
    # at most 8 series: the resident ones and the fastest pinned ones at the largest token count
    last = {k: v[-1][1] for k, v in series.items()}
    keep = sorted(series, key=lambda k: (k[0] != "HBM", last[k]))[:8]
    for i, k in enumerate(keep):
        pts = series[k]
        color = "black" if k[0] == "HBM" else f"C{i % 10}"
        label = f"{k[0]}: {k[1]}, ids {k[3]}, {k[4]}" + (", pf" if k[2] else "")
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "-" if k[0] != "HBM" else "--", color=color, label=label)
        meas = [p for p in pts if p[2] == "measured"]
        ax.plot([p[0] for p in meas], [p[1] for p in meas], "o", color=color)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens per step")
    ax.set_ylabel("step ms")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    return figure_uri(fig)


def write_advice_html(advice: Any, args: argparse.Namespace, out: Path) -> Path:
    size = args.table_bytes or f"{args.rows} rows"
    shape = f"table {size}, dim {args.dim}, {args.dtype}, {args.heads} heads, tokens {args.tokens}, " \
            f"compute {getattr(advice, 'compute_label', '') or f'{args.compute_us:g} us'}, " \
            f"ids {getattr(advice, 'ids', '') or 'as measured'}"
    html = render_page("advise.html", shape=shape, runs=args.runs or [], verdict=advice.verdict, model=advice.model,
                       plot=advise_plot(advice, args), measured_verdict=_measured_verdict(advice),
                       notes=advice.notes, answers=advice.answers,
                       command=" ".join(shlex.quote(a) for a in ["python", "-m", "ple_bench", *sys.argv[1:]]))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html, encoding="utf-8")
    return out


def _measured_verdict(advice: Any) -> str:
    return getattr(advice, "measured_verdict", "") or ""
