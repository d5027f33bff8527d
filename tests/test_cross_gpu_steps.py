"""scripts/gpu_error.py's decode-step table (:func:`ple_bench.advise.cross_gpu.step_compare`): the cases
both GPUs measured apart from the ones the source never did, each measured step the median over the
target's runs, and a pinned step's verdict against its resident baseline on the baseline's own timer
-- on synthetic steps of a known law (tests/test_model.py's)."""

from __future__ import annotations

import statistics

import pytest

from ple_bench.advise.cross_gpu import ServeRow, host_hbm_ratios, step_compare
from tests.test_model import law_meta, synthetic


def _runs(run_id: str, *, scale: float = 1.0, host_sync_extra: float = 0.0):
    """The law's device and pinned_uva steps of one run; each resident step also timed on the host
    clock (``step_host_sync_ms``: ``host_sync_extra`` ms longer), each pinned step timed on the host
    clock against that twin, as the run's records carry it."""
    recs = synthetic()
    for r in recs:
        r["_run_id"] = run_id
        r["step_ms"] *= scale
        r["timer"] = "host_sync" if r["impl"] != "device" else "cuda_event"
    dev = {(r["table_bytes"], r["num_tokens"], r["compute_us"], r["prefetch"]): r for r in recs if r["impl"] == "device"}
    for r in recs:
        if r["impl"] == "device":
            r["step_host_sync_ms"] = r["step_ms"] + host_sync_extra
    for r in recs:
        if r["impl"] != "device":
            base = dev.get((r["table_bytes"], r["num_tokens"], r["compute_us"], False))
            r.update(offload_baseline=base["case_id"], offload_baseline_ms=base["step_host_sync_ms"],
                     offload_baseline_timer="host_sync", offload_baseline_graph=base["graph"])
    return recs


def test_a_pinned_verdict_holds_the_baseline_on_its_own_timer_and_runs_give_their_median():
    meta = law_meta()
    src = (_runs("20261201-000000-a"), [dict(meta, run_id="20261201-000000-a")])
    # the target: two runs, one 10 % slower; the resident host-sync twin 0.05 ms over its event time
    tgt_recs = _runs("20261207-000000-b", host_sync_extra=0.05) + _runs("20261207-000001-c", scale=1.1,
                                                                          host_sync_extra=0.05)
    tgt = (tgt_recs, [dict(meta, run_id="20261207-000000-b"), dict(meta, run_id="20261207-000001-c")])
    sc = step_compare(src, tgt)
    assert sc.both and not sc.only_target
    one = next(c for c in sc.both if c.case_id.startswith("step.device") and "#" not in c.case_id)
    first = next(r["step_ms"] for r in tgt_recs if r["case_id"] == one.case_id)
    assert one.measured_ms == pytest.approx(first * 1.05)  # the median of x1 and x1.1
    assert sc.verdicts
    for v in sc.verdicts:
        mine = [r for r in tgt_recs if r["case_id"] == v.case_id]
        assert v.runs == 2
        assert v.measured_ratio == pytest.approx(statistics.median(r["step_ms"] / r["offload_baseline_ms"]
                                                                   for r in mine))
        # the baseline is the resident step's host-sync twin, not its event-timed step
        twins = [r["step_host_sync_ms"] for r in tgt_recs if r["case_id"] == mine[0]["offload_baseline"]]
        assert v.base_measured_ms == pytest.approx(statistics.median(twins))


def test_the_target_steps_the_source_never_measured_are_told_apart():
    meta = law_meta()
    src_recs = [r for r in _runs("20261201-000000-a") if r["num_tokens"] != 512]
    sc = step_compare((src_recs, [dict(meta, run_id="20261201-000000-a")]),
                      (_runs("20261207-000000-b"), [dict(meta, run_id="20261207-000000-b")]))
    assert sc.only_target and all(".512." in c.case_id for c in sc.only_target)
    assert not any(".512." in c.case_id for c in sc.both)


def test_the_host_hbm_ratio_is_of_each_scenarios_two_placements():
    rows = [ServeRow(2048, "host", "m", 200, 200, 30.0, 31.0, 200 / 30e-3, 200 / 31e-3, 31.0),
            ServeRow(2048, "hbm", "m", 30, 30, 11.0, 11.0, 30 / 11e-3, 30 / 11e-3, 11.0),
            ServeRow(8192, "host", "m", 50, 50, 28.0, 28.0, 50 / 28e-3, 50 / 28e-3, 28.0)]
    [(ctx, measured, predicted)] = host_hbm_ratios(rows)
    assert ctx == 2048 and measured == pytest.approx((200 / 30) / (30 / 11))
    assert predicted / measured == pytest.approx(30 / 31)
