"""Two plots of a stored run: what real traffic does to a table (:func:`plot_traffic`) and what a
memory-bound decoder step does to the answer (:func:`plot_decoder`).  Each is drawn only when the
run holds what it needs (real-text and synthetic ids measured at two or more token counts; decoder
steps with a verdict at two or more token counts); the report shows them beside the others
(:func:`ple_bench.report.gallery.make_plots`).

``python -m ple_bench.report.plots_traffic RUN_DIR --traffic PNG --decoder PNG`` writes them as
files (the docs' figures: docs/traffic-h200.png, docs/decoder.png).
"""

from __future__ import annotations

import argparse
import base64
import io
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator

from .data import Run, fmt_bytes, load_run
from .plots import MARKERS, PLOT_DPI, WIDTH_IN, Plot
from .sections import hit_rate, lookups
from ..verdict import EQUAL_PCT, candidates, compute_label, compute_of, picks, scope

HEIGHT_IN = 4.4


def _uri(fig: Figure) -> str:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=PLOT_DPI, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _tokens_axis(ax: Any, tokens: Sequence[float]) -> None:
    """A log2 x axis ticked at the token counts measured."""
    ax.set_xscale("log", base=2)
    ticks = sorted(set(tokens))
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([f"{int(t)}" for t in ticks])
    ax.set_xlabel("tokens per step (log scale)")
    ax.grid(True, which="major", alpha=0.3)


def _real(ids: str) -> bool:
    return ids.startswith("text:")


def _ids_style(ids: str, index: int) -> dict[str, Any]:
    """Real text solid, synthetic laws dashed, one colour and marker per workload."""
    return {"color": f"C{index % 10}", "marker": MARKERS[index % len(MARKERS)], "markersize": 5,
            "linestyle": "-" if _real(ids) else "--", "label": ids + ("" if _real(ids) else " (synthetic)")}


def _median_by(records: Sequence[dict[str, Any]], value) -> dict[str, dict[float, float]]:
    """ids -> tokens -> the median of ``value(record)`` over the records (None values left out)."""
    acc: dict[str, dict[float, list[float]]] = {}
    for r in records:
        v, t = value(r), r.num_tokens
        if v is not None and t is not None:
            acc.setdefault(str(r.get("ids") or "uniform"), {}).setdefault(t, []).append(v)
    return {ids: {t: statistics.median(vs) for t, vs in sorted(by.items())} for ids, by in acc.items()}


def traffic_series(run: Run) -> tuple[dict[str, dict[float, float]], dict[str, dict[float, float]], int | None]:
    """(unique-rows fraction, hot-cache hit rate, the cache's rows), each ids -> tokens -> median over
    the run's lookups (the unique fraction is the workload's: every path's lookups of it count)."""
    recs = lookups(run)
    unique = _median_by(recs, lambda r: r.unique_rows_fraction)
    cached = [r for r in recs if hit_rate(r) is not None]
    rows = {int(r.cache_rows or 0) for r in cached}
    return unique, _median_by(cached, hit_rate), (max(rows) if rows else None)


def plot_traffic(run: Run) -> Plot | None:
    """Unique rows per batch and the hot cache's hit rate vs tokens, real text beside synthetic laws."""
    unique, hits, cache_rows = traffic_series(run)
    drawn = {ids: by for ids, by in unique.items() if len(by) >= 2}
    if not any(_real(i) for i in drawn) or all(_real(i) for i in drawn):
        return None
    panels = [("unique rows / rows per batch", drawn)]
    if sum(len(by) >= 2 for by in hits.values()) >= 2:
        panels.append((f"hot-cache hit rate ({cache_rows / 2**20:g} M rows, learned on warm-up text)",
                       {i: by for i, by in hits.items() if len(by) >= 2}))
    fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN), layout="constrained")
    axes = list(fig.subplots(1, len(panels), squeeze=False)[0])
    order = sorted(set().union(*(p[1] for p in panels)), key=lambda i: (not _real(i), i))
    for ax, (title, series) in zip(axes, panels):
        tokens: list[float] = []
        for ids in order:
            if ids in series:
                by = series[ids]
                ax.plot(list(by), list(by.values()), **_ids_style(ids, order.index(ids)))
                tokens += list(by)
        _tokens_axis(ax, tokens)
        ax.set_ylim(0, 1.05)
        ax.set_title(title, fontsize=10)
    axes[0].set_ylabel("fraction")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize=8)
    fig.suptitle(f"Real traffic vs synthetic ids ({run.run_id})", x=0.02, ha="left", fontsize=11)
    caption = ("Per id workload, the median over the run's lookups at each token count: the distinct rows of a "
               "batch over its rows (unique_rows_fraction, from the ids looked up) and the hot-row cache's hit rate "
               "(learned on the warm-up part of the traffic, never the measured ids). Solid: Engram n-grams of real "
               "text; dashed: synthetic laws.")
    return Plot("traffic", "Real traffic vs synthetic ids", caption, _uri(fig), section="general",
                legend_entries=len(labels), series_total=len(labels))


def _decoder(c: Any) -> bool:
    return isinstance(c, tuple) and c[0] == "decoder"


def decoder_share(run: Run) -> tuple[str, str, dict[Any, dict[float, float]]]:
    """(the record field, its words, compute -> tokens -> the median over the run's decoder steps): the
    share of the read-only HBM ceiling where the run measured one, else of the D2D copy ceiling."""
    steps = [r for r in run.ok if r.get("kind") == "step" and str(r.get("compute") or "") == "decoder"]
    field, words = "compute_pct_of_hbm_read", "% of the run's HBM read ceiling (bytes read)"
    if not any(r.compute_pct_of_hbm_read is not None for r in steps):
        field = "compute_pct_of_d2d"
        words = "% of the run's D2D copy ceiling (read + write: no read ceiling in this run)"
    acc: dict[Any, dict[float, list[float]]] = {}
    for r in steps:
        v, t = getattr(r, field), r.num_tokens
        if v is not None and t is not None:
            acc.setdefault(compute_of(r), {}).setdefault(t, []).append(v)
    return field, words, {c: {t: statistics.median(v) for t, v in sorted(by.items())} for c, by in acc.items()}


def plot_decoder(run: Run) -> Plot | None:
    """Per decoder compute (layers x context): the best stable pinned step and the resident step it is
    held against vs tokens, the pinned cost over HBM, and how memory-bound the layers are."""
    cands = candidates(run.ok)
    where = scope([r for r in cands if _decoder(compute_of(r))])
    if where is None:
        return None
    computes = [c for c in where.compute_us if _decoder(c)]
    chosen = {c: picks(cands, where, c) for c in computes}
    chosen = {c: p for c, p in chosen.items() if len(p) >= 2}
    if not chosen:
        return None
    _field, share_words, share = decoder_share(run)
    fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN), layout="constrained")
    ax_ms, ax_pct, ax_bw = fig.subplots(1, 3)
    order = sorted(chosen, key=lambda c: (c[3], c[2]))
    tokens: list[float] = []
    for i, c in enumerate(order):
        ts = sorted(chosen[c])
        tokens += ts
        color, marker = f"C{i % 10}", MARKERS[i % len(MARKERS)]
        label = f"{c[2]} layers, {c[3]}-token context"
        ax_ms.plot(ts, [chosen[c][t].step_ms for t in ts], color=color, marker=marker, label=f"{label}: pinned")
        ax_ms.plot(ts, [chosen[c][t].baseline_ms for t in ts], color=color, marker=marker, linestyle=":",
                   label=f"{label}: HBM")
        ax_pct.plot(ts, [chosen[c][t].overhead_pct for t in ts], color=color, marker=marker)
        if c in share:
            ax_bw.plot(list(share[c]), list(share[c].values()), color=color, marker=marker)
    ax_ms.set_ylim(bottom=0)
    ax_ms.set_ylabel("step time (ms)")
    ax_ms.set_title("best stable pinned step (solid) vs HBM (dotted)", fontsize=10)
    ax_pct.axhline(EQUAL_PCT, color="grey", linewidth=1, linestyle="--")
    ax_pct.axhline(0, color="black", linewidth=0.8)
    ax_pct.set_ylabel("pinned step / HBM step - 1 (%)")
    ax_pct.set_title(f"cost of the pinned table (dashed: {EQUAL_PCT:.0f} %)", fontsize=10)
    ax_bw.axhline(100, color="grey", linewidth=1, linestyle="--")
    ax_bw.set_ylabel(share_words.split(" (")[0])
    ax_bw.set_title("the layers' HBM share (median of the steps)", fontsize=9)
    for ax in (ax_ms, ax_pct, ax_bw):
        _tokens_axis(ax, tokens)
    handles, labels = ax_ms.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize=8)
    fig.suptitle(f"Decoder layers: {fmt_bytes(where.table_bytes)} table, {where.ids} ids ({run.run_id})", x=0.02,
                 ha="left", fontsize=11)
    caption = ("Per decoder compute (" + "; ".join(compute_label(c) for c in order) + "), at each token count the "
               "fastest stable pinned step and the resident step it is held against (offload_baseline: ids on the "
               "device, its best graph mode, the pinned step's timer), their ratio, and the layers' memory "
               f"bandwidth as {share_words}.")
    return Plot("decoder", "Decoder layers: pinned vs HBM", caption, _uri(fig), section="overlap",
                legend_entries=len(labels), series_total=len(labels))


def _write(plot: Plot | None, path: str, what: str) -> int:
    if plot is None:
        print(f"error: the run holds no {what} to plot", file=sys.stderr)
        return 2
    Path(path).write_bytes(base64.b64decode(plot.data_uri.split(",", 1)[1]))
    print(f"{path}: {plot.caption}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ple_bench.report.plots_traffic", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir")
    p.add_argument("--traffic", metavar="PNG", help="write the real-traffic plot here")
    p.add_argument("--decoder", metavar="PNG", help="write the decoder plot here")
    args = p.parse_args(argv)
    if not (Path(args.run_dir) / "meta.json").exists():
        print(f"error: run_dir: not a run folder (no meta.json): {args.run_dir}", file=sys.stderr)
        return 2
    run = load_run(args.run_dir)
    rc = 0
    if args.traffic:
        rc = max(rc, _write(plot_traffic(run), args.traffic, "real-text and synthetic lookups"))
    if args.decoder:
        rc = max(rc, _write(plot_decoder(run), args.decoder, "decoder steps with a verdict"))
    return rc


if __name__ == "__main__":
    sys.exit(main())
