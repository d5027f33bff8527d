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

from .data import Run, fmt, fmt_bytes, num, pairs, points, single_rank, slice_series, topology, topology_label

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
                 band: tuple[str, str] | None = None) -> tuple[int, str]:
    """Draw one line per series; returns (lines drawn, text of pinned axes)."""
    sl = slice_series(records, x, series_axes)
    drawn = 0
    for i, (key, rs) in enumerate(sorted(sl.series.items(), key=lambda kv: str(kv[0]))):
        pts = points(rs, x, y)
        if not pts:
            continue
        style = _style(dict(zip(sl.label_axes, key)), i)
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


def plot_bandwidth(run: Run, x: str) -> Plot | None:
    recs = [r for r in _lookups(run) if num(r.get("gbps")) is not None or num(r.get("rows_per_s")) is not None]
    if not (_has_sweep(recs, x, "gbps", ["impl", "dtype"]) or _has_sweep(recs, x, "rows_per_s", ["impl", "dtype"])):
        return None
    what = "table size" if x == "table_bytes" else "row size"
    fig, (ax1, ax2) = _figure(2, f"Lookup throughput vs {what}", run)
    _, fixed = _series_plot(ax1, [r for r in recs if num(r.get("gbps")) is not None], x, "gbps", ["impl", "dtype"])
    _draw_ceilings(ax1, run, recs)
    ax1.set_title("GB/s (rows moved × row bytes / median time)", fontsize=10)
    _series_plot(ax2, [r for r in recs if num(r.get("rows_per_s")) is not None], x, "rows_per_s", ["impl", "dtype"])
    ax2.set_title("rows/s", fontsize=10)
    xlabel = "table size (bytes, log scale)" if x == "table_bytes" else "row size (bytes, log scale)"
    _finish(ax1, xlabel, "GB/s (log scale)", logx=True, logy=True, xbase=2, bytes_x=True)
    _finish(ax2, xlabel, "rows/s (log scale)", logx=True, logy=True, xbase=2, bytes_x=True)
    caption = (f"Single-GPU lookups, one line per backend and dtype; dashed horizontal lines are the ceilings "
               f"measured on this run.")
    return Plot(f"bandwidth_vs_{x}", f"Throughput vs {what}", _caption(caption, fixed), _to_uri(fig))


def plot_latency_vs_tokens(run: Run) -> Plot | None:
    recs = [r for r in _lookups(run) if num(r.get("median_ms")) is not None]
    if not _has_sweep(recs, "num_tokens", "median_ms", ["impl", "dtype"]):
        return None
    fig, (ax,) = _figure(1, "Lookup latency vs tokens", run, height=4.6)
    _, fixed = _series_plot(ax, recs, "num_tokens", "median_ms", ["impl", "dtype"], band=("p10_ms", "p90_ms"))
    _finish(ax, "tokens per step (per DP rank, log scale)", "median latency (ms, log scale)",
            logx=True, logy=True, xbase=2)
    caption = "Median lookup time; bars span the 10th to 90th percentile of the samples."
    return Plot("latency_vs_tokens", "Latency vs tokens", _caption(caption, fixed), _to_uri(fig))


def plot_step_overlap(run: Run) -> Plot | None:
    steps = [r for r in run.ok if r.get("kind") == "step"]
    panels = [(y, label) for y, label in (
        ("step_ms", "decode step time (ms)"),
        ("exposed_ms", "exposed lookup time (ms)"),
        ("overlap_efficiency", "overlap efficiency (hidden share, 0–1)"),
    ) if _has_sweep(steps, "compute_us", y, ["impl", "prefetch"])]
    if not panels:
        return None
    fig, axes = _figure(len(panels), "Decode step: lookup hidden behind compute", run)
    fixed = ""
    for ax, (y, label) in zip(axes, panels):
        _, fixed = _series_plot(ax, [r for r in steps if num(r.get(y)) is not None], "compute_us", y,
                                ["impl", "prefetch"])
        ax.set_title(label, fontsize=10)
        _finish(ax, "main-stream compute per step (µs)", label)
    caption = ("Synthetic decode steps: the lookup runs beside compute_us of main-stream work. Exposed time is "
               "the part of the lookup not hidden by the compute; overlap efficiency is the hidden share.")
    return Plot("step_overlap", "Exposed time and overlap vs compute", _caption(caption, fixed), _to_uri(fig))


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
        lambda: plot_step_overlap(run),
        lambda: plot_topology(run),
    ]
    out = []
    for make in makers:
        plot = make()
        if plot is not None:
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
