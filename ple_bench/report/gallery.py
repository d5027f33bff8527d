"""Every plot of a run's report, in page order: the makers of :mod:`.plots` (lookups, paths,
steps) and of :mod:`.plots_traffic` (real traffic, decoder layers). Each maker returns None where
the run has nothing for it."""

from __future__ import annotations

from typing import Callable

from .data import Run
from .plots import (
    Plot, plot_bandwidth, plot_latency_vs_tokens, plot_paths, plot_step_overlap, plot_step_vs_tokens, plot_topology,
    plot_verdict_rows,
)
from .plots_traffic import plot_decoder, plot_traffic


def make_plots(run: Run) -> list[Plot]:
    makers: list[Callable[[], Plot | None]] = [
        lambda: plot_bandwidth(run, "table_bytes"),
        lambda: plot_bandwidth(run, "row_bytes"),
        lambda: plot_latency_vs_tokens(run),
        lambda: plot_topology(run),
        lambda: plot_paths(run),
        lambda: plot_step_overlap(run),
        # the verdict's own rows under the banner; the scoped step plot where there is no verdict
        lambda: plot_verdict_rows(run) or plot_step_vs_tokens(run),
        lambda: plot_step_vs_tokens(run, scoped=False),
        lambda: plot_traffic(run),
        lambda: plot_decoder(run),
    ]
    out = []
    for make in makers:
        plot = make()
        if isinstance(plot, list):
            out += plot
        elif plot is not None:
            out.append(plot)
    return out
