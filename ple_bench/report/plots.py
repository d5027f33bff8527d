"""Plots of a stored run, drawn with matplotlib's Agg canvas (no pyplot state,
no display) and returned as inline ``data:image/png;base64`` URIs.

Each plot is drawn only when the data holds what it needs (at least two values
along its x axis in one series); otherwise it is left out and the report says
nothing about it.  Lines never mix cases that differ in an unnamed axis: see
:func:`ple_bench.report.data.slice_series`.
"""

from __future__ import annotations

import base64
import io
import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator

from ..record import Record, as_record, device_resident
from .data import (
    REFERENCE_PATH, Run, axis_value, fmt, fmt_bytes, is_number, pairs, points, single_rank, slice_series, topology,
    topology_label,
)
from .sections import decode_steps, path_groups, path_of, step_config_axes, step_config_label, workload_label
from ..verdict import EQUAL_PCT, candidates, compute_label, first_scope, key_of, scope, verdicts

DPI = 96  # the advise page's inline plots
# The report's plots: drawn for the page's full width (WIDTH_IN inches at 96 px/inch, about 1230 px)
# and stored at PLOT_DPI, so the enlarged view (click on a plot) shows them half as large again.
PLOT_DPI = 144
WIDTH_IN = 12.8
KEY_HEIGHT_IN = 5.2  # the plot in the first screen: about 500 px high at the page's width
MAX_LEGEND = 8  # legend entries of a plot as the page shows it; the rest in its "all series" version
LINESTYLES = {"bf16": "-", "fp8": "--", "fp16": ":", "fp32": "-."}
MARKERS = "os^Dv<>pPX"
FUNCTIONAL_NOTE = "CPU functional run, host timer: not GPU performance"


@dataclass
class Plot:
    key: str
    title: str
    caption: str
    data_uri: str
    section: str = "general"  # general | paths | overlap: where the page shows it
    legend_entries: int = 0  # entries in the image's legend (the page emits it as data-legend-entries)
    series_total: int = 0  # series the data has; more than legend_entries: ``full`` draws them all
    full: "Plot | None" = None  # the same plot with every series, when the page's version leaves some out


def figure_uri(fig: Figure, dpi: int = DPI) -> str:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _figure(ncols: int, title: str, run: Run, height: float = 4.3) -> tuple[Figure, list[Any]]:
    fig = Figure(figsize=(WIDTH_IN, height), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    _suptitle(fig, title, run)
    return fig, list(axes)


def _suptitle(fig: Figure, title: str, run: Run, **kw: Any) -> None:
    fig.suptitle(title + (f"\n({FUNCTIONAL_NOTE})" if run.functional else ""), fontsize=12,
                 color="#a00" if run.functional else "black", **kw)


_bytes_formatter = FuncFormatter(lambda v, _pos: fmt_bytes(v))
_plain_formatter = FuncFormatter(lambda v, _pos: fmt(v, 3))


def _pick(scores: dict[str, tuple[str, float]], limit: int = MAX_LEGEND,
          keep: Sequence[str] = ()) -> list[str]:
    """The series a plot shows when it has more than ``limit``: the best one per path (lowest
    score; ``scores``: label -> (path, score)), best paths first, after the labels in ``keep``
    (the reference lines), at most ``limit`` in all."""
    chosen = [k for k in keep if k in scores][:limit]
    best: dict[str, tuple[float, str]] = {}
    for label, (path, score) in scores.items():
        if path not in best or (score, label) < best[path]:
            best[path] = (score, label)
    kept_paths = {scores[k][0] for k in chosen}
    for _score, label in sorted(v for p, v in best.items() if p not in kept_paths):
        if len(chosen) >= limit:
            break
        chosen.append(label)
    return chosen


def _with_full(draw: Callable[[set[str] | None], tuple[Figure, int]], scores: dict[str, tuple[str, float]],
               make: Callable[[str, int, int], Plot], keep: Sequence[str] = (),
               full_note: str = "") -> Plot:
    """A plot with at most MAX_LEGEND series and, when the data has more, the same plot with all
    of them as its ``full`` version.  ``draw(labels)`` draws the series named (None: all) and
    returns the figure and its legend entries; ``make(uri, entries, total)`` wraps a drawn figure."""
    total = len(scores)
    if total <= MAX_LEGEND:
        fig, entries = draw(None)
        return make(figure_uri(fig, PLOT_DPI), entries, total)
    shown = _pick(scores, keep=keep)
    fig, entries = draw(set(shown))
    plot = make(figure_uri(fig, PLOT_DPI), entries, total)
    fig_full, entries_full = draw(None)
    plot.full = make(figure_uri(fig_full, PLOT_DPI), entries_full, total)
    plot.full.caption = full_note or f"All {total} series of the plot above."
    plot.caption += (f" Shown: the best configuration of each path ({entries} of {total} series; all of "
                     "them under “all series” below).")
    return plot


def _legend_height(entries: int, base: float) -> float:
    """A figure tall enough for a right-hand legend of ``entries`` lines."""
    return max(base, 0.9 + 0.2 * entries)


MAX_TICKS = 7


def _data_ticks(axis: Any, values: Sequence[float], formatter: Any, log: bool = True) -> None:
    """Ticks at the values measured (64, 256, 512 tokens; the table sizes run), not at powers of
    two; where they crowd (closer than a sixth of the axis' span), the first, the last and those
    far enough apart."""
    vals = sorted({float(v) for v in values if v is not None and (v > 0 or not log)})
    if len(vals) > 1:
        where = [math.log(v) if log else v for v in vals]
        gap = (where[-1] - where[0]) / (MAX_TICKS - 1)
        kept = [0]
        for i in range(1, len(vals)):
            if where[i] - where[kept[-1]] >= gap * 0.999:
                kept.append(i)
        if kept[-1] != len(vals) - 1:  # the last value always: in place of a neighbour too close to it
            kept[-1 if len(kept) > 1 else len(kept):] = [len(vals) - 1]
        axis.set_major_locator(FixedLocator([vals[i] for i in kept]))
        axis.set_minor_locator(NullLocator())
    axis.set_major_formatter(formatter)
    axis.set_minor_formatter(NullFormatter())


def _log_value_ticks(axis: Any, values: Sequence[float]) -> None:
    """A log value axis labelled with plain numbers (0.2, 0.5, 1, 2) instead of 2×10⁻¹: more
    ticks per decade the narrower the range."""
    pos = [v for v in values if v is not None and v > 0]
    if not pos:
        return
    decades = math.log10(max(pos) / min(pos)) if min(pos) > 0 else 0.0
    subs = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0) if decades < 1 else (1.0, 2.0, 5.0) if decades < 3 else (1.0,)
    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_minor_locator(NullLocator())
    axis.set_major_formatter(_plain_formatter)
    axis.set_minor_formatter(NullFormatter())


def _style(key_values: dict[str, Any], index: int) -> dict[str, Any]:
    return {
        "linestyle": LINESTYLES.get(str(key_values.get("dtype")), "-"),
        "marker": MARKERS[index % len(MARKERS)],
        "color": f"C{index % 10}",
        "markersize": 5,
    }


def _has_sweep(records: Sequence[dict[str, Any]], x: str, y: str, series_axes: Sequence[str]) -> bool:
    """Whether at least one series (as the plot will group them) has two or more x values."""
    recs = [r for r in map(as_record, records) if is_number(r.get(x)) and is_number(r.get(y))]
    if len({float(r.get(x)) for r in recs}) < 2:
        return False
    sl = slice_series(recs, x, series_axes)
    return any(len(points(rs, x, y)) >= 2 for rs in sl.series.values())


def finish_axes(ax: Any, xlabel: str, ylabel: str, *, logx: bool = False, logy: bool = False,
            xbase: int = 10, bytes_x: bool = False) -> None:
    """Scales, labels and ticks: a log x axis is ticked at the x values drawn (the token counts or
    table sizes measured), a log y axis with plain numbers."""
    if logx:
        ax.set_xscale("log", base=xbase)
    if logy:
        ax.set_yscale("log")
    xs = [float(x) for line in ax.get_lines() for x in line.get_xdata()]
    ys = [float(y) for line in ax.get_lines() for y in line.get_ydata()]
    if logx:
        _data_ticks(ax.xaxis, xs, _bytes_formatter if bytes_x else _plain_formatter)
    elif bytes_x:
        ax.xaxis.set_major_formatter(_bytes_formatter)
    if logy:
        _log_value_ticks(ax.yaxis, ys)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="major", alpha=0.3)


def _caption(base: str, fixed: str) -> str:
    return base + (f" Pinned to keep lines comparable: {fixed}." if fixed else "")


def _lookups(run: Run) -> list[dict[str, Any]]:
    recs = [r for r in run.ok if (r.get("kind") or "lookup") == "lookup"]
    single = [r for r in recs if single_rank(r)]
    return single or recs


def _path_colors(run: Run) -> dict[str, str]:
    """One colour per lookup path, the same in every plot of the run (paths sorted by name)."""
    paths = sorted({path_of(r) for r in run.ok})
    return {p: f"C{i % 10}" for i, p in enumerate(paths)}


def _figure_legend(fig: Figure, axes: Sequence[Any], title: str | None = None) -> int:
    """One legend for all panels, outside on the right (labels deduplicated); returns its entries."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    if handles:
        fig.legend(list(handles.values()), list(handles.keys()), loc="outside right upper", fontsize=8,
                   title=title, title_fontsize=8)
    return len(handles)


#: a ceiling's name in words (the plots' labels), by the stored name's stem
CEILING_WORDS = {"h2d_gbps": "host-to-device copy", "d2h_gbps": "device-to-host copy", "d2d_gbps": "HBM copy",
                 "pinned_random_row_gbps": "random rows from pinned memory",
                 "device_random_row_gbps": "random rows from HBM", "host_memcpy_gbps": "host memcpy"}


def ceiling_words(name: str) -> str:
    """``pinned_random_row_gbps_160B`` -> ``random rows from pinned memory (160 B rows)``."""
    for stem, words in CEILING_WORDS.items():
        if name == stem:
            return words
        if name.startswith(stem + "_") and name.endswith("B") and name[len(stem) + 1:-1].isdigit():
            return f"{words} ({name[len(stem) + 1:-1]} B rows)"
    return name.replace("_gbps", "").replace("_", " ")


def _ceiling_lines(ax: Any, hits: Sequence[tuple[str, float]], color: str = "0.35") -> None:
    """Each ceiling a dashed line with its name in words at the left, on a white box so no line
    crosses it; of two ceilings within a factor 1.6 the lower one's label goes under its line."""
    hits = sorted(hits, key=lambda kv: kv[1])
    for i, (name, value) in enumerate(hits):
        ax.axhline(value, color=color, linestyle=(0, (4, 2 + i)), linewidth=1)
        close_above = i + 1 < len(hits) and hits[i + 1][1] < value * 1.6
        ax.annotate(f"{ceiling_words(name)}: {fmt(value, 3)} GB/s", xy=(0.005, value),
                    xycoords=("axes fraction", "data"), xytext=(2, -2 if close_above else 2),
                    textcoords="offset points", ha="left", va="top" if close_above else "bottom", fontsize=7,
                    color="0.2", bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none",
                                       "alpha": 0.85})


def _row_ceiling_lines(ax: Any, run: Run, records: Sequence[dict[str, Any]]) -> None:
    """H2D copy and random-row ceilings at the records' row size (pinned and/or device)."""
    names: dict[str, float] = {}
    impls = {str(r.get("impl")) for r in records}
    rbs = {r.row_bytes for r in records}
    rb = rbs.pop() if len(rbs) == 1 else None
    if any(i.startswith("pinned") for i in impls):
        for base in ("h2d_gbps", "pinned_random_row_gbps"):
            hit = run.row_ceiling(base, rb)
            if hit:
                names[hit[0]] = hit[1]
    if "device" in impls:
        hit = run.row_ceiling("device_random_row_gbps", rb)
        if hit:
            names[hit[0]] = hit[1]
    _ceiling_lines(ax, list(names.items()))


def plot_bandwidth(run: Run, x: str, height: float = KEY_HEIGHT_IN) -> Plot | None:
    """GB/s along table size (or row size), one panel per token count, one line per path and dtype."""
    recs = [r for r in _lookups(run) if r.gbps is not None]
    dropped = []
    for keep, what_ in (
        (lambda r: not r.get("prefetch") and r.get("graph") in (None, "", "eager"), "prefetch / graph replays"),
        (lambda r: r.get("ids") in (None, "", "uniform"), "skewed ids"),
    ):
        subset = [r for r in recs if keep(r)]
        if subset and _has_sweep(subset, x, "gbps", ["path", "dtype"]):
            if len(subset) < len(recs):
                dropped.append(what_)
            recs = subset
    if x == "table_bytes":
        # Row shapes swept over at least three table sizes (others have no trend to show).
        shapes: dict[tuple, set] = {}
        for r in recs:
            shapes.setdefault((r.get("dtype"), r.get("dim")), set()).add(r.table_bytes)
        swept = {k for k, v in shapes.items() if len(v) >= 3}
        if swept and len(swept) < len(shapes):
            recs = [r for r in recs if (r.get("dtype"), r.get("dim")) in swept]
            dropped.append("row shapes measured at fewer than three table sizes")
    by_tokens: dict[float, list[dict[str, Any]]] = {}
    for r in recs:
        by_tokens.setdefault(r.num_tokens or 0.0, []).append(r)
    panels = [(t, rs) for t, rs in sorted(by_tokens.items()) if _has_sweep(rs, x, "gbps", ["path", "dtype"])]
    if not panels:
        return None
    panels = sorted(panels, key=lambda p: -len(p[1]))[:4]
    panels.sort(key=lambda p: p[0])
    what = "table size" if x == "table_bytes" else "row size"
    ncols = min(2, len(panels))
    nrows = (len(panels) + ncols - 1) // ncols
    colors = _path_colors(run)
    slices = [(tokens, slice_series(rs, x, ["path", "dtype"], max_series=10), rs) for tokens, rs in panels]
    scores: dict[str, tuple[str, float]] = {}
    for _tokens, sl, _rs in slices:
        for key, srs in sl.series.items():
            pts = points(srs, x, "gbps")
            if pts:
                label = sl.label(key)
                path = str(dict(zip(sl.label_axes, key)).get("path"))
                best = -max(p[1] for p in pts)
                scores[label] = (path, min(best, scores.get(label, (path, best))[1]))

    def draw(only: set[str] | None) -> tuple[Figure, int]:
        entries = len(scores) if only is None else len(only)
        fig = Figure(figsize=(WIDTH_IN, _legend_height(entries, height) if only is None else height),
                     layout="constrained")
        grid = fig.subplots(nrows, ncols, squeeze=False, sharey=True)
        axes = [ax for row in grid for ax in row]
        for ax in axes[len(panels):]:
            ax.set_visible(False)
        axes = axes[:len(panels)]
        _suptitle(fig, f"Lookup GB/s vs {what}", run)
        for ax, (tokens, sl, rs) in zip(axes, slices):
            for key, srs in sorted(sl.series.items(), key=lambda kv: str(kv[0])):
                pts = points(srs, x, "gbps")
                label = sl.label(key)
                if not pts or (only is not None and label not in only):
                    continue
                kv = dict(zip(sl.label_axes, key))
                path = str(kv.get("path"))
                ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colors.get(path, "C0"),
                        linestyle=LINESTYLES.get(str(kv.get("dtype")), "-"),
                        marker=MARKERS[sorted(colors).index(path) % len(MARKERS)] if path in colors else "o",
                        markersize=5, label=label)
            heads = {r.num_heads for r in rs}
            h = heads.pop() if len(heads) == 1 else None
            ax.set_title(f"{int(tokens)} tokens" + (f" × {int(h)} heads" if h and h > 1 else ""), fontsize=10)
            xlabel = "table size (log scale)" if x == "table_bytes" else "row size (log scale)"
            finish_axes(ax, xlabel, "GB/s (log scale)" if axes.index(ax) % ncols == 0 else "", logx=True, logy=True,
                    xbase=2, bytes_x=True)
            _row_ceiling_lines(ax, run, rs)
        return fig, _figure_legend(fig, axes)

    fixed_texts = [f"{int(tokens)} tokens: {sl.fixed_text()}" for tokens, sl, _rs in slices if sl.fixed]
    caption = ("Single-GPU lookups; one panel per token count, one colour per lookup path "
               "(impl · kernel), line style per dtype. Dashed horizontal lines: the H2D copy and random-row "
               "ceilings measured on this run at these rows' size.")
    if dropped:
        caption += " Left out here (see the tables): " + ", ".join(dropped) + "."
    if fixed_texts:
        caption += " Pinned to keep lines comparable — " + "; ".join(fixed_texts) + "."
    return _with_full(draw, scores, lambda uri, n, total: Plot(
        f"bandwidth_vs_{x}", f"GB/s vs {what}", caption, uri, legend_entries=n, series_total=total))


def plot_latency_vs_tokens(run: Run, height: float = 4.6) -> Plot | None:
    recs = [r for r in _lookups(run) if r.median_ms is not None]
    plain = [r for r in recs if not r.get("prefetch") and r.get("graph") in (None, "", "eager")]
    recs = plain if _has_sweep(plain, "num_tokens", "median_ms", ["path", "dtype"]) else recs
    if not _has_sweep(recs, "num_tokens", "median_ms", ["path", "dtype"]):
        return None
    colors = _path_colors(run)
    sl = slice_series(recs, "num_tokens", ["path", "dtype"])
    series = {sl.label(key): (key, rs) for key, rs in sl.series.items() if points(rs, "num_tokens", "median_ms")}
    # best: the lowest median time, relative to the others at the same token counts
    scores = {label: (str(dict(zip(sl.label_axes, key)).get("path")),
                      statistics.median(p[1] for p in points(rs, "num_tokens", "median_ms")))
              for label, (key, rs) in series.items()}

    def draw(only: set[str] | None) -> tuple[Figure, int]:
        entries = len(series) if only is None else len(only)
        fig = Figure(figsize=(WIDTH_IN, _legend_height(entries, height) if only is None else height),
                     layout="constrained")
        ax = fig.subplots()
        _suptitle(fig, "Lookup latency vs tokens", run)
        for i, (label, (key, rs)) in enumerate(sorted(series.items(), key=lambda kv: str(kv[1][0]))):
            if only is not None and label not in only:
                continue
            kv = dict(zip(sl.label_axes, key))
            style = _style(kv, i)
            style["color"] = colors.get(str(kv.get("path")), style["color"])
            pts = points(rs, "num_tokens", "median_ms")
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            lo, hi = dict(points(rs, "num_tokens", "p10_ms")), dict(points(rs, "num_tokens", "p90_ms"))
            if all(v in lo and v in hi for v in xs):
                yerr = [[max(0.0, yv - lo[xv]) for xv, yv in pts], [max(0.0, hi[xv] - yv) for xv, yv in pts]]
                ax.errorbar(xs, ys, yerr=yerr, capsize=2, label=label, **style)
            else:
                ax.plot(xs, ys, label=label, **style)
        finish_axes(ax, "tokens per step (per DP rank, log scale)", "median latency (ms, log scale)",
                logx=True, logy=True, xbase=2)
        return fig, _figure_legend(fig, [ax])

    caption = _caption("Median lookup time; bars span the 10th to 90th percentile of the samples.", sl.fixed_text())
    return _with_full(draw, scores, lambda uri, n, total: Plot(
        "latency_vs_tokens", "Latency vs tokens", caption, uri, legend_entries=n, series_total=total))


def plot_paths(run: Run, max_groups: int = 10) -> Plot | None:
    """Grouped bars: every lookup path at each workload measured on 3+ paths (else 2+):
    GB/s against the ceilings, and speed relative to the default pinned path."""
    groups = path_groups(run, min_paths=3) or path_groups(run, min_paths=2)
    if not groups:
        return None
    order = {g.key: i for i, g in enumerate(groups)}
    groups = sorted(groups, key=lambda g: -len(g.records))[:max_groups]
    groups.sort(key=lambda g: order[g.key])
    colors = _path_colors(run)
    has_ref = any(g.reference is not None for g in groups)
    # a path's score: its median time relative to the fastest path's, over the workloads it ran
    rel: dict[str, list[float]] = {}
    for g in groups:
        t0 = g.fastest.median_ms
        for r in g.records:
            rel.setdefault(path_of(r), []).append(r.median_ms / t0)
    scores = {p: (p, statistics.median(v)) for p, v in rel.items()}

    def draw(only: set[str] | None) -> tuple[Figure, int]:
        paths = sorted(p for p in scores if only is None or p in only or p == REFERENCE_PATH)
        fig = Figure(figsize=(WIDTH_IN, 7.6 if has_ref else 4.4), layout="constrained")
        axes = list(fig.subplots(2 if has_ref else 1, 1, squeeze=False, sharex=True)[:, 0])
        _suptitle(fig, "Lookup paths side by side", run)
        width = 0.8 / len(paths)
        for gi, g in enumerate(groups):
            ref = g.reference
            for r in g.records:
                if path_of(r) not in paths:
                    continue
                pi = paths.index(path_of(r))
                xpos = gi + (pi - (len(paths) - 1) / 2) * width
                axes[0].bar(xpos, r.gbps or 0.0, width=width, color=colors[path_of(r)],
                            label=path_of(r))
                if has_ref and ref is not None:
                    speed = ref.median_ms / r.median_ms
                    axes[1].bar(xpos, speed, width=width, color=colors[path_of(r)], label=path_of(r))
        rbs = {g.fastest.row_bytes for g in groups}
        rb = rbs.pop() if len(rbs) == 1 else None
        hits = [run.row_ceiling(base, rb) for base in ("h2d_gbps", "pinned_random_row_gbps")]
        _ceiling_lines(axes[0], [(h[0], h[1]) for h in hits if h], color="0.3")
        axes[0].set_yscale("log")
        _log_value_ticks(axes[0].yaxis, [p.get_height() for p in axes[0].patches])
        axes[0].set_ylabel("GB/s (log scale)")
        axes[0].set_title("GB/s (rows moved × row bytes / median time)", fontsize=10)
        axes[0].grid(True, axis="y", which="major", alpha=0.3)
        if has_ref:
            axes[1].axhline(1.0, color="0.3", linewidth=1)
            axes[1].set_yscale("log")
            _log_value_ticks(axes[1].yaxis, [p.get_height() for p in axes[1].patches] + [1.0])
            axes[1].yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}×"))
            axes[1].set_ylabel(f"speed vs {REFERENCE_PATH}\n(>1 faster, log scale)")
            axes[1].set_title(f"speed relative to {REFERENCE_PATH} at the same workload", fontsize=10)
            axes[1].grid(True, axis="y", which="major", alpha=0.3)
        same_shape = len({(g.fastest.dtype, g.fastest.row_bytes) for g in groups}) == 1
        labels = [workload_label(g.fastest, with_shape=not same_shape).replace(" tokens × ", " tok × ")
                  .replace(" heads", " h").replace(", ", "\n") for g in groups]
        axes[-1].set_xticks(range(len(groups)), labels, fontsize=8)
        if same_shape:
            f = groups[0].fastest
            axes[0].set_title(f"GB/s (rows moved × row bytes / median time) — {f.get('dtype')}, "
                              f"{fmt(f.row_bytes)} B rows", fontsize=10)
        return fig, _figure_legend(fig, axes)

    caption = ("Single-GPU lookups; each group is one workload (same dtype, row size, table size, tokens, heads, "
               "ids, graph and prefetch setting) measured on several paths (impl · kernel; kernel \"\" is the "
               "backend's default). Dashed lines: the H2D copy and pinned random-row ceilings at this row size. "
               "Exact numbers and % of every ceiling are in the table below.")
    return _with_full(draw, scores, lambda uri, n, total: Plot(
        "paths", "Lookup paths side by side", caption, uri, section="paths", legend_entries=n,
        series_total=total), keep=[REFERENCE_PATH])


_STEP_STYLES = {(True, "eager"): "-", (True, "breakable"): "--", (True, "full"): "-.",
                (False, "eager"): ":", (False, "breakable"): ":", (False, "full"): ":"}


def _step_scores(series: dict[str, list[dict[str, Any]]], y: str) -> dict[str, tuple[str, float]]:
    """label -> (path, median of y over its points); resident steps score as their own 'path'."""
    out = {}
    for label, srs in series.items():
        ys = [getattr(r, y) for r in srs if getattr(r, y) is not None]
        if ys:
            r0 = srs[0]
            out[label] = (path_of(r0) + (" (resident)" if device_resident(r0) else ""), statistics.median(ys))
    return out


def plot_step_overlap(run: Run) -> list[Plot]:
    """Per token count at the decode shape: exposed lookup time, overlap
    efficiency (0–100%) and compute slowdown vs compute_us, one line per
    path / prefetch / graph mode / stream priority."""
    recs, shape = decode_steps(run)
    recs = [r for r in recs if r.compute_us is not None]
    if not recs:
        return []
    axes_names = step_config_axes(recs, with_table=True)
    by_tokens: dict[float, list[dict[str, Any]]] = {}
    for r in recs:
        by_tokens.setdefault(r.num_tokens or 0.0, []).append(r)
    colors = _path_colors(run)
    out = []
    for tokens, rs in sorted(by_tokens.items()):
        panels = [(y, label) for y, label in (
            ("exposed_ms", "exposed lookup time (ms)"),
            ("overlap_efficiency", "overlap efficiency (%)"),
            ("compute_slowdown", "compute slowdown (%)"),
        ) if sum(1 for r in rs if getattr(r, y) is not None) >= 2]
        titles = {"exposed_ms": "lookup time not hidden", "overlap_efficiency": "1 − exposed / exposed without prefetch",
                  "compute_slowdown": "in-step compute / compute alone − 1"}
        if not panels or len({r.compute_us for r in rs}) < 2:
            continue
        series: dict[str, list[dict[str, Any]]] = {}
        for r in rs:
            series.setdefault(step_config_label(r, axes_names), []).append(r)
        exposed = [r.exposed_ms for r in rs if r.exposed_ms is not None]
        positive = [v for v in exposed if v > 0]
        log_exposed = bool(positive) and max(positive) / min(positive) > 20
        floor = min(positive) / 2 if positive else 0.0
        scores = _step_scores(series, "exposed_ms" if exposed else "step_ms")

        def draw(only: set[str] | None, tokens=tokens, panels=panels, series=series, log_exposed=log_exposed,
                 floor=floor, titles=titles) -> tuple[Figure, int]:
            entries = len(series) if only is None else len(only)
            fig = Figure(figsize=(WIDTH_IN, _legend_height(entries, 4.4) if only is None else 4.4),
                         layout="constrained")
            axes = list(fig.subplots(1, len(panels), squeeze=False)[0])
            _suptitle(fig, f"Decode step at {int(tokens)} tokens" + (f" ({shape})" if shape else ""), run)
            for si, (label, srs) in enumerate(sorted(series.items())):
                if only is not None and label not in only:
                    continue
                r0 = srs[0]
                style = {"color": colors.get(path_of(r0), "C0"),
                         "linestyle": _STEP_STYLES.get((bool(r0.get("prefetch")), str(r0.get("graph") or "eager")),
                                                       "-"),
                         "marker": MARKERS[si % len(MARKERS)], "markersize": 5}
                for ax, (y, _label) in zip(axes, panels):
                    scale = 100.0 if y in ("overlap_efficiency", "compute_slowdown") else 1.0
                    pts = points(srs, "compute_us", y)
                    if y == "compute_slowdown":
                        pts = [p for p in pts if p[0] > 0]  # no compute, nothing to slow
                    if y == "exposed_ms" and log_exposed:
                        pts = [(p[0], max(p[1], floor)) for p in pts]  # fully hidden: drawn at the floor
                    if pts:
                        ax.plot([p[0] for p in pts], [p[1] * scale for p in pts], label=label, **style)
            for ax, (y, label) in zip(axes, panels):
                ax.set_title(titles[y], fontsize=10)
                finish_axes(ax, "main-stream compute per step (µs)", label)
                _data_ticks(ax.xaxis, [float(x) for ln in ax.get_lines() for x in ln.get_xdata()],
                            _plain_formatter, log=False)
                if y == "overlap_efficiency":  # not clamped: below 0 when the prefetch slows the step
                    ax.set_ylim(min(-5.0, ax.get_ylim()[0]), max(105.0, ax.get_ylim()[1]))
                if y == "exposed_ms" and log_exposed:
                    ax.set_yscale("log")
                    _log_value_ticks(ax.yaxis, [float(v) for ln in ax.get_lines() for v in ln.get_ydata()])
                    ax.set_ylabel("exposed lookup time (ms, log scale; ≤ 0 drawn at the bottom)")
                if y == "compute_slowdown":
                    ax.axhline(0, color="0.4", linewidth=1)
            return fig, _figure_legend(fig, axes)

        caption = ("Synthetic decode steps: the lookup runs beside compute_us of main-stream work. Exposed time is "
                   "the part of the lookup not hidden by the compute; overlap efficiency the hidden share; compute "
                   "slowdown how much longer the compute takes with the lookup beside it (compute_us = 0 left out). "
                   "Colour: path; solid/dashed/dash-dot: prefetch with eager/breakable/full graph; dotted: no "
                   "prefetch.")
        out.append(_with_full(draw, scores, lambda uri, n, total, tokens=tokens, caption=caption: Plot(
            f"step_overlap_t{int(tokens)}", f"Overlap at {int(tokens)} tokens", caption, uri, section="overlap",
            legend_entries=n, series_total=total)))
    return out


#: the HBM reference's colour in the verdict's plot: no path gets it (paths take C0..C9)
HBM_COLOR = "black"


@dataclass
class VerdictRows:
    """What :func:`plot_verdict_rows` draws: per compute, per line name, (tokens, step ms, the
    verdict rests on it) points; the HBM reference's line names; each line's path (its colour)."""

    table_bytes: int
    ids: str
    computes: list[Any]
    panels: dict[Any, dict[str, list[tuple[float, float, bool]]]]
    hbm_names: list[str]
    name_path: dict[str, str]


def verdict_rows(run: Run) -> VerdictRows | None:
    """The verdict's own rows (report/verdict.py), as the banner states them: at the verdict's
    table and id distribution, the two longest compute lengths, per token count the HBM reference
    each verdict is held against (the resident figure on the verdict's timer) and per pinned path
    its best stable step on that timer.  None without verdicts."""
    entries = [e for e in verdicts(run.records) if e.ratio is not None]
    if not entries:
        return None
    head = first_scope(entries) or entries[:1]
    table, ids = head[0].table_bytes, head[0].ids
    computes = [c for c in dict.fromkeys(e.compute for e in entries if (e.table_bytes, e.ids) == (table, ids))][:2]
    at = {(e.compute, e.num_tokens): e for e in entries if (e.table_bytes, e.ids) == (table, ids)}
    if len({t for (_c, t) in at}) < 2:
        return None
    cands = candidates(run.records)
    name_path: dict[str, str] = {}  # a line's name -> its path (its colour: variants of a path share it)
    panels: dict[Any, dict[str, list[tuple[float, float, bool]]]] = {}
    for c in computes:
        lines: dict[str, list[tuple[float, float, bool]]] = {}
        hbm = sorted((float(t), float(e.resident_ms), False) for (cc, t), e in at.items() if cc == c)
        timers = sorted({str(e.timer) for (cc, _t), e in at.items() if cc == c})
        lines[f"HBM-resident ({', '.join(timers)} timer)"] = hbm
        best: dict[tuple[str, int], dict[str, Any]] = {}
        for r in cands:
            k = key_of(r)
            e = at.get((k[1], k[3]))
            if (k[0], k[2]) != (table, ids) or k[1] != c or e is None or str(r.get("timer")) != e.timer:
                continue
            name = path_of(r) + "".join(f" · {a}={b}" for a, b in sorted((r.get("extra") or {}).items()))
            name_path[name] = path_of(r)
            ratio = float(r["step_ms"]) / float(r["offload_baseline_ms"])
            old = best.get((name, k[3]))
            if old is None or ratio < float(old["step_ms"]) / float(old["offload_baseline_ms"]):
                best[(name, k[3])] = r
        for (name, t), r in sorted(best.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            lines.setdefault(name, []).append((float(t), float(r["step_ms"]), r.get("case_id") == at[(c, t)].pinned_case_id))
        panels[c] = lines
    names = list(dict.fromkeys(n for lines in panels.values() for n in lines))
    return VerdictRows(table, ids, computes, panels, [n for n in names if n.startswith("HBM-resident")], name_path)


def plot_verdict_rows(run: Run, height: float = KEY_HEIGHT_IN - 0.6) -> Plot | None:
    """:func:`verdict_rows` drawn: step time vs tokens, one panel per compute length, the HBM
    reference in its own colour (:data:`HBM_COLOR`, its +-band shaded), one colour per pinned
    path, the step a verdict rests on ringed; at most :data:`MAX_LEGEND` legend entries."""
    rows = verdict_rows(run)
    if rows is None:
        return None
    table, ids, computes, panels = rows.table_bytes, rows.ids, rows.computes, rows.panels
    hbm_names, name_path = rows.hbm_names, rows.name_path
    colors = _path_colors(run)
    names = list(dict.fromkeys(n for lines in panels.values() for n in lines))
    paths = [n for n in names if n not in hbm_names]
    # at most 8 legend entries: the HBM reference(s), then the paths whose best ratio is lowest
    score = {n: min(p[1] / max(1e-12, next((h[1] for lines in panels.values() for hn in hbm_names
                                               for h in lines.get(hn, []) if h[0] == p[0]), p[1]))
                    for lines in panels.values() for p in lines.get(n, [])) for n in paths}
    keep = set(hbm_names + sorted(paths, key=lambda n: score[n])[:MAX_LEGEND - len(hbm_names)])
    fig = Figure(figsize=(WIDTH_IN, height), layout="constrained")
    axes = list(fig.subplots(1, len(computes), squeeze=False)[0])
    _suptitle(fig, f"The verdict's rows: decode step vs tokens ({fmt_bytes(table)} table, {ids} ids)", run,
              x=0.02, ha="left")
    for ax, c in zip(axes, computes):
        for i, (name, pts) in enumerate(panels[c].items()):
            if name not in keep or not pts:
                continue
            pts = sorted(pts)
            hbm = name in hbm_names
            color = HBM_COLOR if hbm else colors.get(name_path.get(name, name), "C0")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, linewidth=2.6 if hbm else 1.4,
                    marker="s" if hbm else MARKERS[i % len(MARKERS)], markersize=5, label=name)
            rested = [p for p in pts if p[2]]
            if rested:
                ax.plot([p[0] for p in rested], [p[1] for p in rested], linestyle="none", marker="o", markersize=11,
                        markerfacecolor="none", markeredgecolor=color, markeredgewidth=1.5)
        if any(name in keep for name in hbm_names):
            hb = sorted(next(pts for n, pts in panels[c].items() if n in hbm_names))
            ax.fill_between([p[0] for p in hb], [p[1] * (1 - EQUAL_PCT / 100) for p in hb],
                            [p[1] * (1 + EQUAL_PCT / 100) for p in hb], color=HBM_COLOR, alpha=0.08, linewidth=0)
        ax.set_title(compute_label(c), fontsize=10)
        finish_axes(ax, "tokens per step (log scale)", "step time (ms, log scale)", logx=True, logy=True, xbase=2)
    n = _figure_legend(fig, axes)
    caption = ("The rows the verdict above is read from: per token count the HBM-resident step each verdict is held "
               f"against (thick black; the grey band: within {EQUAL_PCT:g} % of it) and, per pinned path, its best "
               "stable step on the same timer (one colour per path); a ring marks the step the verdict rests on.")
    return Plot("step_vs_tokens", "The verdict's rows", caption, figure_uri(fig, PLOT_DPI), section="overlap",
                legend_entries=n, series_total=len(names))


def plot_step_vs_tokens(run: Run, height: float = KEY_HEIGHT_IN, scoped: bool = True) -> Plot | None:
    """Decode-step time per path configuration vs tokens per step at the decode shape, one panel
    per compute time (the two largest measured), the HBM-resident steps drawn thick and black:
    where a pinned line meets the resident one, the table can leave HBM at that token count.

    ``scoped``: only the table size and id distribution the verdict speaks of
    (:func:`ple_bench.report.verdict.scope`), so the plot under the banner shows its rows; the
    unscoped plot (every table and id distribution) is made only where it differs."""
    recs, shape = decode_steps(run)
    recs = [r for r in recs if r.step_ms is not None and r.compute_us]
    where = scope(candidates(run.records))
    in_scope = [r for r in recs if where is not None and int(r.table_bytes or 0) == where.table_bytes
                and str(r.get("ids") or "uniform") == where.ids]
    if scoped and in_scope:
        recs = in_scope
        shape = ", ".join(x for x in (f"{fmt_bytes(where.table_bytes)} table", f"{where.ids} ids", shape) if x)
    elif not scoped and (not in_scope or len(in_scope) == len(recs)):
        return None
    computes = sorted({r.compute_us for r in recs})[-2:]
    recs = [r for r in recs if r.compute_us in computes]
    if len({r.num_tokens for r in recs}) < 2:
        return None
    axes_names = step_config_axes(recs, with_table=True)
    colors = _path_colors(run)
    # pinned steps timed on the host clock are held against the resident full graph on the same clock
    # (record.resident_figures): draw that figure too, or the page compares two clocks
    if any(str(r.get("timer")) == "host_sync" and not device_resident(r) for r in recs):
        recs = recs + [Record(r, step_ms=r.full_step_host_sync_ms, graph="full", _host_clock=True)
                       for r in recs if device_resident(r) and str(r.get("ids_on") or "device") == "device"
                       and r.full_step_host_sync_ms is not None]
    series = {cu: {} for cu in computes}
    for r in recs:
        label = step_config_label(r, axes_names) + (", full graph, host clock" if r.get("_host_clock") else "")
        series[r.compute_us].setdefault(label, []).append(r)
    series = {cu: {label: srs for label, srs in s.items() if len(points(srs, "num_tokens", "step_ms")) >= 2}
              for cu, s in series.items()}
    if not any(series.values()):
        return None
    scores: dict[str, tuple[str, float]] = {}
    for s in series.values():
        for label, (path, score) in _step_scores(s, "step_ms").items():
            scores[label] = (path, min(score, scores.get(label, (path, score))[1]))
    # the best resident configuration per place of the ids stays in the condensed plot: what the
    # others are held to (a step with host ids against the resident step with host ids)
    resident: dict[str, tuple[float, str]] = {}
    for label, (path, score) in scores.items():
        if path.endswith("(resident)"):
            r0 = next(srs[0] for s in series.values() for lab, srs in s.items() if lab == label)
            where = str(r0.get("ids_on") or "device") + (" host clock" if r0.get("_host_clock") else "")
            resident[where] = min(resident.get(where, (score, label)), (score, label))

    def draw(only: set[str] | None) -> tuple[Figure, int]:
        entries = len(scores) if only is None else len(only)
        fig = Figure(figsize=(WIDTH_IN, _legend_height(entries, height) if only is None else height),
                     layout="constrained")
        axes = list(fig.subplots(1, len(computes), squeeze=False)[0])
        _suptitle(fig, ("Decode step vs tokens" if scoped else "Decode step vs tokens, every table")
                  + (f" ({shape})" if shape else ""), run, x=0.02, ha="left")
        for ax, cu in zip(axes, computes):
            for si, (label, srs) in enumerate(sorted(series[cu].items())):
                if only is not None and label not in only:
                    continue
                pts = points(srs, "num_tokens", "step_ms")
                res = device_resident(srs[0])
                style = ({"color": "black", "linewidth": 2.6, "marker": MARKERS[si % len(MARKERS)], "markersize": 5,
                          "linestyle": "-." if srs[0].get("_host_clock") else
                          "-" if str(srs[0].get("ids_on") or "device") == "device" else ":"}
                         if res else
                         {"color": colors.get(path_of(srs[0]), "C0"), "marker": MARKERS[si % len(MARKERS)],
                          "markersize": 5,
                          "linestyle": _STEP_STYLES.get((bool(srs[0].get("prefetch")),
                                                         str(srs[0].get("graph") or "eager")), "-")})
                ax.plot([p[0] for p in pts], [p[1] for p in pts],
                        label=label + (" (HBM-resident)" if res else ""), **style)
            ax.set_title(f"{fmt(cu)} µs of compute per step", fontsize=10)
            finish_axes(ax, "tokens per step (log scale)", "step time (ms, log scale)", logx=True, logy=True, xbase=2)
        return fig, _figure_legend(fig, axes)

    caption = ("Median decode-step time per path configuration (path, prefetch, graph mode, where the ids are); "
               "the thick black lines are the HBM-resident table (solid: ids on the device, dotted: on the host; "
               "dash-dotted: its full graph timed on the host clock). A step timed on the host clock (host ids, "
               "host paths) is compared with the resident step timed the same way: the dash-dotted line.")
    key, title = ("step_vs_tokens", "Decode step vs tokens") if scoped else (
        "step_vs_tokens_all", "Decode step vs tokens, every table and id distribution")
    return _with_full(draw, scores, lambda uri, n, total: Plot(
        key, title, caption, uri, section="overlap", legend_entries=n,
        series_total=total), keep=[label for _s, label in sorted(resident.values())])


def plot_topology(run: Run) -> Plot | None:
    recs = [r for r in run.ok if r.median_ms is not None]
    if len({topology(r) for r in recs}) < 2:
        return None
    # Only cases measured at several topologies with everything else equal.
    matched = {id(r): r for g in pairs(recs, "topology") for r in g.values()}
    if not matched:
        return None
    extra_keys = [k for k in ("gather_ms", "reduce_ms", "rank_spread_ms")
                  if any(getattr(r, k) is not None for r in matched.values())]
    sl = slice_series(list(matched.values()), "topology", ["impl"], max_series=MAX_LEGEND - len(extra_keys))
    labels = sorted({topology_label(r) for rs in sl.series.values() for r in rs},
                    key=lambda s: [int("".join(c for c in part if c.isdigit())) for part in s.split()])
    if len(labels) < 2:
        return None
    fig, axes = _figure(2 if extra_keys else 1, "Topology scaling", run)
    ax = axes[0]
    series = sorted(sl.series.items(), key=lambda kv: str(kv[0]))
    width = 0.8 / max(1, len(series))
    for i, (key, rs) in enumerate(series):
        by_label: dict[str, dict[str, Any]] = {topology_label(r): r for r in rs}
        xs = [j + i * width for j, lab in enumerate(labels) if lab in by_label]
        ys = [by_label[lab].median_ms for lab in labels if lab in by_label]
        ax.bar(xs, ys, width=width, label=sl.label(key), color=f"C{i % 10}")
    ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(labels))], labels)
    ax.set_title("median lookup time per rank", fontsize=10)
    ax.margins(y=0.3)
    finish_axes(ax, "topology (TP, ETP, DP)", "median time (ms)")
    ax.legend(fontsize=8, loc="best")
    entries = len(series)
    if extra_keys:
        ax2 = axes[1]
        bars = [(sl.label(key), topology_label(r), r) for key, rs in series for r in rs
                if any(getattr(r, k) is not None for k in extra_keys)]
        bars.sort(key=lambda b: (labels.index(b[1]) if b[1] in labels else 0, b[0]))
        w = 0.8 / len(extra_keys)
        for k_i, k in enumerate(extra_keys):
            vals = [getattr(b[2], k) or 0.0 for b in bars]
            ax2.bar([i + k_i * w for i in range(len(bars))], vals, width=w,
                    label=k.replace("_ms", "").replace("_", " "), color=f"C{k_i + 3}")
        ax2.set_xticks([i + w * (len(extra_keys) - 1) / 2 for i in range(len(bars))],
                       [f"{b[0]}\n{b[1]}" for b in bars], fontsize=7, rotation=30, ha="right")
        ax2.set_title("collective parts and spread between ranks", fontsize=10)
        ax2.margins(y=0.3)
        finish_axes(ax2, "", "time (ms)")
        ax2.legend(fontsize=8, loc="best")
        entries += len(extra_keys)
    caption = "Multi-rank lookups against the single-GPU case with the same per-rank ids."
    return Plot("topology", "Topology scaling", _caption(caption, sl.fixed_text()), figure_uri(fig, PLOT_DPI),
                legend_entries=entries, series_total=len(series))


def plot_trend(runs: Sequence[Run], case_ids: Sequence[str], metric: str = "median_ms") -> Plot | None:
    """Each key case's median over the runs, as % of its first value."""
    if len(runs) < 2 or not case_ids:
        return None
    fig = Figure(figsize=(WIDTH_IN, 4.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    drawn = 0
    for i, cid in enumerate(case_ids):
        xs, ys = [], []
        first = None
        for j, run in enumerate(runs):
            rec = next((r for r in run.ok if r.get("case_id") == cid), None)
            value = getattr(rec, metric) if rec else None
            if value is None:
                continue
            first = first if first is not None else value
            xs.append(j)
            ys.append(100.0 * value / first)
        if len(xs) >= 2:
            ax.plot(xs, ys, marker=MARKERS[i % len(MARKERS)], color=f"C{i % 10}", label=cid)
            drawn += 1
    if not drawn:
        return None
    ax.axhline(100, color="0.5", linewidth=1)
    ax.set_xticks(range(len(runs)), [r.run_id for r in runs], rotation=25, ha="right", fontsize=7)
    fig.suptitle("Trend of key cases' median over runs")
    finish_axes(ax, "run (oldest to newest)", f"{metric} as % of its first run")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return Plot("trend", "Trend", "Median time of each key case, relative to the oldest run in which it appears "
                "(100% = unchanged; up is slower).", figure_uri(fig, PLOT_DPI), legend_entries=drawn,
                series_total=drawn)
