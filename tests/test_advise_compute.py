"""``advise --compute``: the compute kind is an input of advise and of its model -- the matmul chain
(``us:N``) and decoder layers (``decoder:<layers>x<context>``) are never pooled, bad input exits 2
naming the flag, and the answer names the traffic and the compute it holds for.  Answered from the
archived decoder and paths runs (trimmed copies in tests/fixtures/runs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ple_bench.advise.compute_kind import ComputeAsk, compute_kind, parse_compute, records_of_compute
from ple_bench.advise.model import build_model, load_runs, predict
from tests._cli import run_cli
from tests._fixtures import fixture_run

ROOT = Path(__file__).resolve().parents[1]
DECODER_RUN = fixture_run("20261201-230636-decoder-377c")
PATHS_RUN = fixture_run("20261201-221703-paths-b469")
SHAPE = ["--table-bytes", "32GiB", "--dim", "160", "--dtype", "fp8", "--heads", "16"]


def _cli(*args):
    return run_cli("advise", *args)


@pytest.fixture(scope="module")
def runs():
    return load_runs([DECODER_RUN, PATHS_RUN])


def test_parse_compute_spellings_and_refusals():
    assert parse_compute("us:200") == ComputeAsk("matmul", compute_us=200.0)
    assert parse_compute("decoder:2x2048") == ComputeAsk("decoder", shape="qwen3-8b", layers=2, context=2048)
    assert parse_compute("decoder:tiny:4x128").spec == "decoder:tiny:4x128"
    for bad in ("200", "us:", "us:-5", "decoder:2", "decoder:0x2048", "decoder:2x", "gemm:200"):
        with pytest.raises(ValueError):
            parse_compute(bad)
    with pytest.raises(ValueError, match="unknown decoder shape 'llama'"):
        parse_compute("decoder:llama:2x2048")


def test_records_of_a_compute_are_that_kind_only(runs):
    records, _ = runs
    steps = [r for r in records if r.get("kind") == "step"]
    assert {compute_kind(r) for r in steps} >= {"matmul", "decoder:qwen3-8b:2x2048", "decoder:qwen3-8b:2x8192"}
    chain, measured, notes = records_of_compute(steps, parse_compute("us:200"))
    assert chain and all(compute_kind(r) == "matmul" for r in chain) and not notes
    dec, measured, notes = records_of_compute(steps, parse_compute("decoder:2x8192"))
    assert dec and {compute_kind(r) for r in dec} == {"decoder:qwen3-8b:2x8192"} and not notes
    # an unmeasured decoder compute: the nearest measured one, said so
    dec, measured, notes = records_of_compute(steps, parse_compute("decoder:2x4000"))
    assert measured == ComputeAsk("decoder", shape="qwen3-8b", layers=2, context=2048)
    assert notes and "not the asked 2 qwen3-8b decoder layers over a 4000-token KV cache" in notes[0]
    with pytest.raises(ValueError, match="no step with the matmul chain"):
        records_of_compute([r for r in steps if compute_kind(r) != "matmul"], parse_compute("us:200"))


def test_the_model_calibrates_the_decoder_compute_on_decoder_steps_only(runs):
    """A decoder path's compute is fitted on decoder steps: its predicted compute at a measured shape
    is the measured one (pooled with the matmul chain's 50-200 us it would be a fraction of it)."""
    records, metas = runs
    m = build_model(records, metas, loo=False)
    kinds = {f.key.compute for f in m.fits.values()}
    assert "matmul" in kinds and "decoder:qwen3-8b:2x8192" in kinds
    checked = 0
    for f in m.fits.values():
        if f.key.compute != "decoder:qwen3-8b:2x8192" or f.resident:
            continue
        for p in (p for p in m.points if p.key == f.key):
            pr = predict(f, m.rates, rows=p.rows, table_bytes=p.table_bytes, compute_us=p.compute_us)
            assert pr.compute_ms == pytest.approx(p.compute_ms, rel=0.25), (f.key, p.case_id)
            checked += 1
    assert checked >= 6


def test_cli_decoder_answer_names_its_traffic_and_compute():
    proc = _cli(*SHAPE, "--tokens", "64,256,512", "--compute", "decoder:2x2048", "--runs", str(DECODER_RUN),
                str(PATHS_RUN), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["compute"] == "decoder:qwen3-8b:2x2048" and out["ids"] == "uniform"
    assert out["holds_for"].startswith("holds for: uniform ids, 2 qwen3-8b decoder layers over a 2048-token KV cache")
    assert out["verdict"].endswith(" Holds for uniform ids and 2 qwen3-8b decoder layers over a 2048-token KV cache.")
    # the headline is measured (the model's own verdict is kept beside it, never in its place)
    assert out["model"]["verdict"].endswith(" Holds for uniform ids and 2 qwen3-8b decoder layers over a 2048-token "
                                            "KV cache.") and out["verdicts"]
    assert all(a["verdict"] != "no verdict" for a in out["answers"]) and "Measured, per token count" in out["verdict"]
    records, _ = load_runs([DECODER_RUN, PATHS_RUN])
    by_case = {(r["_run_id"], r["case_id"]): r for r in records}
    cases = [(o["run_id"], o["case_id"]) for a in out["answers"] for o in a["options"]]
    cases += [(o["run_id"], o["case_id"]) for a in out["model"]["answers"] for o in a["options"] if o["case_id"]]
    assert cases
    for c in cases:  # every number is of the asked compute (a resident host-sync twin's id ends in #host_sync)
        r = by_case[(c[0], c[1].split("#")[0])]
        assert compute_kind(r) == "decoder:qwen3-8b:2x2048", c
    text = _cli(*SHAPE, "--tokens", "256", "--compute", "decoder:2x2048", "--runs", str(DECODER_RUN), "--all").stdout
    assert text.splitlines()[0].startswith("holds for: uniform ids, 2 qwen3-8b decoder layers")
    assert "predicted at 2 qwen3-8b decoder layers over a 2048-token KV cache" in text


def test_cli_matmul_answer_never_reads_a_decoder_step():
    proc = _cli(*SHAPE, "--tokens", "256", "--compute", "us:200", "--runs", str(DECODER_RUN), str(PATHS_RUN),
                "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["compute"] == "us:200" and "a 200 us matmul chain" in out["holds_for"]
    runs = {o["run_id"] for a in out["answers"] for o in a["options"]}
    runs |= {o["run_id"] for a in out["model"]["answers"] for o in a["options"] if o["run_id"]}
    assert runs == {PATHS_RUN.name}
    assert all(not o["path_id"].endswith("2048") and "decoder" not in o["path_id"]
               for a in out["model"]["answers"] for o in a["options"])


@pytest.mark.parametrize("args, says", [
    (["--compute", "decoder:2"], "--compute: 'decoder:2' is not a compute"),
    (["--compute", "decoder:gpt:2x2048"], "--compute: 'decoder:gpt:2x2048': unknown decoder shape"),
    (["--compute", "us:200", "--compute-us", "200"], "--compute / --compute-us: give one of them"),
    ([], "--compute: say what compute"),
    (["--compute-us", "-1"], "--compute-us: must be >= 0"),
])
def test_cli_bad_compute_exits_2_naming_the_flag(args, says):
    proc = _cli(*SHAPE, "--tokens", "256", *args, "--runs", str(PATHS_RUN))
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr


def test_cli_decoder_compute_the_runs_lack_exits_2():
    proc = _cli(*SHAPE, "--tokens", "256", "--compute", "decoder:2x2048", "--runs", str(PATHS_RUN))
    assert proc.returncode == 2 and "--compute: no step with qwen3-8b decoder layers" in proc.stderr
    proc = _cli(*SHAPE, "--tokens", "256", "--compute", "decoder:2x2048")  # no --runs: no self-run of a decoder
    assert proc.returncode == 2 and "--compute decoder:2x2048" in proc.stderr
