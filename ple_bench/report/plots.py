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
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from .data import (
    REFERENCE_PATH, Run, axis_value, fmt, fmt_bytes, num, pairs, points, single_rank, slice_series, topology,
    topology_label,
)
from .sections import decode_steps, path_groups, path_of, step_config_axes, step_config_label, workload_label

DPI = 96
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


def _to_uri(fig: Figure) -> str:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _figure(ncols: int, title: str, run: Run, height: float = 4.3) -> tuple[Figure, list[Any]]:
    fig = Figure(figsize=(6.2 * ncols, height), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    suptitle = title + (f"\n({FUNCTIONAL_NOTE})" if run.functional else "")
    fig.suptitle(suptitle, fontsize=12, color="#a00" if run.functional else "black")
    return fig, list(axes)


_bytes_formatter = FuncFormatter(lambda v, _pos: fmt_bytes(v))
_plain_formatter = FuncFormatter(lambda v, _pos: fmt(v, 3))


def _style(key_values: dict[str, Any], index: int) -> dict[str, Any]:
    return {
        "linestyle": LINESTYLES.get(str(key_values.get("dtype")), "-"),
        "marker": MARKERS[index % len(MARKERS)],
        "color": f"C{index % 10}",
        "markersize": 5,
    }


def _draw_ceilings(ax: Any, run: Run, records: Sequence[dict[str, Any]]) -> None:
    """Horizontal lines for the ceilings the records are measured against
    (all measured ceilings when the records name none)."""
    ceilings = run.ceilings
    if not ceilings:
        return
    named = {str(r.get("ceiling")) for r in records if r.get("ceiling")}
    names = [n for n in ceilings if n in named] or list(ceilings)
    for i, name in enumerate(sorted(names)):
        value = ceilings[name]
        ax.axhline(value, color="0.35", linestyle=(0, (4, 2 + i)), linewidth=1)
        ax.annotate(f"{name} {fmt(value)} GB/s", xy=(0.995, value), xycoords=("axes fraction", "data"),
                    ha="right", va="bottom", fontsize=8, color="0.25")


def _series_plot(ax: Any, records: Sequence[dict[str, Any]], x: str, y: str, series_axes: Sequence[str],
                 band: tuple[str, str] | None = None, colors: dict[str, str] | None = None) -> tuple[int, str]:
    """Draw one line per series; returns (lines drawn, text of pinned axes)."""
    sl = slice_series(records, x, series_axes)
    drawn = 0
    for i, (key, rs) in enumerate(sorted(sl.series.items(), key=lambda kv: str(kv[0]))):
        pts = points(rs, x, y)
        if not pts:
            continue
        style = _style(dict(zip(sl.label_axes, key)), i)
        path = dict(zip(sl.label_axes, key)).get("path")
        if colors and path in colors:
            style["color"] = colors[path]
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        if band:
            lo = dict(points(rs, x, band[0]))
            hi = dict(points(rs, x, band[1]))
            if all(v in lo and v in hi for v in xs):
                yerr = [[max(0.0, yv - lo[xv]) for xv, yv in pts], [max(0.0, hi[xv] - yv) for xv, yv in pts]]
                ax.errorbar(xs, ys, yerr=yerr, capsize=2, label=sl.label(key), **style)
                drawn += 1
                continue
        ax.plot(xs, ys, label=sl.label(key), **style)
        drawn += 1
    return drawn, sl.fixed_text()


def _has_sweep(records: Sequence[dict[str, Any]], x: str, y: str, series_axes: Sequence[str]) -> bool:
    """Whether at least one series (as the plot will group them) has two or more x values."""
    recs = [r for r in records if num(r.get(x)) is not None and num(r.get(y)) is not None]
    if len({num(r.get(x)) for r in recs}) < 2:
        return False
    sl = slice_series(recs, x, series_axes)
    return any(len(points(rs, x, y)) >= 2 for rs in sl.series.values())


def _finish(ax: Any, xlabel: str, ylabel: str, *, logx: bool = False, logy: bool = False,
            xbase: int = 10, bytes_x: bool = False) -> None:
    if logx:
        ax.set_xscale("log", base=xbase)
    if logy:
        ax.set_yscale("log")
    if bytes_x:
        ax.xaxis.set_major_formatter(_bytes_formatter)
    elif logx:
        ax.xaxis.set_major_formatter(_plain_formatter)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="major", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="best")


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


def _figure_legend(fig: Figure, axes: Sequence[Any], title: str | None = None) -> None:
    """One legend for all panels, outside on the right (labels deduplicated)."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    if handles:
        fig.legend(list(handles.values()), list(handles.keys()), loc="outside right upper", fontsize=8,
                   title=title, title_fontsize=8)


def _row_ceiling_lines(ax: Any, run: Run, records: Sequence[dict[str, Any]]) -> None:
    """H2D copy and random-row ceilings at the records' row size (pinned and/or device)."""
    names: dict[str, float] = {}
    impls = {str(r.get("impl")) for r in records}
    rbs = {num(r.get("row_bytes")) for r in records}
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
    for i, (name, value) in enumerate(sorted(names.items(), key=lambda kv: kv[1])):
        ax.axhline(value, color="0.35", linestyle=(0, (4, 2 + i)), linewidth=1)
        ax.annotate(f"{name} {fmt(value)} GB/s", xy=(0.995, value), xycoords=("axes fraction", "data"),
                    ha="right", va="bottom", fontsize=7, color="0.25")


def plot_bandwidth(run: Run, x: str) -> Plot | None:
    """GB/s along table size (or row size), one panel per token count, one line per path and dtype."""
    recs = [r for r in _lookups(run) if num(r.get("gbps")) is not None]
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
            shapes.setdefault((r.get("dtype"), r.get("dim")), set()).add(num(r.get("table_bytes")))
        swept = {k for k, v in shapes.items() if len(v) >= 3}
        if swept and len(swept) < len(shapes):
            recs = [r for r in recs if (r.get("dtype"), r.get("dim")) in swept]
            dropped.append("row shapes measured at fewer than three table sizes")
    by_tokens: dict[float, list[dict[str, Any]]] = {}
    for r in recs:
        by_tokens.setdefault(num(r.get("num_tokens")) or 0.0, []).append(r)
    panels = [(t, rs) for t, rs in sorted(by_tokens.items()) if _has_sweep(rs, x, "gbps", ["path", "dtype"])]
    if not panels:
        return None
    panels = sorted(panels, key=lambda p: -len(p[1]))[:4]
    panels.sort(key=lambda p: p[0])
    what = "table size" if x == "table_bytes" else "row size"
    ncols = min(2, len(panels))
    nrows = (len(panels) + ncols - 1) // ncols
    fig = Figure(figsize=(5.0 * ncols + 3.2, 3.5 * nrows + 0.6), layout="constrained")
    grid = fig.subplots(nrows, ncols, squeeze=False, sharey=True)
    axes = [ax for row in grid for ax in row]
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    axes = axes[:len(panels)]
    fig.suptitle(f"Lookup GB/s vs {what}" + (f"\n({FUNCTIONAL_NOTE})" if run.functional else ""), fontsize=12,
                 color="#a00" if run.functional else "black")
    colors = _path_colors(run)
    fixed_texts = []
    for ax, (tokens, rs) in zip(axes, panels):
        sl = slice_series(rs, x, ["path", "dtype"], max_series=10)
        for i, (key, srs) in enumerate(sorted(sl.series.items(), key=lambda kv: str(kv[0]))):
            pts = points(srs, x, "gbps")
            if not pts:
                continue
            kv = dict(zip(sl.label_axes, key))
            path = str(kv.get("path"))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colors.get(path, "C0"),
                    linestyle=LINESTYLES.get(str(kv.get("dtype")), "-"),
                    marker=MARKERS[sorted(colors).index(path) % len(MARKERS)] if path in colors else "o",
                    markersize=5, label=sl.label(key))
        _row_ceiling_lines(ax, run, rs)
        heads = {num(r.get("num_heads")) for r in rs}
        h = heads.pop() if len(heads) == 1 else None
        ax.set_title(f"{int(tokens)} tokens" + (f" × {int(h)} heads" if h and h > 1 else ""), fontsize=10)
        xlabel = "table size (log scale)" if x == "table_bytes" else "row size (log scale)"
        _finish(ax, xlabel, "GB/s (log scale)" if axes.index(ax) % ncols == 0 else "", logx=True, logy=True,
                xbase=2, bytes_x=True)
        if ax.get_legend():
            ax.get_legend().remove()
        if sl.fixed:
            fixed_texts.append(f"{int(tokens)} tokens: {sl.fixed_text()}")
    _figure_legend(fig, axes)
    caption = ("Single-GPU lookups; one panel per token count, one colour per lookup path "
               "(impl · kernel), line style per dtype. Dashed horizontal lines: the H2D copy and random-row "
               "ceilings measured on this run at these rows' size.")
    if dropped:
        caption += " Left out here (see the tables): " + ", ".join(dropped) + "."
    if fixed_texts:
        caption += " Pinned to keep lines comparable — " + "; ".join(fixed_texts) + "."
    return Plot(f"bandwidth_vs_{x}", f"GB/s vs {what}", caption, _to_uri(fig))


def plot_latency_vs_tokens(run: Run) -> Plot | None:
    recs = [r for r in _lookups(run) if num(r.get("median_ms")) is not None]
    plain = [r for r in recs if not r.get("prefetch") and r.get("graph") in (None, "", "eager")]
    recs = plain if _has_sweep(plain, "num_tokens", "median_ms", ["path", "dtype"]) else recs
    if not _has_sweep(recs, "num_tokens", "median_ms", ["path", "dtype"]):
        return None
    fig = Figure(figsize=(10.5, 4.8), layout="constrained")
    ax = fig.subplots()
    fig.suptitle("Lookup latency vs tokens" + (f"\n({FUNCTIONAL_NOTE})" if run.functional else ""), fontsize=12,
                 color="#a00" if run.functional else "black")
    _, fixed = _series_plot(ax, recs, "num_tokens", "median_ms", ["path", "dtype"], band=("p10_ms", "p90_ms"),
                            colors=_path_colors(run))
    _finish(ax, "tokens per step (per DP rank, log scale)", "median latency (ms, log scale)",
            logx=True, logy=True, xbase=2)
    if ax.get_legend():
        ax.get_legend().remove()
    _figure_legend(fig, [ax])
    caption = "Median lookup time; bars span the 10th to 90th percentile of the samples."
    return Plot("latency_vs_tokens", "Latency vs tokens", _caption(caption, fixed), _to_uri(fig))


def plot_paths(run: Run, max_groups: int = 10) -> Plot | None:
    """Grouped bars: every lookup path at each workload measured on 3+ paths (else 2+):
    GB/s against the ceilings, and speed relative to the default pinned path."""
    groups = path_groups(run, min_paths=3) or path_groups(run, min_paths=2)
    if not groups:
        return None
    order = {g.key: i for i, g in enumerate(groups)}
    groups = sorted(groups, key=lambda g: -len(g.records))[:max_groups]
    groups.sort(key=lambda g: order[g.key])
    paths = sorted({p for g in groups for p in g.paths})
    colors = _path_colors(run)
    has_ref = any(g.reference is not None for g in groups)
    fig = Figure(figsize=(min(11.0, max(6.0, 1.3 * len(groups))) + 3.0, 7.6 if has_ref else 4.4),
                 layout="constrained")
    axes = list(fig.subplots(2 if has_ref else 1, 1, squeeze=False, sharex=True)[:, 0])
    fig.suptitle("Lookup paths side by side" + (f"\n({FUNCTIONAL_NOTE})" if run.functional else ""), fontsize=12,
                 color="#a00" if run.functional else "black")
    width = 0.8 / len(paths)
    for gi, g in enumerate(groups):
        ref = g.reference
        for r in g.records:
            pi = paths.index(path_of(r))
            xpos = gi + (pi - (len(paths) - 1) / 2) * width
            axes[0].bar(xpos, num(r.get("gbps")) or 0.0, width=width, color=colors[path_of(r)], label=path_of(r))
            if has_ref and ref is not None:
                speed = num(ref.get("median_ms")) / num(r.get("median_ms"))
                axes[1].bar(xpos, speed, width=width, color=colors[path_of(r)], label=path_of(r))
    rbs = {num(g.fastest.get("row_bytes")) for g in groups}
    rb = rbs.pop() if len(rbs) == 1 else None
    for i, base in enumerate(("h2d_gbps", "pinned_random_row_gbps")):
        hit = run.row_ceiling(base, rb)
        if hit:
            axes[0].axhline(hit[1], color="0.3", linestyle=(0, (4, 2 + 2 * i)), linewidth=1)
            axes[0].annotate(f"{hit[0]} {fmt(hit[1])} GB/s", xy=(0.995, hit[1]),
                             xycoords=("axes fraction", "data"), ha="right", va="bottom", fontsize=7, color="0.2")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("GB/s (log scale)")
    axes[0].set_title("GB/s (rows moved × row bytes / median time)", fontsize=10)
    axes[0].grid(True, axis="y", which="major", alpha=0.3)
    if has_ref:
        axes[1].axhline(1.0, color="0.3", linewidth=1)
        axes[1].set_yscale("log")
        axes[1].yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}×"))
        axes[1].set_ylabel(f"speed vs {REFERENCE_PATH}\n(>1 faster, log scale)")
        axes[1].set_title(f"speed relative to {REFERENCE_PATH} at the same workload", fontsize=10)
        axes[1].grid(True, axis="y", which="major", alpha=0.3)
    same_shape = len({(g.fastest.get("dtype"), num(g.fastest.get("row_bytes"))) for g in groups}) == 1
    labels = [workload_label(g.fastest, with_shape=not same_shape).replace(" tokens × ", " tok × ")
              .replace(" heads", " h").replace(", ", "\n") for g in groups]
    axes[-1].set_xticks(range(len(groups)), labels, fontsize=8)
    if same_shape:
        f = groups[0].fastest
        axes[0].set_title(f"GB/s (rows moved × row bytes / median time) — {f.get('dtype')}, "
                          f"{fmt(num(f.get('row_bytes')))} B rows", fontsize=10)
    _figure_legend(fig, axes)
    caption = ("Single-GPU lookups; each group is one workload (same dtype, row size, table size, tokens, heads, "
               "ids, graph and prefetch setting) measured on several paths (impl · kernel; kernel \"\" is the "
               "backend's default). Dashed lines: the H2D copy and pinned random-row ceilings at this row size. "
               "Exact numbers and % of every ceiling are in the table below.")
    return Plot("paths", "Lookup paths side by side", caption, _to_uri(fig), section="paths")


_STEP_STYLES = {(True, "eager"): "-", (True, "breakable"): "--", (True, "full"): "-.",
                (False, "eager"): ":", (False, "breakable"): ":", (False, "full"): ":"}


def plot_step_overlap(run: Run) -> list[Plot]:
    """Per token count at the decode shape: exposed lookup time, overlap
    efficiency (0–100%) and compute slowdown vs compute_us, one line per
    path / prefetch / graph mode / stream priority."""
    recs, shape = decode_steps(run)
    recs = [r for r in recs if num(r.get("compute_us")) is not None]
    if not recs:
        return []
    axes_names = step_config_axes(recs)
    by_tokens: dict[float, list[dict[str, Any]]] = {}
    for r in recs:
        by_tokens.setdefault(num(r.get("num_tokens")) or 0.0, []).append(r)
    colors = _path_colors(run)
    out = []
    for tokens, rs in sorted(by_tokens.items()):
        panels = [(y, label) for y, label in (
            ("exposed_ms", "exposed lookup time (ms)"),
            ("overlap_efficiency", "overlap efficiency (1 − exposed / exposed without prefetch, %)"),
            ("compute_slowdown", "compute slowdown (% vs compute alone)"),
        ) if sum(1 for r in rs if num(r.get(y)) is not None) >= 2]
        if not panels or len({num(r.get("compute_us")) for r in rs}) < 2:
            continue
        series: dict[str, list[dict[str, Any]]] = {}
        for r in rs:
            series.setdefault(step_config_label(r, axes_names), []).append(r)
        exposed = [num(r.get("exposed_ms")) for r in rs if num(r.get("exposed_ms")) is not None]
        positive = [v for v in exposed if v > 0]
        log_exposed = bool(positive) and max(positive) / min(positive) > 20
        floor = min(positive) / 2 if positive else 0.0
        fig = Figure(figsize=(4.4 * len(panels) + 3.6, 4.2), layout="constrained")
        axes = list(fig.subplots(1, len(panels), squeeze=False)[0])
        title = f"Decode step at {int(tokens)} tokens" + (f" ({shape})" if shape else "")
        fig.suptitle(title + (f"\n({FUNCTIONAL_NOTE})" if run.functional else ""), fontsize=12,
                     color="#a00" if run.functional else "black")
        for si, (label, srs) in enumerate(sorted(series.items())):
            r0 = srs[0]
            style = {"color": colors.get(path_of(r0), "C0"),
                     "linestyle": _STEP_STYLES.get((bool(r0.get("prefetch")), str(r0.get("graph") or "eager")), "-"),
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
            ax.set_title(label, fontsize=10)
            _finish(ax, "main-stream compute per step (µs)", label)
            if y == "overlap_efficiency":  # not clamped: below 0 when the prefetch slows the step
                ax.set_ylim(min(-5.0, ax.get_ylim()[0]), max(105.0, ax.get_ylim()[1]))
            if y == "exposed_ms" and log_exposed:
                ax.set_yscale("log")
                ax.set_ylabel("exposed lookup time (ms, log scale; ≤ 0 drawn at the bottom)")
            if y == "compute_slowdown":
                ax.axhline(0, color="0.4", linewidth=1)
            if ax.get_legend():
                ax.get_legend().remove()
        _figure_legend(fig, axes)
        caption = ("Synthetic decode steps: the lookup runs beside compute_us of main-stream work. Exposed time is "
                   "the part of the lookup not hidden by the compute; overlap efficiency the hidden share; compute "
                   "slowdown how much longer the compute takes with the lookup beside it (compute_us = 0 left out). "
                   "Colour: path; solid/dashed/dash-dot: prefetch with eager/breakable/full graph; dotted: no "
                   "prefetch.")
        out.append(Plot(f"step_overlap_t{int(tokens)}", f"Overlap at {int(tokens)} tokens", caption, _to_uri(fig),
                        section="overlap"))
    return out


def plot_step_vs_tokens(run: Run) -> Plot | None:
    """Decode-step time per path configuration vs tokens per step at the decode shape, one panel
    per compute time (the two largest measured), the HBM-resident steps drawn thick and black:
    where a pinned line meets the resident one, the table can leave HBM at that token count."""
    recs, shape = decode_steps(run)
    recs = [r for r in recs if num(r.get("step_ms")) is not None and num(r.get("compute_us"))]
    computes = sorted({num(r.get("compute_us")) for r in recs})[-2:]
    recs = [r for r in recs if num(r.get("compute_us")) in computes]
    if len({num(r.get("num_tokens")) for r in recs}) < 2:
        return None
    axes_names = step_config_axes(recs)
    colors = _path_colors(run)
    fig = Figure(figsize=(5.4 * len(computes) + 6.4, 4.8), layout="constrained")
    axes = list(fig.subplots(1, len(computes), squeeze=False)[0])
    title = "Decode step vs tokens" + (f" ({shape})" if shape else "")
    fig.suptitle(title + (f"\n({FUNCTIONAL_NOTE})" if run.functional else ""), fontsize=12, x=0.02, ha="left",
                 color="#a00" if run.functional else "black")
    drawn = False
    for ax, cu in zip(axes, computes):
        series: dict[str, list[dict[str, Any]]] = {}
        for r in recs:
            if num(r.get("compute_us")) == cu:
                series.setdefault(step_config_label(r, axes_names), []).append(r)
        for si, (label, srs) in enumerate(sorted(series.items())):
            pts = points(srs, "num_tokens", "step_ms")
            if len(pts) < 2:
                continue
            declared = srs[0].get("table_in_host_memory")
            resident = declared is False if declared is not None else srs[0].get("impl") == "device"
            style = ({"color": "black", "linewidth": 2.6, "marker": MARKERS[si % len(MARKERS)], "markersize": 5,
                      "linestyle": "-" if str(srs[0].get("ids_on") or "device") == "device" else ":"}
                     if resident else
                     {"color": colors.get(path_of(srs[0]), "C0"), "marker": MARKERS[si % len(MARKERS)],
                      "markersize": 5,
                      "linestyle": _STEP_STYLES.get((bool(srs[0].get("prefetch")),
                                                     str(srs[0].get("graph") or "eager")), "-")})
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label + (" (HBM-resident)" if resident else ""),
                    **style)
            drawn = True
        ax.set_title(f"{fmt(cu)} µs of compute per step", fontsize=10)
        _finish(ax, "tokens per step (log scale)", "step time (ms, log scale)", logx=True, logy=True, xbase=2)
        if ax.get_legend():
            ax.get_legend().remove()
    if not drawn:
        return None
    _figure_legend(fig, axes)
    caption = ("Median decode-step time per path configuration (path, prefetch, graph mode, where the ids are); "
               "the thick black lines are the HBM-resident table (solid: ids on the device, dotted: on the host). A step timed on the host clock (host ids, "
               "host paths) is compared with the resident step timed the same way.")
    return Plot("step_vs_tokens", "Decode step vs tokens", caption, _to_uri(fig), section="overlap")


def plot_topology(run: Run) -> Plot | None:
    recs = [r for r in run.ok if num(r.get("median_ms")) is not None]
    if len({topology(r) for r in recs}) < 2:
        return None
    # Only cases measured at several topologies with everything else equal.
    matched = {id(r): r for g in pairs(recs, "topology") for r in g.values()}
    if not matched:
        return None
    sl = slice_series(list(matched.values()), "topology", ["impl"], max_series=6)
    labels = sorted({topology_label(r) for rs in sl.series.values() for r in rs},
                    key=lambda s: [int("".join(c for c in part if c.isdigit())) for part in s.split()])
    if len(labels) < 2:
        return None
    extra_keys = [k for k in ("gather_ms", "reduce_ms", "rank_spread_ms")
                  if any(num(r.get(k)) is not None for rs in sl.series.values() for r in rs)]
    fig, axes = _figure(2 if extra_keys else 1, "Topology scaling", run)
    ax = axes[0]
    series = sorted(sl.series.items(), key=lambda kv: str(kv[0]))
    width = 0.8 / max(1, len(series))
    for i, (key, rs) in enumerate(series):
        by_label: dict[str, dict[str, Any]] = {topology_label(r): r for r in rs}
        xs = [j + i * width for j, lab in enumerate(labels) if lab in by_label]
        ys = [num(by_label[lab].get("median_ms")) for lab in labels if lab in by_label]
        ax.bar(xs, ys, width=width, label=sl.label(key), color=f"C{i % 10}")
    ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(labels))], labels)
    ax.set_title("median lookup time per rank", fontsize=10)
    ax.margins(y=0.3)
    _finish(ax, "topology (TP, ETP, DP)", "median time (ms)")
    if extra_keys:
        ax2 = axes[1]
        bars = [(sl.label(key), topology_label(r), r) for key, rs in series for r in rs
                if any(num(r.get(k)) is not None for k in extra_keys)]
        bars.sort(key=lambda b: (labels.index(b[1]) if b[1] in labels else 0, b[0]))
        w = 0.8 / len(extra_keys)
        for k_i, k in enumerate(extra_keys):
            vals = [num(b[2].get(k)) or 0.0 for b in bars]
            ax2.bar([i + k_i * w for i in range(len(bars))], vals, width=w,
                    label=k.replace("_ms", "").replace("_", " "), color=f"C{k_i + 3}")
        ax2.set_xticks([i + w * (len(extra_keys) - 1) / 2 for i in range(len(bars))],
                       [f"{b[0]}\n{b[1]}" for b in bars], fontsize=7, rotation=30, ha="right")
        ax2.set_title("collective parts and spread between ranks", fontsize=10)
        ax2.margins(y=0.3)
        _finish(ax2, "", "time (ms)")
    caption = "Multi-rank lookups against the single-GPU case with the same per-rank ids."
    return Plot("topology", "Topology scaling", _caption(caption, sl.fixed_text()), _to_uri(fig))


def make_plots(run: Run) -> list[Plot]:
    makers: list[Callable[[], Plot | None]] = [
        lambda: plot_bandwidth(run, "table_bytes"),
        lambda: plot_bandwidth(run, "row_bytes"),
        lambda: plot_latency_vs_tokens(run),
        lambda: plot_topology(run),
        lambda: plot_paths(run),
        lambda: plot_step_overlap(run),
        lambda: plot_step_vs_tokens(run),
    ]
    out = []
    for make in makers:
        plot = make()
        if isinstance(plot, list):
            out += plot
        elif plot is not None:
            out.append(plot)
    return out


def plot_trend(runs: Sequence[Run], case_ids: Sequence[str], metric: str = "median_ms") -> Plot | None:
    """Each key case's median over the runs, as % of its first value."""
    if len(runs) < 2 or not case_ids:
        return None
    fig = Figure(figsize=(11, 4.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    drawn = 0
    for i, cid in enumerate(case_ids):
        xs, ys = [], []
        first = None
        for j, run in enumerate(runs):
            rec = next((r for r in run.ok if r.get("case_id") == cid), None)
            value = num(rec.get(metric)) if rec else None
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
    _finish(ax, "run (oldest to newest)", f"{metric} as % of its first run")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return Plot("trend", "Trend", "Median time of each key case, relative to the oldest run in which it appears "
                "(100% = unchanged; up is slower).", _to_uri(fig))
