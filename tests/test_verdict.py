"""The offload verdict (report/verdict.py): one rule for the report's banner and advise."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ple_bench.spec.case import Case
from ple_bench.record import Peers, derive
from ple_bench.report.data import Run
from ple_bench.report.findings import offload_answer_findings
from ple_bench.report.verdict import STABLE_CV, banner, candidates, picks, scope

GIB = 1 << 30


def _rec(impl: str, tokens: int, step_ms: float, *, graph: str = "breakable", ids_on: str = "host",
         timer: str = "host_sync", compute_us: float = 200.0, vocab: int = 1 << 20, cv: float = 0.02,
         ids: str = "uniform", **kw) -> dict:
    prefetch = kw.pop("prefetch", True)
    case = Case(kind="step", impl=impl, num_tokens=tokens, graph=graph, ids_on=ids_on, compute_us=compute_us,
                vocab_size=vocab, dim=160, dtype="fp8", num_heads=16, prefetch=prefetch, ids=ids,
                kernel=kw.pop("kernel", ""))
    rec = {"case_id": case.case_id, "status": "ok", "mode": "gpu", **case.axes(), "step_ms": step_ms,
           "median_ms": step_ms, "timer": timer, "cv": cv, "table_bytes": case.table_bytes,
           "table_in_host_memory": impl != "device"}
    rec.update(kw)
    return rec


def _resident(tokens: int, events_ms: float, sync_ms: float, **kw) -> dict:
    return _rec("device", tokens, events_ms, ids_on="device", timer="cuda_event", step_host_sync_ms=sync_ms,
                full_step_ms=events_ms * 0.95, full_step_host_sync_ms=sync_ms * 0.95, **kw)


def _run(recs: list[dict]) -> list[dict]:
    peers = Peers()
    out = []
    for r in sorted(recs, key=lambda r: r["impl"] != "device"):
        derive(r, {}, peers)
        peers.add(r)
        out.append(r)
    return out


def test_banner_picks_the_fastest_stable_pinned_step_against_its_baseline_row():
    recs = _run([
        _resident(64, 0.20, 0.24), _resident(256, 0.26, 0.30),
        _rec("pinned_cpu_gather", 64, 0.235), _rec("pinned_uva", 64, 0.30, ids_on="device", timer="cuda_event"),
        _rec("pinned_cpu_gather", 256, 0.33), _rec("pinned_copy_engine", 256, 0.31, cv=0.43),  # noisy: left out
    ])
    text = banner(recs)
    # every "vs HBM" figure is the ratio of the two figures printed beside it
    for step, base, pct in re.findall(r"([0-9.]+) ms vs HBM ([0-9.]+) ms \([^)]*\), ([+-][0-9.]+) %", text):
        assert float(pct) == pytest.approx(100 * (float(step) / float(base) - 1), abs=0.06)
    assert "64 tokens: pinned_cpu_gather" in text and "0.2350 ms vs HBM 0.2280 ms" in text  # 0.24 x 0.95 (full)
    assert "256 tokens: pinned_cpu_gather" in text and "copy_engine" not in text
    assert "HBM is faster" in text and "1 GiB" not in text  # the table is 160 MiB here


def test_the_verdict_is_per_table_size_ids_and_compute_and_says_the_compute_it_holds_from():
    big = 1 << 22
    recs = _run([
        _resident(64, 0.20, 0.24, vocab=big), _resident(64, 0.10, 0.12, vocab=big, compute_us=50.0),
        _rec("pinned_cpu_gather", 64, 0.232, vocab=big), _rec("pinned_cpu_gather", 64, 0.16, vocab=big, compute_us=50.0),
        _resident(64, 0.20, 0.24), _rec("pinned_cpu_gather", 64, 0.90),  # a smaller table: not in the verdict
        _resident(64, 0.20, 0.24, vocab=big, ids="ngram"), _rec("pinned_cpu_gather", 64, 0.20, vocab=big, ids="ngram"),
    ])
    cands = candidates(recs)
    where = scope(cands)
    assert where.table_bytes == big * 160 and where.compute_us == (200.0, 50.0)
    assert where.ids == "uniform"  # two steps there, against one n-gram step
    text = banner(recs)
    assert text.startswith("640 MiB table") and "200 us of compute" in text
    assert "50 us of compute: 64: +" in text and "Holds from 200 us of compute" in text


def test_two_suites_that_measured_the_same_cases_get_the_same_banner():
    same = [_resident(64, 0.20, 0.24), _rec("pinned_cpu_gather", 64, 0.25)]
    extra = [_rec("pinned_uva", 64, 0.9, ids_on="device", timer="cuda_event", cv=STABLE_CV * 3)]
    a = banner(_run([dict(r) for r in same]))
    b = banner(_run([dict(r) for r in same] + extra))
    assert a == b


def test_resident_only_runs_have_no_banner_and_all_noisy_ones_say_no_verdict():
    assert banner(_run([_resident(64, 0.2, 0.24)])) is None
    text = banner(_run([_resident(64, 0.2, 0.24), _rec("pinned_cpu_gather", 64, 0.25, cv=0.4)]))
    assert text.startswith("No verdict")


def test_the_report_finding_is_the_banner():
    recs = _run([_resident(64, 0.20, 0.24), _rec("pinned_cpu_gather", 64, 0.25)])
    (f,) = offload_answer_findings(Run(Path("r"), {"mode": "gpu"}, recs))
    assert f.text == banner(recs) and f.topic == "answer"
    assert picks(candidates(recs), scope(candidates(recs)), 200.0)[64].baseline_case_id == recs[0]["case_id"]


def test_stability_reads_the_interquartile_range_not_outliers():
    from ple_bench.report.verdict import spread, stable

    # a host-timed step: a few pre-empted samples lift the plain CV, the quartiles barely move
    preempted = {"median_ms": 0.30, "iqr_ms": 0.012, "cv": 0.85}
    assert spread(preempted) == pytest.approx(0.012 / 1.349 / 0.30) and stable(preempted)
    wide = {"median_ms": 0.30, "iqr_ms": 0.09, "cv": 0.05}  # a bimodal series: the quartiles are apart
    assert not stable(wide)
    assert not stable({**preempted, "unstable": True})


def test_decoder_steps_are_judged_per_context_and_layer_count():
    from ple_bench.report.verdict import compute_label, compute_of

    recs = []
    for ctx, base, pinned in ((2048, 1.50, 1.56), (8192, 4.29, 4.30)):
        kw = dict(compute_us=0.0, compute="decoder", decoder_shape="qwen3-8b", decoder_layers=2, context_len=ctx)
        recs += [_resident(256, base * 0.99, base, **kw), _rec("pinned_cpu_gather", 256, pinned, **kw)]
    recs = _run(recs)
    where = scope(candidates(recs))
    assert where.compute_us == (("decoder", "qwen3-8b", 2, 8192), ("decoder", "qwen3-8b", 2, 2048))
    text = banner(recs)
    assert text.split(":")[0].endswith(compute_label(where.compute_us[0]))  # the longest compute first
    assert compute_of(recs[-1])[0] == "decoder" and "8192-token" in text.split(":")[0]
    assert "2048-token KV cache: 256: +" in text


def test_the_banners_table_prints_each_pick_beside_its_hbm_row_and_says_what_the_text_says():
    from ple_bench.report.verdict import verdict

    recs = _run([_resident(64, 0.20, 0.24), _resident(256, 0.26, 0.30),
                 _rec("pinned_cpu_gather", 64, 0.235), _rec("pinned_cpu_gather", 256, 0.33)])
    v = verdict(recs)
    rows = v.rows()
    assert [r["tokens"] for r in rows] == ["64", "256"]
    for r in rows:  # the cost printed is the ratio of the two times printed beside it
        assert float(r["cost"].rstrip(" %")) == pytest.approx(100 * (float(r["step_ms"]) / float(r["hbm_ms"]) - 1),
                                                            abs=0.06)
    assert rows[0]["step_ms"] == "0.2350" and rows[0]["hbm_ms"] == "0.2280" and rows[0]["as_fast"] == "yes"
    assert rows[1]["as_fast"] == "no"  # 0.33 vs 0.285: +15.8 %
    assert v.text == banner(recs) and v.head in v.text and v.tail in v.text


def test_a_verdict_resting_on_one_pinned_configuration_says_so():
    """The default suite's banner held its one pinned step on the 47.7 GiB table (the reference UVA
    kernel, eager) against HBM: +65 %, true of that path, not of the best one. The banner says that
    only one configuration was measured and where every path is."""
    from ple_bench.report.verdict import verdict

    one = _run([_resident(256, 0.20, 0.24), _rec("pinned_uva", 256, 0.33, ids_on="device", timer="cuda_event",
                                                 graph="eager")])
    assert "Only one pinned configuration was measured here (pinned_uva" in verdict(one).tail
    two = _run([_resident(256, 0.20, 0.24), _rec("pinned_uva", 256, 0.33, ids_on="device", timer="cuda_event",
                                                 graph="eager"), _rec("pinned_cpu_gather", 256, 0.25)])
    assert "Only one" not in verdict(two).tail


def test_the_banner_says_faster_only_when_every_token_count_beats_hbm_by_more_than_the_band():
    from ple_bench.report.verdict import EQUAL_PCT, verdict

    # host-sync full graphs of the resident step: 0.228 / 0.285 ms (0.24 and 0.30 x 0.95)
    faster = _run([_resident(64, 0.20, 0.24), _resident(256, 0.26, 0.30),
                   _rec("pinned_host_flag", 64, 0.210, graph="full"), _rec("pinned_host_flag", 256, 0.262, graph="full")])
    assert verdict(faster) is not None
    text = banner(faster)
    assert "faster than HBM (by 7.9 % at 64 tokens to 8.1 % at 256)" in text, text
    assert "as fast as HBM" not in text
    # one token count only within the band: "as fast", not "faster"
    close = _run([_resident(64, 0.20, 0.24), _resident(256, 0.26, 0.30),
                  _rec("pinned_host_flag", 64, 0.210, graph="full"),
                  _rec("pinned_host_flag", 256, 0.285 * (1 - (EQUAL_PCT - 1) / 100), graph="full")])
    text = banner(close)
    assert "as fast as HBM (within 5 %: yes" in text and "faster than HBM" not in text, text
