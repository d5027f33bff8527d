"""The serving answer: the SLO view of serve records (ple_bench/serving/slo.py) and ``advise --model``
(ple_bench/advise/serving.py), on synthetic serving runs (tests/_fake_serve.py)."""

from __future__ import annotations

import json

import pytest

from ple_bench.advise.serving import ServingAsk, served_capacity
from ple_bench.cli import main
from ple_bench.results import load_records
from ple_bench.serving.models import get_model
from ple_bench.serving.slo import SUMMARY_HEADERS, Placement, Scenario, ServePoint, answer_for, serving_verdict
from tests._fake_serve import law_step_ms, serve_records, write_decoder_run, write_serve_run

SC = Scenario("qwen3-8b", 8192, "bf16", int(47.7 * 2**30))
ADVISE = ["advise", "--model", "qwen3-8b", "--context", "8192", "--table-bytes", "47.7GiB", "--dim", "160",
          "--dtype", "fp8", "--heads", "16"]


def curve(placement: str, pts: list[tuple[int, float]]) -> Placement:
    return Placement(placement, tuple(ServePoint(b, ms) for b, ms in pts), max(b for b, _ in pts))


# ---------------------------------------------------------------- the SLO math

def test_target_between_measured_batches_is_interpolated_linearly_in_batch():
    host = curve("host", [(10, 10.0), (20, 20.0), (40, 40.0)])
    p = host.under(25.0)
    assert (p.serve_batch, p.source) == (25, "interpolated")
    assert p.step_ms == pytest.approx(25.0)
    assert p.tokens_per_s == pytest.approx(1000.0)


def test_interpolated_batch_rounds_down_and_the_step_follows_the_same_line():
    host = curve("host", [(10, 10.0), (30, 14.0)])
    p = host.under(12.9)  # 10 + 2.9/4 x 20 = 24.5 -> 24 sequences, step 10 + 14/20 x 4
    assert p.serve_batch == 24
    assert p.step_ms == pytest.approx(12.8)


def test_a_measured_point_at_or_under_the_target_with_nothing_larger_is_kept_as_measured():
    host = curve("host", [(10, 10.0), (20, 20.0)])
    p = host.under(30.0)
    assert (p.serve_batch, p.source, p.step_ms) == (20, "measured", 20.0)


def test_no_point_under_the_target_gives_none_and_the_sentence_says_so():
    host = curve("host", [(10, 40.0), (20, 50.0)])
    hbm = curve("hbm", [(5, 35.0), (10, 38.0)])
    assert host.under(30.0) is None
    a = answer_for(SC, host, hbm, 30.0)
    assert a.at_target.winner is None
    assert "neither placement runs a batch" in a.sentence()
    a = answer_for(SC, host, curve("hbm", [(5, 20.0), (10, 38.0)]), 30.0)
    assert a.verdict_at_target == "hbm"
    assert "host runs no batch under it (its smallest, 10 sequences, takes 40.0 ms)" in a.sentence()


def test_a_target_that_does_not_bind_is_said_once_not_as_a_second_copy_of_the_answer():
    host = curve("host", [(10, 10.0), (20, 20.0)])
    hbm = curve("hbm", [(5, 8.0), (10, 12.0)])
    a = answer_for(SC, host, hbm, 100.0)  # both placements run their largest batch under it
    text = a.sentence()
    assert "the 100.0 ms TPOT target does not bind" in text
    assert text.count("20 sequences") == 1 and text.count("tokens/s") == 1, text
    cells = a.summary_cells()
    assert cells[-1] == "–" and len(cells) == len(SUMMARY_HEADERS) <= 8


def test_both_placements_at_the_same_batch_under_the_target_are_equal():
    host = curve("host", [(10, 10.0), (20, 20.0), (40, 30.0)])
    hbm = curve("hbm", [(10, 10.0), (20, 20.0), (30, 25.0)])
    a = answer_for(SC, host, hbm, 15.0)
    assert a.at_target.host.serve_batch == a.at_target.hbm.serve_batch == 15
    assert a.verdict_at_target == "equal"
    assert "under 15.0 ms TPOT both run the same batch (15) → equal" in a.sentence()
    assert a.verdict == "host"  # at their largest batches: 1333 vs 1200 tok/s


def test_answer_sentence_puts_the_hbm_row_beside_the_host_and_the_ratio():
    host = curve("host", [(48, 20.0), (96, 31.0)])
    hbm = curve("hbm", [(27, 14.0), (54, 20.1)])
    a = answer_for(SC, host, hbm, 25.0)
    s = a.sentence()
    assert s.startswith("qwen3-8b, 8 K context, bf16 KV, 47.7 GiB table: host: 96 sequences of 8 K tokens, "
                        "3 100 tok/s at 31.0 ms TPOT; HBM: 54 sequences, 2 690 tok/s at 20.1 ms TPOT")
    assert a.at_max.ratio == pytest.approx((96 / 31.0) / (54 / 20.1))
    assert f"host serves {a.at_max.ratio:.2f}× the tokens/s" in s
    rows = {label: (h, b, r) for label, h, b, r in a.table()}
    assert rows["sequences at the largest batch"] == ("96", "54", "1.78×")
    assert rows["sequences under 25.0 ms TPOT"][0] == "69 (interpolated)"  # 48 + 5/11 x 48 = 69.8


def test_a_placement_with_no_point_says_why_and_the_other_serves_alone():
    host = curve("host", [(10, 10.0), (20, 20.0)])
    hbm = Placement("hbm", (), 0, "no sequence fits: (67.1 GiB - 63.0) / 1.12 = 0")
    a = answer_for(SC, host, hbm, 30.0)
    assert a.verdict == "host"
    assert "HBM: no batch fits (no sequence fits: (67.1 GiB - 63.0) / 1.12 = 0)" in a.sentence()
    assert "only host serves" in a.sentence()


def test_serving_verdict_reads_records_per_scenario_and_their_stored_tokens_per_s():
    recs = serve_records(contexts=(2048, 8192))
    answers = serving_verdict(recs, tpot_ms=30.0)
    assert [a.scenario.context_len for a in answers] == [2048, 8192]
    top = max((r for r in recs if r["placement"] == "host" and r["context_len"] == 8192 and r["status"] == "ok"),
              key=lambda r: r["serve_batch"])
    top["tokens_per_s"] = 1234.5  # the stored figure is the one read
    a = serving_verdict(recs)[1]
    assert a.host.at_max.serve_batch == top["serve_batch"]
    assert a.host.at_max.tokens_per_s == 1234.5
    assert a.host.max_batch == top["max_batch"]


def test_a_functional_run_has_no_serving_verdict():
    a = serving_verdict(serve_records(contexts=(2048,), mode="functional"))[0]
    assert a.functional and a.verdict is None and a.verdict_at_target is None
    assert "no serving verdict" in a.sentence() and "serves" not in a.sentence().split("--")[1]


def test_skipped_records_carry_their_reason_into_the_placement():
    recs = serve_records(contexts=(2048,), hbm_bytes=int(60e9))  # 60 GB: the resident table leaves nothing
    a = serving_verdict(recs)[0]
    assert a.hbm.points == () and "no sequence fits" in a.hbm.reason
    assert a.verdict == "host"


# ---------------------------------------------------------------- advise --model

def advise_json(capsys, *args: str) -> dict:
    assert main([*ADVISE, *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_advise_model_answers_from_measured_serve_records(tmp_path, capsys):
    run = write_serve_run(tmp_path, noise=0.01, seed=3)
    out = advise_json(capsys, "--runs", str(run), "--tpot-ms", "25")
    recs = [r for r in load_records(run) if r["context_len"] == 8192 and r["status"] == "ok"]
    for placement in ("host", "hbm"):
        pl = out["placements"][placement]
        top = max((r for r in recs if r["placement"] == placement), key=lambda r: r["serve_batch"])
        assert pl["source"] == "measured"
        assert pl["serve_batch"] == top["serve_batch"] == pl["capacity"]["max_batch"]
        assert pl["tokens_per_s"] == pytest.approx(top["tokens_per_s"])
        assert pl["tpot_ms"] == pytest.approx(top["tpot_ms"])
        assert set(pl["capacity"]) >= {"budget_bytes", "weight_bytes", "table_term_bytes", "activation_bytes",
                                       "kv_bytes_per_seq", "max_batch", "explain"}
        assert "EngramConfig(cpu_offload=" in pl["engine_setting"]
    assert out["placements"]["host"]["capacity"]["table_term_bytes"] < out["placements"]["hbm"]["capacity"][
        "table_term_bytes"]
    assert out["tpot_target_ms"] == 25.0
    assert out["answer"].startswith("qwen3-8b, 8 K context, bf16 KV, 47.7 GiB table: host: ")
    assert out["ratio_at_max"] == pytest.approx(out["placements"]["host"]["tokens_per_s"]
                                                / out["placements"]["hbm"]["tokens_per_s"])


def test_advise_model_predicts_another_gpu_and_marks_every_row_predicted(tmp_path, capsys):
    run = write_serve_run(tmp_path)
    out = advise_json(capsys, "--runs", str(run), "--hbm-bytes", "80GB")
    assert {pl["source"] for pl in out["placements"].values()} == {"predicted"}
    assert all(p["source"] == "predicted" for pl in out["placements"].values() for p in pl["points"])
    host = out["placements"]["host"]
    # the law the run was written from (fixed 0.3 ms, 4000 GB/s, host +0.01 ms) at the predicted batch
    assert host["tpot_ms"] == pytest.approx(law_step_ms("qwen3-8b", host["serve_batch"], 8192, extra_ms=0.01),
                                            rel=1e-3)
    assert host["serve_batch"] > out["placements"]["hbm"]["serve_batch"] >= 1
    assert out["hbm_bytes"] == 80_000_000_000


def test_advise_model_from_decoder_steps_adds_each_paths_exposed_lookup(tmp_path, capsys):
    run = write_decoder_run(tmp_path, exposed={"device": 0.004, "pinned_host_flag": 0.25})
    out = advise_json(capsys, "--runs", str(run))
    assert out["step_model"]["exposed_ms"] == {"hbm": pytest.approx(0.004), "host": pytest.approx(0.25)}
    for placement, extra in (("host", 0.25), ("hbm", 0.004)):
        pl = out["placements"][placement]
        assert pl["source"] == "predicted"
        assert pl["tpot_ms"] == pytest.approx(law_step_ms("qwen3-8b", pl["serve_batch"], 8192, extra_ms=extra),
                                              rel=1e-3)
    assert out["holdout"]["leave_one_batch_out"]["n"] == 0  # no serve record to hold out


def test_a_prediction_is_never_shorter_than_its_bytes_at_the_hbm_read_ceiling(tmp_path, capsys):
    run = write_decoder_run(tmp_path, rate_gbps=9000.0, fixed_ms=0.0, hbm_read_gbps=4000.0,
                            exposed={"device": 0.0, "pinned_host_flag": 0.0})
    out = advise_json(capsys, "--runs", str(run))
    m = get_model("qwen3-8b")
    for pl in out["placements"].values():
        for p in pl["points"]:
            nbytes = m.weight_bytes() + p["serve_batch"] * 8192 * m.kv_bytes_per_token("bf16")
            assert p["step_ms"] == pytest.approx(nbytes / 4000e6)  # the floor, not the fitted 9000 GB/s


def test_the_holdout_error_is_computed_and_printed(tmp_path, capsys):
    clean = write_serve_run(tmp_path / "a")
    out = advise_json(capsys, "--runs", str(clean))
    batch, context = out["holdout"]["leave_one_batch_out"], out["holdout"]["leave_one_context_out"]
    assert batch["n"] == 24 and context["n"] == 24  # 3 contexts x 2 placements x 4 fractions
    assert batch["worst_abs_pct"] < 0.5 and context["worst_abs_pct"] < 0.5  # the law itself
    recs = serve_records()
    bad = next(r for r in recs if r["status"] == "ok" and r["context_len"] == 2048 and r["placement"] == "hbm")
    for k in ("step_ms", "median_ms"):
        bad[k] *= 1.3
    off = write_serve_run(tmp_path / "b", records=recs)
    out = advise_json(capsys, "--runs", str(off))
    assert out["holdout"]["leave_one_batch_out"]["worst_abs_pct"] > 15
    assert main([*ADVISE, "--runs", str(off)]) == 0
    text = capsys.readouterr().out
    assert "leave one batch out: median" in text and "leave one context out: median" in text


def test_advise_capacity_is_the_serving_suites_rule(tmp_path):
    """advise's capacity for any HBM gives the batch the serve executor's rule gives on its device."""
    import torch

    from ple_bench.run.serve import FUNCTIONAL_HBM_BYTES, serve_capacity
    from ple_bench.spec.suite import load_suite

    cases = [c for c in load_suite("serving_functional").cases if c.batch_fraction == 1.0]
    assert cases
    for case in cases:
        placement = "hbm" if case.impl == "device" else "host"
        ask = ServingAsk(get_model(case.model), case.context_len, case.kv_dtype, case.table_bytes, case.dim,
                         case.dtype, case.num_heads, gpu_memory_utilization=case.gpu_memory_utilization)
        ours = served_capacity(ask, placement, FUNCTIONAL_HBM_BYTES, None, element_bytes=4)  # fp32 on a CPU
        theirs = serve_capacity(case, placement, torch.device("cpu"))
        assert (ours.max_batch, ours.table_term_bytes, ours.weight_bytes) == (
            theirs.max_batch, theirs.table_term_bytes, theirs.weight_bytes)
        assert ours.max_batch > 0


def test_advise_model_bad_input_exits_2_naming_the_flag(tmp_path, capsys, monkeypatch):
    run = write_serve_run(tmp_path)
    monkeypatch.chdir(tmp_path)  # no docs/runs archive here: --model without --runs has nothing to read
    assert main(["advise", "--model", "qwen9", "--context", "8192", "--table-bytes", "1GiB", "--dim", "160",
                 "--dtype", "fp8", "--heads", "16", "--runs", str(run)]) == 2
    err = capsys.readouterr().err
    assert "--model" in err and "qwen3-8b" in err
    assert main(["advise", "--model", "qwen3-8b", "--table-bytes", "1GiB", "--dim", "160", "--dtype", "fp8",
                 "--heads", "16", "--runs", str(run)]) == 2
    assert "--context" in capsys.readouterr().err
    assert main([*ADVISE, "--kv-dtype", "int4", "--runs", str(run)]) == 2
    assert "--kv-dtype" in capsys.readouterr().err
    assert main([*ADVISE]) == 2
    assert "--runs" in capsys.readouterr().err
    assert main(["advise", "--table-bytes", "1GiB", "--dim", "160", "--dtype", "fp8", "--heads", "16"]) == 2
    assert "--tokens" in capsys.readouterr().err


def test_capacity_that_does_not_fit_is_an_answer_with_its_numbers(tmp_path, capsys):
    run = write_serve_run(tmp_path)
    out = advise_json(capsys, "--runs", str(run), "--host-bytes", "32GiB")
    host = out["placements"]["host"]
    assert host["source"] == "does not fit" and host["serve_batch"] == 0
    assert "47.7 GiB" in host["capacity"]["reason"] and "32.0 GiB" in host["capacity"]["reason"]
    assert out["verdict"] == "hbm"
    small_host = write_serve_run(tmp_path / "small-host", host_memory_bytes=40 * 2**30)
    out = advise_json(capsys, "--runs", str(small_host))  # the runs' machine's host memory when not asked
    assert out["placements"]["host"]["source"] == "does not fit" and "40.0 GiB" in out["placements"]["host"][
        "capacity"]["reason"]
    assert main([*ADVISE[:4], "2000000", *ADVISE[5:], "--runs", str(run)]) == 0  # 2 M tokens: no sequence fits
    text = capsys.readouterr().out
    assert "host: no batch fits (no sequence of 2000000 tokens fits" in text and "HBM: no batch fits" in text


# ---------------------------------------------------------------- the report and summary.md lead with it

def test_the_report_leads_with_the_serving_answer_when_the_run_has_serve_records(tmp_path):
    from ple_bench.report.export import write_summaries
    from ple_bench.report.html import build_report

    run = write_serve_run(tmp_path / "runs", contexts=(2048, 8192))
    html = build_report(run, tmp_path / "reports").read_text()
    answers = serving_verdict(serve_records(contexts=(2048, 8192)))
    assert html.index('id="serving"') < html.index('id="key-findings"')
    assert html.index('id="serving"') < html.index('id="plot-serving"') < html.index('id="serving-table"')
    for a in answers:
        assert a.sentence() in html  # each scenario's sentence, as the verdict wrote it
    assert 'id="verdict"' not in html  # no lookup verdict to show: the serving answer leads alone
    write_summaries(run)
    md = (run / "summary.md").read_text()
    assert md.index("## What the placement buys") < md.index("## Cases") and "## Verdict" not in md
    assert f"- {answers[1].sentence()}" in md


def test_the_report_has_no_serving_section_without_serve_records(tmp_path):
    from ple_bench.report.export import write_summaries
    from ple_bench.report.html import build_report

    run = write_decoder_run(tmp_path / "runs")
    html = build_report(run, tmp_path / "reports").read_text()
    assert 'id="serving"' not in html and 'id="plot-serving"' not in html and 'id="verdict"' in html
    write_summaries(run)
    assert "What the placement buys" not in (run / "summary.md").read_text()


def test_advise_model_on_a_functional_run_answers_without_a_verdict(tmp_path, capsys):
    run = write_serve_run(tmp_path, model="tiny", mode="functional", hbm_bytes=2 << 20, contexts=(64, 256),
                          table_bytes=512 << 10, heads=4, hbm_read_gbps=None)
    assert main(["advise", "--model", "tiny", "--context", "64", "--table-bytes", "512KiB", "--dim", "160",
                 "--dtype", "fp8", "--heads", "4", "--runs", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] is None and out["ratio_at_max"] is None  # no verdict, no ratio
    assert "no serving verdict" in out["answer"]
    assert {pl["source"] for pl in out["placements"].values()} == {"measured"}
    assert out["step_model"] is None  # nothing but functional records: no model, every row measured


def test_the_serving_plot_needs_two_batches_of_a_placement(tmp_path):
    from ple_bench.report.data import load_run
    from ple_bench.report.plots_serving import main as plot_main
    from ple_bench.report.plots_serving import plot_serving

    one = [r for r in serve_records(contexts=(2048,)) if r.get("batch_fraction") in (None, 1.0)]
    assert plot_serving(load_run(write_serve_run(tmp_path / "one", records=one))) is None
    run = write_serve_run(tmp_path / "all", contexts=(2048,))
    plot = plot_serving(load_run(run), tpot_ms=20.0)
    assert plot is not None and plot.key == "serving" and plot.data_uri.startswith("data:image/png;base64,")
    assert plot.legend_entries == 4  # host, HBM, the stars under the target, the target line
    assert plot_main([str(run), "--out", str(tmp_path / "s.png")]) == 0
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"


def test_a_placement_measured_alone_lends_the_other_only_its_lookup_difference(tmp_path, capsys):
    hbm_only = write_serve_run(tmp_path / "serve", placements=("hbm",))
    steps = write_decoder_run(tmp_path / "steps", exposed={"device": 0.004, "pinned_host_flag": 0.254})
    out = advise_json(capsys, "--runs", str(hbm_only), str(steps))
    assert out["placements"]["hbm"]["source"] == "measured"
    host = out["placements"]["host"]
    assert host["source"] == "predicted"
    assert out["step_model"]["exposed_ms"] == {"host": pytest.approx(0.25), "hbm": 0.0}
    assert host["tpot_ms"] == pytest.approx(law_step_ms("qwen3-8b", host["serve_batch"], 8192, extra_ms=0.25),
                                            rel=1e-3)


def test_the_step_model_finds_a_per_sequence_cost_beside_the_bytes(tmp_path, capsys):
    run = write_serve_run(tmp_path, per_seq_ms=0.012, fixed_ms=2.5)  # the matmuls' compute grows with the batch
    out = advise_json(capsys, "--runs", str(run), "--hbm-bytes", "180GB")
    assert out["step_model"]["per_seq_ms"] == pytest.approx(0.012, rel=1e-3)
    assert out["step_model"]["hbm_read_rate_gbps"] == pytest.approx(4000.0, rel=1e-3)
    host = out["placements"]["host"]
    assert host["tpot_ms"] == pytest.approx(law_step_ms("qwen3-8b", host["serve_batch"], 8192, fixed_ms=2.5,
                                                        extra_ms=0.01, per_seq_ms=0.012), rel=1e-3)


def test_fp8_kv_is_predicted_from_bf16_serve_records_at_half_the_kv_bytes(tmp_path, capsys):
    run = write_serve_run(tmp_path)
    bf16 = advise_json(capsys, "--runs", str(run))
    fp8 = advise_json(capsys, "--runs", str(run), "--kv-dtype", "fp8")
    assert {pl["source"] for pl in fp8["placements"].values()} == {"predicted"}
    for p in ("host", "hbm"):
        assert fp8["placements"][p]["capacity"]["kv_bytes_per_seq"] * 2 == bf16["placements"][p]["capacity"][
            "kv_bytes_per_seq"]
        assert fp8["placements"][p]["serve_batch"] > bf16["placements"][p]["serve_batch"]
    host = fp8["placements"]["host"]
    assert host["tpot_ms"] == pytest.approx(law_step_ms("qwen3-8b", host["serve_batch"], 8192, "fp8", extra_ms=0.01),
                                            rel=1e-3)


def test_a_scenario_the_run_only_predicted_says_not_measured(tmp_path):
    recs = [dict(r, status="skipped", kv_source="predicted", reason="kv_dtype=fp8: no decode-attention kernel",
                 kv_dtype="fp8", step_ms=None, median_ms=None)
            for r in serve_records(contexts=(8192,)) if r.get("batch_fraction") == 1.0]
    a = serving_verdict(recs)[0]
    assert a.verdict is None and a.host.max_batch > 0
    assert "host: not measured (kv_dtype=fp8" in a.sentence()
    assert a.sentence().endswith("→ no step measured (advise --model predicts one)")


def test_a_repeated_serve_case_carries_and_prints_its_tokens_per_s_interval_over_processes():
    from ple_bench.record import derive

    recs = serve_records(contexts=(8192,))
    host = max((r for r in recs if r.get("placement") == "host"), key=lambda r: r["serve_batch"])
    step = host["step_ms"]
    host["replicates"] = [{"process": p, "round": 0, "ms": {"step_ms": step * (1 + d)}, "se_ms": {}}
                          for p, d in enumerate((-0.01, 0.0, 0.01, 0.0))]
    host["processes"] = 4
    derive(host, {})
    assert host["tokens_per_s_ci_low"] < host["tokens_per_s"] < host["tokens_per_s_ci_high"]
    assert host["ci_low_ms"] < step < host["ci_high_ms"]
    (answer,) = serving_verdict(recs)
    assert "95 % CI" in answer.sentence() and "4 processes" in answer.sentence()
    point = answer.to_json()["placements"]["host"]["at_max"]
    assert point["processes"] == 4 and point["tokens_per_s_ci"][0] < point["tokens_per_s"]
