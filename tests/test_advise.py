"""`advise`: ranked options and the recommendation from measured step records (hand-made here),
the verdict, the memory budgets, bad input exits 2 naming the flag, and a run over the archived runs (tests/fixtures/runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ple_bench.advise.answer import AdviseError, advise
from tests._cli import run_cli
from tests._fixtures import fixture_runs

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30


def _records() -> list[dict]:
    """A 32 GiB and a 1 GiB table's steps, derived as a run derives them (record.Peers)."""
    from tests.test_verdict import _rec, _resident, _run

    big = (32 * GIB) // 160
    recs = _run([
        _resident(256, 0.250, 0.266, vocab=big), _resident(512, 0.270, 0.289, vocab=big),
        _rec("device", 256, 0.300, vocab=big, ids_on="host"),  # ids copied in the step: never the baseline
        _rec("pinned_cpu_gather", 256, 0.257, vocab=big),
        _rec("pinned_uva", 256, 0.459, vocab=big, kernel="triton_reference"),
        _rec("pinned_cpu_gather", 512, 0.300, vocab=big),
        _rec("pinned_uva", 512, 0.20, vocab=big, graph="eager", cv=0.43),  # noisy: not ranked
        _rec("pinned_uva", 512, 0.29, vocab=big, graph="eager"),
        _resident(256, 0.1, 0.1, vocab=GIB // 160), _rec("pinned_uva", 256, 0.05, vocab=GIB // 160),  # another table
    ])
    for r in recs:
        r["_run_id"] = "20261201-000000-paths-t"
    return recs


def test_ranked_options_recommendation_and_verdict():
    recs = _records()
    a = advise(table_bytes=47 * GIB, dim=160, dtype="fp8", heads=16, tokens=[256, 512], compute_us=200, records=recs)
    assert a.measured_table_bytes == (32 * GIB) // 160 * 160 and any("32.0 GiB table" in n for n in a.notes)
    t256, t512 = a.answers
    assert [o.placement for o in t256.options] == ["HBM", "HBM, ids copied", "pinned host", "pinned host"]
    hbm, gather = t256.options[0], t256.options[2]
    assert (hbm.graph, hbm.timer, hbm.step_ms) == ("full", "host_sync", pytest.approx(0.266 * 0.95))
    assert gather.path == "pinned_cpu_gather" and gather.baseline_ms == hbm.step_ms
    # the printed percentage is the ratio of the two printed rows
    assert gather.overhead_pct == pytest.approx(100 * (gather.step_ms / hbm.step_ms - 1))
    assert t256.recommendation.startswith("pinned host, as fast: pinned_cpu_gather") and "ratio 1.017" in t256.recommendation
    # at 512 the lowest ratio of a stable pinned step is the eager UVA one's (0.29 / 0.2746); the noisy one is left out
    assert t512.recommendation.startswith("HBM: the best pinned step (pinned_uva") and "is slower" in t512.recommendation
    assert all(o.step_ms != 0.20 for o in t512.options)
    assert (t256.verdict, t512.verdict) == ("as fast", "slower")
    assert a.verdict.startswith("Pinned host memory at 256 tokens, HBM at 512. From 512 tokens HBM wins: the best "
                                "pinned step's time over HBM's rises from 1.017 at 256 tokens past 1.05")
    # the same entries as the report's verdict (report/verdict.py) for this shape
    from ple_bench.report.verdict import verdicts
    assert a.verdicts == [e.to_json() for e in verdicts(recs) if e.table_bytes == a.measured_table_bytes]
    # only graph-replayed steps: the CPU gather answers at 512
    a = advise(table_bytes=32 * GIB, dim=160, dtype="fp8", heads=16, tokens=[512], compute_us=200, records=recs,
               graph_modes="replayed")
    assert all(o.graph != "eager" for o in a.answers[0].options if o.placement == "pinned host")


def test_the_text_prints_the_hbm_row_beside_every_ratio():
    from ple_bench.advise.answer import format_text

    text = format_text(advise(table_bytes=32 * GIB, dim=160, dtype="fp8", heads=16, tokens=[256], compute_us=200,
                              records=_records()))
    import re

    rows = [line.split() for line in text.splitlines() if re.match(r"^\s+\d+\s+pinned host", line)]
    assert rows
    for cells in rows:
        pct_i = cells.index("%") - 1
        step, base, pct = float(cells[pct_i - 2]), float(cells[pct_i - 1]), float(cells[pct_i])
        assert pct == pytest.approx(100 * (step / base - 1), abs=0.06)


def test_budgets_and_impossible_inputs():
    recs = _records()
    a = advise(table_bytes=32 * GIB, dim=160, dtype="fp8", heads=16, tokens=[512], compute_us=200, records=recs,
               hbm_bytes=16 * GIB)
    assert a.answers[0].recommendation.startswith("pinned host (the table does not fit the HBM budget)")
    assert not a.answers[0].options[0].fits and "does not fit the HBM budget" in a.verdict
    with pytest.raises(AdviseError, match="fits neither"):
        advise(table_bytes=32 * GIB, dim=160, dtype="fp8", heads=16, tokens=[256], compute_us=200, records=recs,
               hbm_bytes=GIB, host_bytes=GIB)
    with pytest.raises(AdviseError, match="--tokens"):
        advise(table_bytes=GIB, dim=160, dtype="fp8", heads=16, tokens=[0], compute_us=200, records=recs)
    # a row shape no run measured: no refusal -- no measured rows, the model answers (advise --runs)
    unseen = advise(table_bytes=GIB, dim=128, dtype="fp8", heads=16, tokens=[256], compute_us=200, records=recs)
    assert unseen.measured_table_bytes == 0 and not unseen.answers[0].options
    assert "no measured decode step of dim 128" in unseen.notes[0] and "predicted" in unseen.notes[0]


def _cli(*args):
    return run_cli("advise", *args)  # in this process; test_model runs `python -m ple_bench advise` end to end


def test_cli_answers_the_qwen4exp_shape_from_the_archived_runs():
    runs = [str(p) for p in fixture_runs()]
    proc = _cli("--table-bytes", "47.7GiB", "--dim", "160", "--dtype", "fp8", "--heads", "16", "--tokens",
                "64,256,512", "--compute-us", "200", "--runs", *runs, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert [a["tokens"] for a in out["answers"]] == [64, 256, 512] and out["verdict"]
    assert all(o["run_id"] for a in out["answers"] for o in a["options"])
    bad = _cli("--table-bytes", "lots", "--dim", "160", "--dtype", "fp8", "--heads", "16", "--tokens", "64",
               "--compute-us", "200", "--runs", *runs[:1])
    assert bad.returncode == 2 and "--table-bytes" in bad.stderr
    bad = _cli("--rows", "100", "--dim", "160", "--dtype", "fp8", "--heads", "16", "--tokens", "64",
               "--compute-us", "200", "--runs", "/nonexistent")
    assert bad.returncode == 2 and "not a run folder" in bad.stderr
