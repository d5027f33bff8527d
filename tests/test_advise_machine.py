"""advise past what was measured: a row shape no run holds is answered from the model (never
refused), the machine description is read from the runs and overridable (a bad key exits 2,
naming it), every prediction stays above its floor, the ceilings' per-row rates interpolate as
the physics says, and a changed configuration maps to the unchanged path and the changed machine."""

from __future__ import annotations

import json

import pytest

from ple_bench.advise.machine import SECTOR_BYTES, CeilingRates, Machine, measured_machine
from ple_bench.advise.model import (GIB, build_model, changed_configuration, physical_floor, predict,
                                    step_points)
from tests._cli import run_cli
from tests._fake_runs import write_run
from tests.test_model import SHAPES, law_meta, synthetic

RUN_ID = "20261201-000000-synthetic"


@pytest.fixture(scope="module")
def law_run(tmp_path_factory):
    """A run folder of the synthetic law at five shapes (none of them 12 heads x 384 B rows)."""
    recs = synthetic(shapes=SHAPES, tokens=(64, 256, 512))
    for r in recs:
        r.update(timer="cuda_event", ids="uniform", host_alloc="" if r["impl"] == "device" else "torch")
    meta = dict(law_meta(), run_id=RUN_ID, suite="shapes", mode="gpu")
    return str(write_run(tmp_path_factory.mktemp("runs"), RUN_ID, meta, recs, derive=False))


ASK = ["advise", "--table-bytes", "24GiB", "--dim", "192", "--dtype", "bf16", "--heads", "12", "--tokens", "128,384",
       "--compute-us", "175"]


def test_advise_on_a_shape_no_run_holds_answers_from_the_model(law_run):
    ran = run_cli(*ASK, "--runs", law_run)
    assert ran.returncode == 0, ran.stderr
    assert "no measured decode step of dim 192, bf16, 12 heads" in ran.stdout
    assert "predicted: no step of this row shape was measured" in ran.stdout
    assert "model error on held-out shapes: median" in ran.stdout
    rows = [line for line in ran.stdout.splitlines() if line.startswith("    ") and "predicted," in line]
    assert rows and all("%" in line for line in rows)  # each predicted row with its held-out-shape error
    js = json.loads(run_cli(*ASK, "--runs", law_run, "--json").stdout)
    opts = [o for a in js["model"]["answers"] for o in a["options"]]
    assert opts and {o["source"] for o in opts} == {"predicted"}
    assert js["model"]["shape_overall"]["n"] > 0


def test_the_machine_is_measured_by_default_and_given_figures_say_so(law_run, tmp_path):
    js = json.loads(run_cli(*ASK, "--runs", law_run, "--json").stdout)["model"]["machine"]
    assert js["h2d_gbps"] == 55.0 and js["sms"] == 132 and js["sources"]["h2d_gbps"].startswith("measured")
    toml = tmp_path / "gh200.toml"
    toml.write_text("[machine]\nh2d_gbps = 375.0\nhbm_read_gbps = 4000\n")
    ran = run_cli(*ASK, "--runs", law_run, "--machine", str(toml), "--sms", "66", "--json")
    assert ran.returncode == 0, ran.stderr
    got = json.loads(ran.stdout)["model"]
    m = got["machine"]
    assert (m["h2d_gbps"], m["hbm_read_gbps"], m["sms"]) == (375.0, 4000.0, 66)
    assert m["sources"]["h2d_gbps"] == f"given: --machine {toml}" and m["sources"]["sms"] == "given: --sms"
    assert m["sources"]["hbm_bytes"].startswith("measured")
    # a given GPU smaller than the table: the resident rows do not fit (the model's answer says so)
    small = json.loads(run_cli(*ASK, "--runs", law_run, "--gpu-hbm-bytes", "16GiB", "--json").stdout)["model"]
    assert small["machine"]["hbm_bytes"] == 16 * GIB
    assert all(not o["fits"] for a in small["answers"] for o in a["options"] if o["placement"] == "HBM")
    assert all(a["choice"] == "pinned host" for a in small["answers"])
    text = run_cli(*ASK, "--runs", law_run, "--h2d-gbps", "375").stdout
    assert "machine: another than the runs measured" in text and "h2d_gbps = 375.0 GB/s (given: --h2d-gbps)" in text


@pytest.mark.parametrize("name,body", [("m.toml", "pcie_gbps = 375\n"), ("m.json", '{"h2d_gbps": 375, "cores": 4}')])
def test_a_machine_file_with_an_unknown_key_exits_2_naming_it(law_run, tmp_path, name, body):
    path = tmp_path / name
    path.write_text(body)
    ran = run_cli(*ASK, "--runs", law_run, "--machine", str(path))
    bad = "pcie_gbps" if name.endswith("toml") else "cores"
    assert ran.returncode == 2 and f"unknown key {bad!r}" in ran.stderr and str(path) in ran.stderr


def test_a_bad_machine_value_or_file_exits_2(law_run, tmp_path):
    path = tmp_path / "m.toml"
    path.write_text("h2d_gbps = -3\n")
    ran = run_cli(*ASK, "--runs", law_run, "--machine", str(path))
    assert ran.returncode == 2 and "h2d_gbps must be positive" in ran.stderr
    ran = run_cli(*ASK, "--runs", law_run, "--machine", str(tmp_path / "absent.toml"))
    assert ran.returncode == 2 and "absent.toml" in ran.stderr


def test_no_prediction_below_its_floor_on_any_shape_or_machine():
    """Tables, row sizes, token counts and machines none of the runs measured: the lookup never
    below rows x row bytes over the (given) link, the step never below its compute."""
    m = build_model(synthetic(shapes=SHAPES), [law_meta()], loo=False)
    fast = m.rates.machine.given("test", h2d_gbps=900.0, hbm_read_gbps=20000.0)
    checked = 0
    for f in m.fits.values():
        for machine in (None, fast):
            for rb in (32, 160, 4096):
                for rows in (1, 4096, 1 << 20):
                    for table in (GIB // 4, 40 * GIB, 400 * GIB):
                        pr = predict(f, m.rates, rows=rows, table_bytes=table, compute_us=0.0, row_bytes=rb,
                                     machine=machine)
                        floor, _ = physical_floor(f, m.rates, rows, row_bytes=rb, target=machine)
                        assert floor > 0 and pr.lookup_ms >= floor - 1e-12, (f.key, rb, rows, table)
                        assert pr.step_ms >= pr.compute_ms >= 0
                        checked += 1
    assert checked == len(m.fits) * 2 * 27


def test_ceiling_rates_interpolate_as_the_physics_says():
    meta = law_meta(((8 * GIB, 160, 16), (32 * GIB, 160, 16)))
    c = CeilingRates([meta])
    from tests.test_model import pinned_row_s

    # measured: the per-row slope over its two row counts (the fixed 0.02 ms launch falls out)
    s, what = c.kernel_row_s("pinned", 8 * GIB, 160, 55.0)
    assert s == pytest.approx(pinned_row_s(8 * GIB, 160), rel=1e-6) and "at this table and row size" in what
    # between the tables: log-log; past the largest: the last segment's slope
    mid = c.kernel_row_s("pinned", 16 * GIB, 160, 55.0)[0]
    assert mid == pytest.approx(pinned_row_s(16 * GIB, 160), rel=1e-6)
    assert c.kernel_row_s("pinned", 64 * GIB, 160, 55.0)[0] == pytest.approx(pinned_row_s(64 * GIB, 160), rel=1e-6)
    # another row size: latency-bound while its bytes fit the link's time, then the bytes over the link
    assert c.kernel_row_s("pinned", 8 * GIB, 32, 55.0)[0] == pytest.approx(pinned_row_s(8 * GIB, 160), rel=1e-6)
    big = c.kernel_row_s("pinned", 8 * GIB, 8192, 55.0)[0]
    assert big == pytest.approx(8192 / 55e9) and SECTOR_BYTES == 64
    # the strict hold-out: that shape's ceilings gone, the rest interpolates it
    c8 = CeilingRates([meta], exclude={(8 * GIB, 160)})
    assert c8.kernel_row_s("pinned", 8 * GIB, 160, 55.0)[0] == pytest.approx(pinned_row_s(32 * GIB, 160), rel=1e-6)


def test_a_changed_configuration_maps_to_the_unchanged_path_and_the_changed_machine():
    recs = [dict(r, gather_threads=4, impl="pinned_cpu_gather", lookup_mechanism="host_gather",
                 case_id=r["case_id"] + ".t4") for r in synthetic() if r["impl"] == "pinned_uva"][:1]
    recs += [dict(r, sm_limit=8, h2d_background=True, case_id=r["case_id"] + ".sm8")
             for r in synthetic() if r["impl"] == "pinned_uva"][:1]
    meta = {"ceilings": {"h2d_gbps": 50.0, "host_gather": {"k": {"ms": 1.0, "rows": 65536, "row_bytes": 160,
                                                                 "table_bytes": 8 * GIB, "threads": 16}}},
            "device": {"sm_count": 132}}
    m = build_model(recs, [meta], loo=False)
    threads, sms = step_points(recs)
    base, machine, cores, what = changed_configuration(threads, m.rates)
    assert base.gather_threads == 16 and cores == 4 and machine.host_cores == 4 and what == "4 gather threads"
    assert machine.sources["host_cores"] == "given: gather_threads 4"
    base, machine, cores, what = changed_configuration(sms, m.rates)
    assert (base.sm_limit, base.link_shared, cores) == (0, False, None) and what == "8 SMs, link shared"
    assert machine.sms == 8 and machine.h2d_gbps == 25.0
    assert changed_configuration(step_points(synthetic())[0], m.rates) is None


def test_measured_machine_reads_meta_and_names_its_sources():
    m = measured_machine([law_meta(), dict(law_meta(), device={"sm_count": 66, "memory_bytes": 80 * 10**9})])
    assert m.h2d_gbps == 55.0 and m.sms == 99 and m.hbm_read_gbps == 4400.0
    assert all(m.sources[k].startswith("measured: median") for k in ("h2d_gbps", "sms", "hbm_bytes"))
    assert Machine().factors(None) == {"pinned": 1.0, "device": 1.0, "copy": 1.0, "gather": 1.0}


def _error_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "advise_error.py"
    spec = importlib.util.spec_from_file_location("advise_error", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_error_script_prints_the_tables_and_exits_2_on_a_folder_without_meta(law_run, tmp_path, capsys):
    script = _error_script()
    assert script.main([law_run, "--no-loo", "--predict", law_run]) == 0
    out = capsys.readouterr().out
    assert "| **held-out shape** (ceilings of the run kept) | 90 | 0.0 % | 0 % |" in out
    assert "no changed configuration in these runs" in out and "### New runs predicted" in out
    assert script.main([law_run, "--calibrate", str(tmp_path)]) == 2
    assert f"no meta.json): {tmp_path}" in capsys.readouterr().err


def test_the_model_ranks_only_the_traffic_the_answer_holds_for(tmp_path):
    """A second id distribution whose resident steps are twice as slow (a text trace) must not give
    the model's pinned rows a slower HBM row to be held against: the answer holds for one
    distribution (the one with the most stable pinned steps), and the model is fitted on its steps."""
    recs = synthetic(shapes=SHAPES, tokens=(64, 256, 512))
    slow = []
    for r in recs:
        r.update(timer="cuda_event", ids="uniform", host_alloc="" if r["impl"] == "device" else "torch")
        if r["impl"] == "device":  # the other traffic's resident steps: twice the step, twice the compute
            slow.append(dict(r, ids="ngram", case_id=r["case_id"] + ".ngram", step_ms=2 * r["step_ms"],
                             compute_ms=2 * r["compute_ms"]))
    meta = dict(law_meta(), run_id=RUN_ID, suite="shapes", mode="gpu")
    run = str(write_run(tmp_path, RUN_ID, meta, recs + slow, derive=False))
    js = json.loads(run_cli(*ASK, "--runs", run, "--json").stdout)
    assert js["ids"] == "uniform"
    opts = [o for a in js["model"]["answers"] for o in a["options"]]
    assert opts and {o["ids"] for o in opts} == {"uniform"}
    for a in js["model"]["answers"]:
        hbm = min(o["step_ms"] for o in a["options"] if o["placement"] == "HBM")
        pinned = [o for o in a["options"] if o["placement"] == "pinned host" and o.get("baseline_step_ms")]
        assert pinned and all(o["baseline_step_ms"] == pytest.approx(hbm) for o in pinned)
