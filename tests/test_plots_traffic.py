"""The real-traffic and decoder plots (ple_bench/report/plots_traffic.py) on the archived H200 runs:
each drawn from its own run only, from the records' own figures (the verdict's picks, the medians of
unique_rows_fraction and of the hot cache's hit rate), the decoder's HBM share against the read
ceiling where the run has one and said to be the copy ceiling where not; the PNG writer exits 2 on a
run without the data."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from ple_bench.record import Record
from ple_bench.report.data import load_run
from ple_bench.record import num
from ple_bench.report.gallery import make_plots
from ple_bench.report.plots_traffic import decoder_share, main, plot_decoder, plot_traffic, traffic_series
from tests._fixtures import fixture_run

ROOT = Path(__file__).resolve().parents[1]
DECODER_RUN = fixture_run("20261201-230636-decoder-377c")
TRAFFIC_RUN = fixture_run("20261201-231019-traffic-3f07")


@pytest.fixture(scope="module")
def decoder():
    return load_run(DECODER_RUN)


@pytest.fixture(scope="module")
def traffic():
    return load_run(TRAFFIC_RUN)


def test_each_plot_is_drawn_from_its_own_run(decoder, traffic):
    assert plot_decoder(traffic) is None and plot_traffic(decoder) is None
    d, t = plot_decoder(decoder), plot_traffic(traffic)
    assert d.section == "overlap" and d.data_uri.startswith("data:image/png;base64,")
    assert t.section == "general" and "warm-up" in t.caption
    assert "decoder" in {p.key for p in make_plots(decoder)}


def test_the_traffic_series_are_the_medians_of_the_records(traffic):
    unique, hits, cache_rows = traffic_series(traffic)
    assert cache_rows == 4194304
    assert {"text:code", "text:prose", "zipf:1.1", "uniform"} <= set(unique) and set(hits) <= set(unique)
    recs = [r for r in traffic.ok if r.get("kind") == "lookup" and r.get("ids") == "text:code"
            and num(r.get("num_tokens")) == 512]
    assert unique["text:code"][512] == statistics.median(num(r["unique_rows_fraction"]) for r in recs)
    assert min(unique["uniform"].values()) > 0.99  # uniform ids over 200 M rows: almost no repeats


def test_the_decoder_share_names_its_ceiling(decoder):
    field, words, share = decoder_share(decoder)
    assert field == "compute_pct_of_d2d" and "no read ceiling in this run" in words  # run before the read ceiling
    assert "D2D copy ceiling" in plot_decoder(decoder).caption
    with_read = load_run(DECODER_RUN)
    with_read.records = [  # records are read-only views: the run gets copies with the read ceiling's share
        Record(r, compute_pct_of_hbm_read=100 * r.compute_hbm_gbps / 4500.0)
        if r.status == "ok" and r.compute_hbm_gbps is not None else r for r in with_read.records]
    field, words, share = decoder_share(with_read)
    assert field == "compute_pct_of_hbm_read" and "read ceiling" in words
    assert max(v for by in share.values() for v in by.values()) < 100


def test_the_writer_exits_2_without_the_data(tmp_path):
    assert main([str(DECODER_RUN), "--traffic", str(tmp_path / "t.png")]) == 2
    assert main([str(tmp_path), "--decoder", str(tmp_path / "d.png")]) == 2
    assert main([str(DECODER_RUN), "--decoder", str(tmp_path / "d.png")]) == 0
    assert (tmp_path / "d.png").read_bytes()[:4] == b"\x89PNG"
