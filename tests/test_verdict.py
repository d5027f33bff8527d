"""The offload verdict (report/verdict.py): the one rule every screen prints."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ple_bench.spec.case import Case
from ple_bench.report.data import Run
from ple_bench.report.findings import offload_answer_findings
from ple_bench.report import verdict as V
from ple_bench.report.verdict import STABLE_CV, candidates, picks, scope, verdicts
from tests._fake_runs import derive_in_order

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


def _spread(median_ms: float, n: int = 41, cv: float = 0.01, seed: int = 0) -> list[float]:
    """``n`` samples whose median is exactly ``median_ms`` (odd n), spread by ``cv``."""
    rng = np.random.default_rng(seed)
    x = median_ms * (1 + cv * rng.standard_normal(n))
    return list(x - np.median(x) + median_ms)


def _resident(tokens: int, events_ms: float, sync_ms: float, samples: bool = False, **kw) -> dict:
    if samples:  # each figure's own samples: the full graph on the host-sync timer is the baseline
        kw.update(samples_ms=_spread(events_ms, seed=1), step_host_sync_samples_ms=_spread(sync_ms, seed=2),
                  full_step_samples_ms=_spread(events_ms * 0.95, seed=3),
                  full_step_host_sync_samples_ms=_spread(sync_ms * 0.95, seed=4))
    return _rec("device", tokens, events_ms, ids_on="device", timer="cuda_event", step_host_sync_ms=sync_ms,
                full_step_ms=events_ms * 0.95, full_step_host_sync_ms=sync_ms * 0.95, **kw)


_run = derive_in_order




def _by_tokens(recs):
    return {e.num_tokens: e for e in verdicts(recs)}


def test_each_token_count_gets_the_lowest_ratio_stable_pinned_step_against_its_own_timers_hbm_row():
    recs = _run([
        _resident(64, 0.20, 0.24), _resident(256, 0.26, 0.30),
        # a UVA step on CUDA events: 0.21 ms is faster in absolute time than the host-timed CPU gather,
        # but against the events' full graph (0.19 ms) its ratio is worse: 1.105 vs 0.235 / 0.228 = 1.031
        _rec("pinned_cpu_gather", 64, 0.235), _rec("pinned_uva", 64, 0.21, ids_on="device", timer="cuda_event"),
        _rec("pinned_cpu_gather", 256, 0.33), _rec("pinned_copy_engine", 256, 0.20, cv=0.43),  # noisy: left out
    ])
    at = _by_tokens(recs)
    assert at[64].pinned_case_id == recs[2]["case_id"] and at[64].timer == "host_sync"
    assert at[64].resident_ms == pytest.approx(0.228) and at[64].resident_graph == "full"
    assert at[64].ratio == pytest.approx(0.235 / 0.228) and at[64].verdict == "as fast"
    assert at[256].pinned_case_id == recs[4]["case_id"] and at[256].verdict == "slower"  # 0.33 / 0.285
    assert at[64].ci_low is None  # records without samples: decided on the point, no interval


@pytest.mark.parametrize("lo, hi, want", [
    (0.90, 0.949, "faster"), (0.90, 0.951, "as fast"), (0.96, 1.04, "as fast"), (0.95, 1.05, "as fast"),
    (1.00, 1.051, "undecided"), (1.06, 1.10, "slower"), (0.80, 1.20, "undecided"), (1.0501, 1.2, "slower")])
def test_the_verdict_is_read_off_the_interval_with_the_five_percent_band(lo, hi, want):
    assert V.decide(lo, hi) == want


def test_the_interval_is_a_seeded_bootstrap_of_the_two_medians():
    rng = np.random.default_rng(7)
    a, b = list(rng.lognormal(0, 0.05, 101) * 1.02), list(rng.lognormal(0, 0.05, 80))
    lo, hi = V.ratio_interval(a, b, "x|y")
    assert (lo, hi) == V.ratio_interval(a, b, "x|y")  # deterministic
    # the plain bootstrap (resample the samples, take the medians) gives the same percentiles
    aa, bb = np.asarray(a), np.asarray(b)
    ma = np.median(aa[rng.integers(0, aa.size, (8000, aa.size))], axis=1)
    mb = np.median(bb[rng.integers(0, bb.size, (8000, bb.size))], axis=1)
    want = np.percentile(ma / mb, [2.5, 97.5])
    assert lo == pytest.approx(want[0], abs=0.004) and hi == pytest.approx(want[1], abs=0.004)
    assert lo < np.median(aa) / np.median(bb) < hi
    # more samples, a narrower interval
    lo2, hi2 = V.ratio_interval(a * 9, b * 9, "x|y")
    assert hi2 - lo2 < (hi - lo) / 2


def test_the_interval_uses_the_samples_of_the_figure_the_baseline_offers():
    base = _resident(256, 0.26, 0.30, samples=True)
    flag = _rec("pinned_host_flag", 256, 0.2850 * 1.02, graph="full",
                samples_ms=_spread(0.2850 * 1.02, n=41, cv=0.01, seed=5))
    (e,) = verdicts(_run([base, flag]))
    assert e.resident_graph == "full" and e.timer == "host_sync" and e.resident_ms == pytest.approx(0.285)
    assert e.ci_low < 1.02 < e.ci_high and e.ci_high - e.ci_low < 0.02  # about the full graph's samples
    assert V.resident_samples(base, 0.285) == base["full_step_host_sync_samples_ms"]
    # throttled samples are left out as the record's summary leaves them out
    flagged = dict(flag, samples_ms=flag["samples_ms"] + [9.0] * 30, samples_throttled=[False] * 41 + [True] * 30)
    (e2,) = verdicts(_run([dict(base), flagged]))
    assert (e2.ci_low, e2.ci_high) == (e.ci_low, e.ci_high)


def test_verdicts_are_per_table_ids_compute_and_token_count_and_blind_to_the_rest():
    big = 1 << 22
    same = [_resident(64, 0.20, 0.24, vocab=big), _rec("pinned_cpu_gather", 64, 0.232, vocab=big)]
    others = [_resident(64, 0.10, 0.12, vocab=big, compute_us=50.0),
              _rec("pinned_cpu_gather", 64, 0.05, vocab=big, compute_us=50.0),  # faster there: its own key
              _resident(64, 0.20, 0.24), _rec("pinned_cpu_gather", 64, 0.90),  # a smaller table
              _resident(64, 0.20, 0.24, vocab=big, ids="ngram"), _rec("pinned_cpu_gather", 64, 0.20, vocab=big, ids="ngram"),
              _resident(256, 0.2, 0.24, vocab=big), _rec("pinned_cpu_gather", 256, 0.15, vocab=big)]
    alone = verdicts(_run([dict(r) for r in same]))
    every = verdicts(_run([dict(r) for r in same] + others))
    assert len(alone) == 1 and alone[0] in every
    keys = [(e.table_bytes, e.compute, e.ids, e.num_tokens, e.verdict) for e in every]
    assert keys == [(big * 160, 200.0, "ngram", 64, "faster"), (big * 160, 200.0, "uniform", 64, "as fast"),
                    (big * 160, 200.0, "uniform", 256, "faster"), (big * 160, 50.0, "uniform", 64, "faster"),
                    ((1 << 20) * 160, 200.0, "uniform", 64, "slower")]
    # the headline speaks of the largest table, longest compute, and the ids with the most verdicts
    assert V.headline(every).startswith("640 MiB table, uniform ids, 200 us of compute:")
    assert "64 tokens as fast (1.02)" in V.headline(every) and "256 tokens faster" in V.headline(every)


def test_no_verdict_says_why_and_a_resident_only_run_has_none():
    assert verdicts(_run([_resident(64, 0.2, 0.24)])) == []
    (noisy,) = verdicts(_run([_resident(64, 0.2, 0.24), _rec("pinned_cpu_gather", 64, 0.25, cv=0.4)]))
    assert noisy.verdict == "no verdict" and "too noisy" in noisy.reason and noisy.ratio is None
    (lonely,) = verdicts(_run([_rec("pinned_cpu_gather", 64, 0.25)]))
    assert lonely.verdict == "no verdict" and "no resident step" in lonely.reason
    assert "no verdict" in V.entry_text(lonely)


def test_a_functional_run_has_no_performance_verdict_anywhere():
    recs = _run([_resident(8, 20.0, 24.0, mode="functional"),
                 _rec("pinned_cpu_gather", 8, 0.1, mode="functional")])  # "faster" on the CPU's clock
    assert V.is_functional(recs) and verdicts(recs) == []
    assert V.headline(verdicts(recs), functional=True) == V.FUNCTIONAL_TEXT == "functional run: no performance verdict"
    assert V.verdict_document(recs) == {"functional": True, "verdict": V.FUNCTIONAL_TEXT, "verdicts": []}
    assert not offload_answer_findings(Run(Path("r"), {"mode": "functional"}, recs))


def test_verdict_json_holds_one_entry_per_key_with_the_named_fields(tmp_path):
    import json

    recs = _run([_resident(256, 0.26, 0.30, samples=True),
                 _rec("pinned_host_flag", 256, 0.27, graph="full", samples_ms=_spread(0.27, seed=9))])
    path = V.write_verdict_json(tmp_path, recs)
    doc = json.loads(path.read_text())
    (entry,) = doc["verdicts"]
    assert {"table_bytes", "compute", "ids", "num_tokens", "verdict", "ratio", "ci_low", "ci_high",
            "pinned_case_id", "resident_case_id"} <= set(entry)
    assert entry["verdict"] == "as fast" and entry["ratio"] == pytest.approx(0.27 / 0.285)
    assert entry["resident_case_id"] == recs[0]["case_id"] and path.name == "verdict.json"


def test_the_report_finding_is_the_verdict():
    recs = _run([_resident(64, 0.20, 0.24), _rec("pinned_cpu_gather", 64, 0.25)])
    (f,) = offload_answer_findings(Run(Path("r"), {"mode": "gpu"}, recs))
    assert f.topic == "answer" and f.text.startswith(V.headline(verdicts(recs)))
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
    from ple_bench.report.verdict import compute_label

    recs = []
    for ctx, base, pinned in ((2048, 1.50, 1.60), (8192, 4.29, 4.20)):
        kw = dict(compute_us=0.0, compute="decoder", decoder_shape="qwen3-8b", decoder_layers=2, context_len=ctx)
        recs += [_resident(256, base * 0.99, base, **kw), _rec("pinned_cpu_gather", 256, pinned, **kw)]
    entries = verdicts(_run(recs))
    assert [e.compute for e in entries] == [("decoder", "qwen3-8b", 2, 8192), ("decoder", "qwen3-8b", 2, 2048)]
    assert [e.verdict for e in entries] == ["as fast", "slower"]  # 4.20 / 4.0755; 1.60 / 1.425
    assert V.headline(entries).split(":")[0].endswith(compute_label(entries[0].compute))
    assert entries[0].to_json()["compute"] == "decoder:qwen3-8b:2x8192"
