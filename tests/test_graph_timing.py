"""Graph replay against eager, like for like: the finding compares a graph
replay with the eager figure only when both rotated the same id sets with the L2 flushed;
older records (one repeated id set, warm) are named as such."""

from __future__ import annotations

from pathlib import Path

from ple_bench.report.data import Run
from ple_bench.report.findings import graph_and_cache_findings


def _rec(i, graph_ms, **kw):
    rec = {"case_id": f"lookup.device.t{i}", "status": "ok", "kind": "lookup", "impl": "device", "mode": "gpu",
           "median_ms": 1.0, "graph_median_ms": graph_ms, "num_tokens": 256 * (i + 1)}
    rec.update(kw)
    return rec


def test_graph_vs_eager_only_like_for_like():
    like = [_rec(i, 0.8, cold_l2=True, graph_cold_l2=True, id_sets=8, graph_id_sets=8) for i in range(3)]
    old = [_rec(i + 3, 0.5, graph_id_sets=1) for i in range(3)]  # an older record: no graph_cold_l2
    (f,) = graph_and_cache_findings(Run(Path("r"), {"mode": "gpu"}, like + old))
    assert "takes 80% of the eager time (same id sets, same L2 state)" in f.text
    assert "one repeated id set, warm, takes 50%" in f.text and "not like for like" in f.text
    (f,) = graph_and_cache_findings(Run(Path("r"), {"mode": "gpu"}, old))
    assert "same id sets" not in f.text
