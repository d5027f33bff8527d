"""The serving plot: tokens/s and TPOT against batch, one colour per placement (host, HBM), one line
style per scenario (context, KV dtype, model), the TPOT target as a line and each placement's point
under it as a star (:func:`ple_bench.serving.slo.serving_verdict`'s, the one the answer sentence
reads).  Drawn when a run has serve records with two or more batches of one placement; the report
shows it first (:func:`ple_bench.report.html.build_report`).

``python -m ple_bench.report.plots_serving RUN_DIR --out PNG [--tpot-ms 30]`` writes it as a file (a
doc's figure).
"""

from __future__ import annotations

import argparse
import base64
import sys
from pathlib import Path
from typing import Sequence

from matplotlib.figure import Figure

from ..units import format_bytes
from ..serving.slo import ServingAnswer, context_words, serving_verdict
from .data import BadRunError, Run, load_run
from .plots import FUNCTIONAL_NOTE, KEY_HEIGHT_IN, MARKERS, PLOT_DPI, WIDTH_IN, Plot, figure_uri

COLOURS = {"host": "#1f77b4", "hbm": "#d62728"}
LINESTYLES = ("-", "--", ":", "-.")


def _scenario_label(a: ServingAnswer, answers: Sequence[ServingAnswer]) -> str:
    """The scenario's words, naming only what differs between the run's scenarios."""
    parts = [f"{context_words(a.scenario.context_len)} context"]
    if len({x.scenario.kv_dtype for x in answers}) > 1:
        parts.append(f"{a.scenario.kv_dtype} KV")
    if len({x.scenario.model for x in answers}) > 1:
        parts.insert(0, a.scenario.model)
    if len({x.scenario.table_bytes for x in answers}) > 1 and a.scenario.table_bytes:
        parts.append(f"{format_bytes(a.scenario.table_bytes)} table")
    return ", ".join(parts)


def plot_serving(run: Run, answers: Sequence[ServingAnswer] | None = None, tpot_ms: float | None = None) -> Plot | None:
    answers = list(answers) if answers is not None else serving_verdict(run.records, tpot_ms)
    if not any(len(pl.points) >= 2 for a in answers for pl in (a.host, a.hbm)):
        return None
    fig = Figure(figsize=(WIDTH_IN, KEY_HEIGHT_IN), layout="constrained")
    ax_tok, ax_tpot = fig.subplots(1, 2)
    title = "What the placement buys: tokens/s and TPOT against batch"
    fig.suptitle(title + (f"\n({FUNCTIONAL_NOTE})" if run.functional else ""), fontsize=12,
                 color="#a00" if run.functional else "black")
    targets = sorted({a.tpot_ms for a in answers})
    for i, a in enumerate(answers):
        for pl in (a.host, a.hbm):
            pts = sorted(pl.points, key=lambda p: p.serve_batch)
            if not pts:
                continue
            style = {"color": COLOURS.get(pl.placement, "gray"), "linestyle": LINESTYLES[i % len(LINESTYLES)],
                     "marker": MARKERS[i % len(MARKERS)], "markersize": 5}
            predicted = any(p.source != "measured" for p in pts)
            label = f"{pl.name}, {_scenario_label(a, answers)}" + (" (predicted)" if predicted else "")
            xs = [p.serve_batch for p in pts]
            ax_tok.plot(xs, [p.tokens_per_s for p in pts], label=label, **style)
            ax_tpot.plot(xs, [p.tpot_ms for p in pts], label=label, **style)
            slo = pl.under(a.tpot_ms)
            if slo is not None:
                for ax, y in ((ax_tok, slo.tokens_per_s), (ax_tpot, slo.tpot_ms)):
                    ax.plot([slo.serve_batch], [y], marker="*", markersize=13, color=style["color"],
                            markeredgecolor="black", linestyle="none",
                            label="the largest batch under the TPOT target")
    for t in targets:
        ax_tpot.axhline(t, color="black", linestyle=":", linewidth=1.2, label=f"TPOT target {t:g} ms")
    ax_tok.set_ylabel("tokens/s (sequences ÷ step)")
    ax_tpot.set_ylabel("TPOT ms (the whole decode step)")
    for ax in (ax_tok, ax_tpot):
        ax.set_xlabel("sequences in the step (batch)")
        ax.set_ylim(bottom=0)
        ax.set_xlim(left=0)
        ax.grid(True, alpha=0.3)
    handles: dict[str, object] = {}
    for ax in (ax_tok, ax_tpot):
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(list(handles.values()), list(handles.keys()), loc="outside right upper", fontsize=8)
    caption = ("Each placement at the serving suite's fractions (¼, ½, ¾, 1) of the largest batch it holds "
               "(the capacity rule's), the whole decode step on one timer: left the tokens/s it serves "
               "(one token per sequence per step), right its TPOT. Blue: the table in pinned host memory; "
               "red: the table in HBM. Stars: the largest batch under the TPOT target (dotted line), "
               "interpolated linearly in batch between two measured batches where it falls between them.")
    return Plot("serving", title, caption, figure_uri(fig, PLOT_DPI), section="serving",
                legend_entries=len(handles), series_total=len(handles))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ple_bench.report.plots_serving",
                                     description="write a serving run's tokens/s and TPOT plot as a PNG")
    parser.add_argument("run_dir")
    parser.add_argument("--out", required=True, help="the PNG to write")
    parser.add_argument("--tpot-ms", type=float, help="the TPOT target (default 30)")
    args = parser.parse_args(argv)
    try:
        plot = plot_serving(load_run(args.run_dir), tpot_ms=args.tpot_ms)
    except BadRunError as exc:
        print(f"ple_bench plots_serving: {exc}", file=sys.stderr)
        return 2
    if plot is None:
        print(f"ple_bench plots_serving: {args.run_dir} has no serve records with two or more batches of a "
              "placement", file=sys.stderr)
        return 2
    Path(args.out).write_bytes(base64.b64decode(plot.data_uri.split(",", 1)[1]))
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
