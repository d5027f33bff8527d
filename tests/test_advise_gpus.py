"""``advise --gpu NAME``: the presets (ple_bench/advise/gpus.toml), a literal ``--hbm-bytes`` near a known
card's memory, the serve step model carried to another GPU term by term, the engine setting's lookup path,
and ``advise --model`` without a table (issue 43, defect 1) -- on synthetic serving runs."""

from __future__ import annotations

import json

import pytest

from ple_bench.advise.gpus import GpuError, get_gpu, gpu_of_device, gpus, near_card
from ple_bench.advise.serve_machine import matmul_flops_per_seq
from ple_bench.cli import main
from ple_bench.serving.models import get_model
from tests._fake_serve import write_serve_run

ADVISE = ["advise", "--model", "qwen3-8b", "--context", "8192", "--table-bytes", "47.7GiB", "--dim", "160",
          "--dtype", "fp8", "--heads", "16"]


def advise_json(capsys, *args: str) -> dict:
    assert main([*ADVISE, *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


# ---------------------------------------------------------------- the presets

def test_every_preset_sources_every_figure_it_gives():
    assert {"h100", "h200", "b200", "gh200", "gb200", "a100", "l40s"} <= set(gpus())
    for g in gpus().values():
        for figure in ("memory_bytes", "hbm_gbps", "bf16_tflops", "sms", "host_link_gbps", "h2d_gbps"):
            assert g.kind_of(figure) in ("datasheet", "measured", "assumed"), (g.key, figure, g.source(figure))
            assert g.source(figure) != "not given", (g.key, figure)


def test_the_h100_and_h200_memory_is_what_the_cards_report():
    # torch's total_memory on the H100 80GB HBM3 (what the serving suite's capacity rule starts from),
    # not nvidia-smi's 81 559 MiB: that one gave every H100 placement 1-2 sequences too many
    assert get_gpu("h100").memory_bytes == 81079 * 2**20 == 85017493504
    assert round(get_gpu("H100").memory_bytes / 2**30, 1) == 79.2
    assert round(get_gpu("h200").memory_bytes / 2**30, 1) == 139.8
    assert get_gpu("h100").kind_of("memory_bytes") == "measured"
    assert get_gpu("gh200").host_link == "NVLink-C2C" and get_gpu("gh200").h2d_gbps >= 375


def test_a_device_name_finds_its_preset_the_most_specific_first():
    assert gpu_of_device("NVIDIA H100 80GB HBM3").key == "h100"
    assert gpu_of_device("NVIDIA H200").key == "h200"
    assert gpu_of_device("NVIDIA GH200 480GB").key == "gh200"
    assert gpu_of_device("NVIDIA GeForce RTX 4090") is None


def test_a_literal_size_near_a_card_but_not_it_is_flagged():
    assert near_card(80_000_000_000).key == "h100"  # "80GB": 74.5 GiB against 79.2 reported (the A100 ties: the first)
    assert near_card(get_gpu("h100").memory_bytes) is None
    assert near_card(10 * 2**30) is None


def test_an_unknown_gpu_exits_2_naming_the_flag_and_listing_the_presets(tmp_path, capsys):
    run = write_serve_run(tmp_path)
    with pytest.raises(GpuError):
        get_gpu("h300")
    assert main([*ADVISE, "--runs", str(run), "--gpu", "h300"]) == 2
    err = capsys.readouterr().err
    assert "--gpu" in err and "h300" in err and "h100" in err and "gb200" in err
    assert main(["advise", "--table-bytes", "1GiB", "--dim", "160", "--dtype", "fp8", "--heads", "16",
                 "--tokens", "64", "--compute-us", "100", "--runs", str(run), "--gpu", "nope"]) == 2
    assert "--gpu" in capsys.readouterr().err
    assert main(["advise", "--table-bytes", "1GiB", "--dim", "160", "--dtype", "fp8", "--heads", "16",
                 "--tokens", "64", "--compute-us", "100", "--runs", str(run), "--gpu", "h100"]) == 2
    assert "--gpu: answers --model" in capsys.readouterr().err  # never a flag silently ignored


# ---------------------------------------------------------------- the step model in machine terms

def test_hbm_bytes_80gb_warns_and_names_the_card(tmp_path, capsys):
    run = write_serve_run(tmp_path)
    out = advise_json(capsys, "--runs", str(run), "--hbm-bytes", "80GB")
    assert any("H100 SXM 80GB" in w and "--gpu h100" in w for w in out["warnings"])
    out = advise_json(capsys, "--runs", str(run), "--gpu", "h100")
    assert out["warnings"] == [] and out["hbm_bytes"] == get_gpu("h100").memory_bytes


def test_gpu_carries_the_bytes_term_by_the_datasheet_peaks(tmp_path, capsys):
    # the runs: an H200 (fake meta) reading at 4000 GB/s fitted; no per-sequence term
    run = write_serve_run(tmp_path, rate_gbps=4000.0, fixed_ms=0.3, host_extra_ms=0.0)
    own = advise_json(capsys, "--runs", str(run))["step_model"]
    out = advise_json(capsys, "--runs", str(run), "--gpu", "h100")
    m = out["step_model"]
    assert m["hbm_read_rate_gbps"] == pytest.approx(own["hbm_read_rate_gbps"] * 3350.0 / 4800.0, rel=1e-6)
    assert m["fixed_ms"] == pytest.approx(own["fixed_ms"])
    assert {pl["source"] for pl in out["placements"].values()} == {"predicted"}
    assert out["machine"]["target"]["preset"] == "h100" and out["machine"]["runs"]["preset"] == "h200"
    kinds = out["machine"]["target"]["sources"]
    assert kinds["hbm_gbps"].startswith("datasheet") and kinds["h2d_gbps"].startswith("measured")


def test_hbm_gbps_reaches_the_serve_step_model(tmp_path, capsys):
    run = write_serve_run(tmp_path, hbm_read_gbps=4400.0)
    own = advise_json(capsys, "--runs", str(run))
    out = advise_json(capsys, "--runs", str(run), "--hbm-gbps", "2200")
    # the achievable rate halved against the runs' measured read ceiling: the bytes term doubles
    assert out["step_model"]["hbm_read_rate_gbps"] == pytest.approx(own["step_model"]["hbm_read_rate_gbps"] / 2)
    assert out["placements"]["hbm"]["tpot_ms"] > 1.8 * own["placements"]["hbm"]["tpot_ms"] - 1.0
    assert out["machine"]["target"]["sources"]["hbm_read_gbps"].startswith("given")


def test_a_carried_step_is_never_below_its_bytes_or_flops_at_the_targets_peaks(tmp_path, capsys):
    run = write_serve_run(tmp_path, rate_gbps=4000.0, fixed_ms=0.0, host_extra_ms=0.0)
    m = get_model("qwen3-8b")
    for gpu in ("h100", "b200", "l40s", "gh200"):
        out = advise_json(capsys, "--runs", str(run), "--gpu", gpu, "--hbm-bytes", "200GiB")
        g = get_gpu(gpu)
        for pl in out["placements"].values():
            for p in pl["points"]:
                nbytes = m.weight_bytes() + p["serve_batch"] * 8192 * m.kv_bytes_per_token("bf16")
                assert p["step_ms"] >= nbytes / (g.hbm_gbps * 1e6) * (1 - 1e-9)
                assert p["step_ms"] >= p["serve_batch"] * matmul_flops_per_seq(m) / (g.bf16_tflops * 1e9) * (1 - 1e-9)


def test_the_text_says_which_figures_are_datasheet_measured_assumed(tmp_path, capsys):
    run = write_serve_run(tmp_path)
    assert main([*ADVISE, "--runs", str(run), "--gpu", "gb200"]) == 0
    text = capsys.readouterr().out
    assert "the step in machine terms" in text and "carried: HBM" in text
    assert "(datasheet:" in text and "(assumed:" in text and "fixed launch part" in text


# ---------------------------------------------------------------- the engine setting's path

def test_the_engine_setting_names_the_uva_path_and_the_best_one_beside(tmp_path, capsys):
    run = write_serve_run(tmp_path)
    out = advise_json(capsys, "--runs", str(run))
    host, hbm = out["engine"]["host"], out["engine"]["hbm"]
    assert host["runs_impl"] == "pinned_uva" and host["best_impl"] == "pinned_host_flag"
    assert host["best_is_engine_setting"] is False and "no engine setting today" in host["what_it_would_take"]
    assert host["best_tokens_per_s"] == pytest.approx(out["placements"]["host"]["tokens_per_s"])
    # the fake run holds no UVA step: each row at the pinned random-row ceiling (1.9e8 rows/s), not hidden
    rows = host["serve_batch"] * 16
    h2d = out["machine"]["target"]["h2d_gbps"]
    lookup = max(rows / 1.9e8 * 1e3, rows * 160 / (h2d * 1e6))
    assert host["step_ms"] == pytest.approx(out["placements"]["host"]["tpot_ms"]
                                            - out["step_model"]["exposed_ms"]["host"] + lookup)
    assert host["tokens_per_s"] == pytest.approx(host["serve_batch"] / host["step_ms"] * 1e3)
    assert hbm["runs_impl"] == "device" and hbm["best_is_engine_setting"] is True


# ---------------------------------------------------------------- issue 43, defect 1

def test_advise_model_without_a_table_answers_for_the_runs_table_and_says_so(tmp_path, capsys):
    run = write_serve_run(tmp_path)
    assert main(["advise", "--model", "qwen3-8b", "--context", "8192", "--runs", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["placements"]["host"]["source"] == "measured"
    assert any(n.startswith("table: none asked; the runs' serve records' table, 47.7 GiB") for n in out["notes"])


def test_a_partial_table_and_a_bad_model_exit_2_naming_the_flag(tmp_path, capsys):
    run = write_serve_run(tmp_path)
    assert main(["advise", "--model", "qwen3-8b", "--context", "8192", "--dim", "160", "--runs", str(run)]) == 2
    err = capsys.readouterr().err
    assert "--dtype" in err and "--heads" in err and "--table-bytes" in err
    assert main(["advise", "--model", "nosuchmodel", "--context", "8192"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --model") and "qwen3-8b" in err


# ---------------------------------------------------------------- across GPUs (scripts/gpu_error.py)

def _h100_run(tmp_path, rate_gbps: float):
    from tests._fake_serve import serve_records
    from tests._fake_runs import gpu_meta, write_run

    h100 = get_gpu("h100")
    recs = serve_records(hbm_bytes=h100.memory_bytes, rate_gbps=rate_gbps, fixed_ms=0.3, host_extra_ms=0.01)
    meta = gpu_meta("2026-12-07T10-00-00-serve", suite="serving")
    meta["device"] = dict(meta["device"], name="NVIDIA H100 80GB HBM3", memory_bytes=h100.memory_bytes)
    meta["ceilings"]["hbm_read_gbps"] = 4400.0 * 3350 / 4800
    return write_run(tmp_path / "h100", "2026-12-07T10-00-00-serve", meta, recs)


def test_the_h100_is_predicted_from_h200_runs_alone_by_the_carried_terms(tmp_path):
    from ple_bench.advise.cross_gpu import by_gpu, serve_markdown, serve_rows
    from ple_bench.advise.model import load_runs

    h200 = write_serve_run(tmp_path / "h200", rate_gbps=4000.0, fixed_ms=0.3, host_extra_ms=0.01)
    h100 = _h100_run(tmp_path, rate_gbps=4000.0 * 3350 / 4800)  # the same share of the datasheet peak
    groups = by_gpu(*load_runs([h200, h100]))
    assert set(groups) == {"NVIDIA H200", "NVIDIA H100 80GB HBM3"}
    rows = serve_rows(groups["NVIDIA H200"], groups["NVIDIA H100 80GB HBM3"])
    assert sorted((r.placement, r.context) for r in rows) == sorted(
        (p, c) for p in ("host", "hbm") for c in (2048, 8192, 32768))
    for r in rows:
        assert r.predicted_batch == r.measured_batch  # the capacity rule on the card's reported memory
        assert abs(r.err("tpot")) < 1.0 and abs(r.err("tps")) < 1.0, r
    # and the other way
    back = serve_rows(groups["NVIDIA H100 80GB HBM3"], groups["NVIDIA H200"])
    assert back and all(abs(r.err("tps")) < 1.0 for r in back)
    assert "| 2 K | host |" in serve_markdown(rows, "H200", "H100")


def test_gpu_error_script_needs_two_gpus(tmp_path, capsys):
    import runpy

    h200 = write_serve_run(tmp_path / "h200")
    mod = runpy.run_path("scripts/gpu_error.py", run_name="not_main")
    assert mod["main"]([str(h200)]) == 2
    assert "one GPU" in capsys.readouterr().err
    assert mod["main"]([str(h200), str(_h100_run(tmp_path, 2800.0)), "--no-steps"]) == 0
    out = capsys.readouterr().out
    assert "### The NVIDIA H100 80GB HBM3 from the NVIDIA H200" in out and "tok/s: median" in out


@pytest.mark.parametrize("context, hbm, host", [(2048, 29, 198), (8192, 7, 49), (32768, 1, 12)])
def test_the_h100_preset_gives_the_batches_the_h100_measured(context, hbm, host):
    # the largest batches of the serving suite on an H100 80GB HBM3 (run 20261207-105832-serving-f8fa,
    # quoted): the capacity rule on the preset's memory gives them, not one or two more
    from ple_bench.advise.serving import ServingAsk, served_capacity
    from tests._fake_serve import TABLE_47_7

    ask = ServingAsk(get_model("qwen3-8b"), context, "bf16", TABLE_47_7, 160, "fp8", 16)
    h100 = get_gpu("h100").memory_bytes
    assert served_capacity(ask, "hbm", h100, None).max_batch == hbm
    assert served_capacity(ask, "host", h100, None).max_batch == host


def test_across_gpus_the_target_cards_memory_is_its_presets_not_its_records(tmp_path):
    # advise --gpu h100 knows the card's memory from the preset alone; the cross-GPU table must ask the
    # same way, so a preset that is off shows up as a batch off (here the records claim nvidia-smi's size)
    from ple_bench.advise.cross_gpu import by_gpu, serve_rows
    from ple_bench.advise.model import load_runs
    from tests._fake_serve import serve_records
    from tests._fake_runs import gpu_meta, write_run

    smi = 81559 * 2**20
    recs = serve_records(hbm_bytes=smi, rate_gbps=2800.0)
    meta = gpu_meta("2026-12-07T10-00-00-serve", suite="serving")
    meta["device"] = dict(meta["device"], name="NVIDIA H100 80GB HBM3", memory_bytes=smi)
    h100 = write_run(tmp_path / "h100", "2026-12-07T10-00-00-serve", meta, recs)
    h200 = write_serve_run(tmp_path / "h200", rate_gbps=4000.0)
    groups = by_gpu(*load_runs([h200, h100]))
    rows = serve_rows(groups["NVIDIA H200"], groups["NVIDIA H100 80GB HBM3"])
    two_k_host = next(r for r in rows if (r.context, r.placement) == (2048, "host"))
    assert two_k_host.predicted_batch == 198 < two_k_host.measured_batch


# ---------------------------------------------------------------- issue 43, defect 6

def test_the_best_pinned_sentence_names_the_row_it_quotes():
    import re

    from ple_bench.advise.what_if import ModelOption, _decide

    def opt(placement, path, step, over, checked=True, graph="full"):
        return ModelOption(placement, path, True, "host", graph, step, over, "predicted", "", None, None, True,
                           timer="host_sync", checked=checked, baseline_step_ms=0.200 if over is not None else None)

    rows = [opt("HBM", "device", 0.200, None), opt("pinned host", "pinned_host_graph", 0.200, 0.0, checked=False),
            opt("pinned host", "pinned_host_flag", 0.220, 10.0),
            opt("pinned host", "pinned_host_graph", 0.216, 8.0, graph="eager")]
    choice, text, _ = _decide(rows, 47.7)
    assert choice == "HBM"
    n = int(re.search(r"pinned row \(#(\d+) ", text).group(1))
    quoted = rows[n - 1]
    assert quoted.path in text and f"{quoted.overhead_pct:+.0f} %" in text and quoted.checked
    assert "best checked pinned row" in text  # a better unchecked row exists (#2): the sentence says so


def test_runs_of_two_gpus_are_answered_from_one_the_asked_cards_own_first(tmp_path):
    # the archive holds H200 and H100 serve runs since 2026-12-07: one fit over both read as neither's
    # rate and carried no term (advise --gpu b200 moved 58 % on TPOT); one GPU's runs answer, said so
    from ple_bench.advise.model import load_runs
    from ple_bench.advise.serving import ServingAsk, advise_serving
    from ple_bench.serving.models import MODELS
    from tests._fake_serve import TABLE_47_7

    h200 = write_serve_run(tmp_path / "h200", rate_gbps=4000.0)
    h100 = _h100_run(tmp_path, rate_gbps=2800.0)
    recs, metas = load_runs([h200, h100])
    ask = ServingAsk(get_model("qwen3-8b"), 8192, "bf16", TABLE_47_7, 160, "fp8", 16, gpu=get_gpu("h100"))
    adv = advise_serving(ask, recs, metas, MODELS)
    assert adv.sources == {"host": "measured", "hbm": "measured"}  # the H100's own rows
    assert any("answered from the NVIDIA H100 80GB HBM3's" in n and "the card asked for" in n for n in adv.notes)
    b200 = advise_serving(ServingAsk(get_model("qwen3-8b"), 8192, "bf16", TABLE_47_7, 160, "fp8", 16,
                                     gpu=get_gpu("b200")), recs, metas, MODELS)
    assert b200.source_figures.gpu is not None  # one card's runs: its terms are carried
    assert any(n.startswith("runs: of several GPUs") for n in b200.notes)
