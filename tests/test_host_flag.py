"""``pinned_host_flag`` on a CPU (functional mode: the native team gathers, the caller waits
for it on the host): the backend contract, the team's pieces and posts, ids past the table, the
decode step's gate and that the step posts its host ids before it runs."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from ple_bench.backends import get_backend, synthetic_rows
from ple_bench.advise.answer import advise
from ple_bench.backends.cuda.native import host_gather_module
from ple_bench.report import verdict
from ple_bench.run.step import DecodeStep, StepMismatch, check_step
from ple_bench.testing import check_backend
from tests._fixtures import fixture_run

pytestmark = pytest.mark.skipif(host_gather_module() is None, reason="the native host gather does not build here")

VOCAB, DIM, HEADS, SEED = 4096, 16, 4, 7


def _backend(**kw):
    b = get_backend("pinned_host_flag")(VOCAB, DIM, dtype="fp8", num_heads=HEADS, max_tokens=64, device="cpu",
                                        gather_threads=3, grain=4, **kw)
    b.fill_synthetic(SEED, scale=0.5)
    return b


def _ids(seed, tokens=8):
    return torch.randint(0, VOCAB, (tokens, HEADS), generator=torch.Generator().manual_seed(seed))


def _want(ids):
    return synthetic_rows(ids.reshape(-1), DIM, SEED, torch.float8_e4m3fn).reshape(ids.shape[0], -1).view(torch.uint8)


def test_contract():
    assert check_backend("pinned_host_flag")[0] == "capabilities"


def test_declares_a_posting_capturable_host_path():
    cls = get_backend("pinned_host_flag")
    assert cls.posts_ids and cls.host_work_capturable and cls.gathers_on_host and not cls.blocks_host
    assert not get_backend("pinned_host_graph").posts_ids


@pytest.mark.parametrize("chunks", [1, 3, 64])
def test_lookups_are_the_rows_for_every_piece_count(chunks):
    b = _backend(chunks=chunks)
    for seed, tokens in ((1, 8), (2, 64), (3, 1), (4, 64)):
        ids = _ids(seed, tokens)
        assert torch.equal(b.lookup(ids).view(torch.uint8), _want(ids))
    timing = b.host_node_timing()[0]
    assert timing["runs"] == 4 and timing["last_end_ns"] >= timing["last_start_ns"] > 0
    assert b.stats()["gather_impl"] == "posted_team" and b.stats()["chunks"] == chunks
    b.close()
    b.close()


def test_pieces_are_whole_grains_in_row_order_and_cover_every_row():
    b = _backend(chunks=4)
    b.lookup(_ids(1))  # builds the team
    nat = b._native
    for n in (0, 1, 4, 5, 37, 256):
        for chunks in (1, 2, 4, 7):
            bounds = nat.chunk_bounds(n, chunks)
            assert bounds[0] == 0 and bounds[-1] == n and len(bounds) == chunks + 1
            assert bounds == sorted(bounds)
            assert all(x % 4 == 0 or x == n for x in bounds)  # grain 4: a piece starts on a grain (or is empty at the end)
    b.close()


def test_every_piece_flag_holds_the_post_number_once_the_rows_are_in():
    b = _backend(chunks=5)
    ids = _ids(9, 64)
    for k in range(1, 4):
        b.post_ids(ids)
        assert b._native.wait()
        flags = b._flags.tolist()
        assert flags[0] == k and flags[1] == 0 and flags[2:] == [k] * 5
        assert torch.equal(b._staging[: ids.numel()].view(torch.uint8), _want(ids).reshape(ids.numel(), -1))
    b.close()


def test_every_eager_call_posts_its_own_ids():
    b = _backend()
    first, other = _ids(1), _ids(2)
    b.post_ids(first, launched=False)  # a post nobody consumes does not stand in for a later call's
    assert torch.equal(b.lookup(other).view(torch.uint8), _want(other))
    assert b.host_node_timing()[0]["runs"] == 2
    b.start_prefetch(first)
    assert torch.equal(b.finalize().view(torch.uint8), _want(first))
    assert b.host_node_timing()[0]["runs"] == 3
    b.close()


@pytest.mark.parametrize("bad", [VOCAB, VOCAB + 9, -1])
def test_an_id_past_the_table_raises_and_the_next_lookup_is_right(bad):
    b = _backend(chunks=2)
    ids = _ids(2)
    ids[3, 2] = bad
    with pytest.raises(IndexError, match="out of range"):
        b.lookup(ids)
    good = _ids(3)
    assert torch.equal(b.lookup(good).view(torch.uint8), _want(good))
    b.close()


@pytest.mark.parametrize("prefetch", [True, False])
def test_the_step_gate_passes_and_catches_other_rows(prefetch):
    b = _backend(chunks=2)
    step = DecodeStep(b, hidden=32, num_tokens=8, compute_layers=2, prefetch=prefetch, ids_on="host")
    sets = [_ids(s) for s in range(3)]
    check_step(step, sets, SEED)
    b.fill_synthetic(SEED + 1, scale=0.5)
    with pytest.raises(StepMismatch):
        check_step(step, sets, SEED)
    step.close()
    b.close()


class _FakeGraph:
    """A stand-in for a captured full graph on a CPU: capture runs the body once, replay again."""

    def __init__(self, mode):
        self.captured = False

    def capture(self, body, warmup=0):
        self.body = body
        self.captured = True

    def replay(self):
        self.body()


def test_a_full_graph_replay_is_followed_by_the_post_of_the_step_ids():
    b = _backend()
    step = DecodeStep(b, hidden=32, num_tokens=8, compute_layers=1, prefetch=True, graph="full", ids_on="host",
                      graph_factory=_FakeGraph)
    calls = []
    real_post = b.post_ids
    b.post_ids = lambda ids, launched=True: (calls.append((ids, launched)), real_post(ids, launched))[1]
    step.set_inputs(_ids(4))
    assert calls == []  # writing the ids posts nothing
    run = step.runner("step")
    run()
    assert len(calls) == 2 and calls[-1][0] is step.ids and calls[-1][1] is True  # the body's, then the step's
    step.runner("compute")()
    assert len(calls) == 2  # the compute alone posts nothing
    step.close()
    b.close()


@pytest.mark.parametrize("kw", [{"chunks": 0}, {"chunks": 65}, {"chunks": True}, {"spin_us": -1},
                                {"pin_threads": 1}])
def test_bad_settings_are_refused(kw):
    with pytest.raises(ValueError):
        get_backend("pinned_host_flag")(VOCAB, DIM, dtype="fp8", num_heads=HEADS, device="cpu", **kw)


def test_back_to_back_posts_never_mix_rows_of_two_posts():
    """Posts follow each other at once (each waits only for the previous post's grains, not for
    every thread to check in): every post's staging holds exactly its own rows."""
    b = _backend(chunks=3)
    sets = [_ids(s, 64) for s in range(4)]
    wants = [_want(ids).reshape(ids.numel(), -1) for ids in sets]
    for k in range(200):
        ids = sets[k % 4]
        b.post_ids(ids)
        assert b._native.wait()
        assert b._flags.tolist()[2:] == [k + 1] * 3
        assert torch.equal(b._staging[: ids.numel()], wants[k % 4])
    b.close()


RUN = fixture_run("20261202-103149-faster_than_hbm-4c8f")


def test_the_verdict_and_advise_rank_the_archived_flag_steps():
    """The H200 run of the faster_than_hbm suite (flag path and resident steps): the flag path's
    full-graph steps are verdict candidates held against their resident baseline, and advise
    ranks the path."""
    with gzip.open(RUN / "records.jsonl.gz", "rt") as fh:
        recs = [json.loads(line) for line in fh]
    for r in recs:
        r["_run_id"] = RUN.name
    flagged = [r for r in verdict.candidates(recs) if r["impl"] == "pinned_host_flag" and r["graph"] == "full"]
    assert flagged
    for r in flagged:
        assert r["offload_overhead"] == pytest.approx(r["step_ms"] / r["offload_baseline_ms"] - 1)
    a = advise(table_bytes=32 << 30, dim=160, dtype="fp8", heads=16, tokens=[256], compute_us=200, records=recs)
    assert "pinned_host_flag" in {o.path for o in a.answers[0].options}


FLAG_SUITE = """
[suite]
description = "pinned_host_flag, functional"
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
name = "flag"
kind = ["lookup", "step"]
impl = "pinned_host_flag"
prefetch = ["on", "off"]
compute_us = 20
hidden = 64
ids_on = "host"
extra = { chunks = 2 }
"""


@pytest.mark.slow  # python -m ple_bench run end to end: a new interpreter and its worker process
def test_a_functional_run_passes_the_gate_for_every_case(tmp_path):
    """``python -m ple_bench run`` on a CPU: the path's lookups and steps pass the engine's gate."""
    from tests.test_cli import run_suite_records

    mine = [r for r in run_suite_records(tmp_path, FLAG_SUITE) if r["impl"] == "pinned_host_flag"]
    assert mine and all(r["status"] == "ok" for r in mine), [(r["case_id"], r.get("error")) for r in mine]
    assert {r["gather_impl"] for r in mine} == {"posted_team"}
