"""``pinned_host_graph`` on a CPU (functional mode: the host node runs synchronously, the same
native row loop): the backend contract, the decode step's gate, ids past the table, the engine's
graph-mode rule (``host_work_capturable``), and that the verdict and advise rank its records
(the archived H200 run 20261202-065234-faster_than_hbm-b3f6)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from ple_bench.backends import get_backend, synthetic_rows
from ple_bench.backends.cuda.native import host_gather_module
from ple_bench.run.graphs import BreakableGraph
from ple_bench.report import verdict
from ple_bench.advise.answer import advise
from ple_bench.advise.self_run import suite_text
from ple_bench.run.step import DecodeStep, StepMismatch, check_step
from ple_bench.testing import check_backend
from tests._fixtures import fixture_run

ROOT = Path(__file__).resolve().parents[1]
RUN = fixture_run("20261202-065234-faster_than_hbm-b3f6")
VOCAB, DIM, HEADS, SEED = 4096, 16, 4, 5


def _backend(**kw):
    b = get_backend("pinned_host_graph")(VOCAB, DIM, dtype="fp8", num_heads=HEADS, max_tokens=8, device="cpu", **kw)
    b.fill_synthetic(SEED, scale=0.5)
    return b


def _ids(seed, tokens=8):
    return torch.randint(0, VOCAB, (tokens, HEADS), generator=torch.Generator().manual_seed(seed))


def test_contract():
    assert check_backend("pinned_host_graph")[0] == "capabilities"


def test_declares_a_capturable_host_path():
    cls = get_backend("pinned_host_graph")
    assert cls.host_work_capturable and cls.reads_ids_on_host and cls.gathers_on_host and not cls.blocks_host
    assert not get_backend("pinned_cpu_gather").host_work_capturable  # its host work is the caller's


def test_the_host_node_runs_the_native_row_loop_when_it_builds():
    b = _backend()
    ids = _ids(1)
    rows = b.lookup(ids)
    want = synthetic_rows(ids.reshape(-1), DIM, SEED, torch.float8_e4m3fn).reshape(8, -1)
    assert torch.equal(rows.view(torch.uint8), want.view(torch.uint8))
    if host_gather_module() is not None:
        assert b.stats()["gather_impl"] == "host_node"
        assert sum(t["runs"] for t in b.host_node_timing()) == 1
        spent = b.host_thread_s  # the host node's thread's CPU time, counted as the path's host work
        assert spent > 0 and spent == pytest.approx(sum(t["cpu_s"] for t in b.host_node_timing()))
        b.set_max_tokens(64)
        b.lookup(_ids(4, tokens=64))  # new buffers: the old tasks retire, their time stays counted
        assert b.host_thread_s > spent
    b.close()
    b.close()


@pytest.mark.parametrize("bad", [VOCAB, VOCAB + 7, -1])
def test_an_id_past_the_table_raises_and_the_next_lookup_is_right(bad):
    b = _backend()
    ids = _ids(2)
    ids[5, 1] = bad
    with pytest.raises(IndexError, match="out of range"):
        b.lookup(ids)
    good = _ids(3)
    want = synthetic_rows(good.reshape(-1), DIM, SEED, torch.float8_e4m3fn).reshape(8, -1)
    assert torch.equal(b.lookup(good).view(torch.uint8), want.view(torch.uint8))
    b.close()


@pytest.mark.parametrize("prefetch", [True, False])
def test_the_step_gate_passes_and_catches_other_rows(prefetch):
    b = _backend()
    step = DecodeStep(b, hidden=32, num_tokens=8, compute_layers=2, prefetch=prefetch, ids_on="host")
    sets = [_ids(s) for s in range(3)]
    check_step(step, sets, SEED)
    b.fill_synthetic(SEED + 1, scale=0.5)
    with pytest.raises(StepMismatch):
        check_step(step, sets, SEED)
    step.close()
    b.close()


class _FakeSegment:
    def __init__(self, pool):
        pass

    def begin(self):
        pass

    def end(self):
        pass

    def replay(self):
        pass


def test_the_engine_allows_a_full_graph_only_for_capturable_host_work():
    def factory(mode):
        return BreakableGraph(mode, segment_factory=_FakeSegment)

    hg = _backend()
    DecodeStep(hg, hidden=32, num_tokens=8, compute_layers=1, prefetch=True, graph="full",
               graph_factory=factory).close()
    cg = get_backend("pinned_cpu_gather")(VOCAB, DIM, dtype="fp8", num_heads=HEADS, max_tokens=8, device="cpu")
    with pytest.raises(NotImplementedError, match="graph=full"):
        DecodeStep(cg, hidden=32, num_tokens=8, compute_layers=1, prefetch=True, graph="full",
                   graph_factory=factory)
    hg.close()
    cg.close()


def test_advise_runs_it_in_a_full_graph_on_a_gpu():
    text = suite_text(dim=160, dtype="fp8", heads=16, table_bytes=1 << 30, tokens=[256], compute_us=200,
                      measure="all")
    assert 'impl = "pinned_host_graph"\ngraph = "full"' in text
    cpu = suite_text(dim=160, dtype="fp8", heads=16, table_bytes=1 << 30, tokens=[256], compute_us=200, gpu=False,
                     measure="all")
    assert 'impl = "pinned_host_graph"\ngraph = "eager"' in cpu
    # the default screening set: the posted host gather in one full graph, not the host-graph node
    few = suite_text(dim=160, dtype="fp8", heads=16, table_bytes=1 << 30, tokens=[256], compute_us=200)
    assert 'impl = "pinned_host_flag"\ngraph = "full"' in few and "pinned_host_graph" not in few


def _run_records():
    with gzip.open(RUN / "records.jsonl.gz", "rt") as fh:
        recs = [json.loads(line) for line in fh]
    for r in recs:
        r["_run_id"] = RUN.name  # as advise's loader tags the records of a run
    return recs


def test_the_verdict_and_advise_rank_the_archived_host_graph_steps():
    recs = _run_records()
    cands = verdict.candidates(recs)
    graphed = [r for r in cands if r["impl"] == "pinned_host_graph" and r["graph"] == "full"]
    assert graphed, "the archived run's host-graph steps must be verdict candidates"
    for r in graphed:  # offload_overhead is the record schema's: step / its resident baseline - 1
        assert r["offload_overhead"] == pytest.approx(r["step_ms"] / r["offload_baseline_ms"] - 1)
    a = advise(table_bytes=32 << 30, dim=160, dtype="fp8", heads=16, tokens=[256], compute_us=200, records=recs)
    paths = {o.path for o in a.answers[0].options}
    assert "pinned_host_graph" in paths


HOST_GRAPH_SUITE = """
[suite]
description = "pinned_host_graph, functional"
[suite.timing]
warmup_ms = 0
min_samples = 3
max_samples = 5
max_time_s = 0.2
[defaults]
vocab_size = 4096
dim = 16
dtype = "fp8"
num_heads = 4
num_tokens = 8
[[group]]
name = "host graph"
kind = ["lookup", "step"]
impl = "pinned_host_graph"
prefetch = ["on", "off"]
compute_us = 20
hidden = 64
ids_on = ["host", "device"]
"""


@pytest.mark.slow  # python -m ple_bench run end to end: a new interpreter and its worker process
def test_a_functional_run_passes_the_gate_for_every_case(tmp_path):
    """``python -m ple_bench run`` on a CPU: the path's lookups and steps pass the engine's gate."""
    from tests.test_cli import run_suite_records

    mine = [r for r in run_suite_records(tmp_path, HOST_GRAPH_SUITE) if r["impl"] == "pinned_host_graph"]
    assert mine and all(r["status"] == "ok" for r in mine), [(r["case_id"], r.get("error")) for r in mine]
    assert {r["gather_impl"] for r in mine} <= {"host_node", "python"}
