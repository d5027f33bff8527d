"""The what-if model: fitted on synthetic steps that follow a known law its leave-one-out error
is ~0; predictions outside what was measured are flagged; the ETP reduce is alpha-beta; advise
answers with measured / predicted marked, writes an HTML page, and exits 2 on impossible what-ifs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ple_bench.advise.model import GIB, Rates, build_model, predict, reduce_ms
from ple_bench.env import gpu_available
from ple_bench.results import load_records
from ple_bench.spec.suite import load_suite
from tests._cli import run_cli
from tests._fixtures import fixture_runs

ROOT = Path(__file__).resolve().parents[1]


def pinned_row_s(table, row_bytes):
    """The synthetic machine's pinned random-row time per row: latency-bound, rising with the table
    (10 ns at 1 GiB, x (table / 1 GiB)^0.3), else a 64 B sector minimum over a 50 GB/s link."""
    return max(10e-9 * (table / GIB) ** 0.3, max(row_bytes, 64) / 50e9)


def device_row_s(table, row_bytes):
    return max(0.6e-9, max(row_bytes, 64) / 3000e9)


def law(impl, prefetch, rows, table, compute_us, row_bytes=160, heads=16):
    """A known step law: compute (per token, and per byte the rows' consumer reads), lookup = fixed + per-row work +
    an efficiency x rows at the ceiling's rate, exposed = what the compute does not hide."""
    tokens = rows // heads
    compute = 0.02 + 0.001 * compute_us + 3e-5 * tokens + 1e-9 * rows * row_bytes
    if impl == "device":
        lookup = 0.005 + 0.5e-6 * rows + 1.0 * rows * device_row_s(table, row_bytes) * 1e3
    else:
        lookup = 0.01 + 1e-6 * rows + 1.3 * rows * pinned_row_s(table, row_bytes) * 1e3
    exposed = (max(0.0, lookup - compute) if prefetch else lookup) + 0.003
    return compute, lookup, compute + exposed


#: (table bytes, row bytes, heads): five shapes, as the shapes suite varies them
SHAPES = ((8 * GIB, 96, 24), (16 * GIB, 128, 32), (32 * GIB, 256, 8), (48 * GIB, 640, 16), (32 * GIB, 1024, 4))


def law_meta(shapes=SHAPES):
    """The synthetic machine's meta.json: random-row ceilings of both memories at every shape's table
    and row size, at two row counts (a fixed launch cost beside the per-row time)."""
    rr = {}
    for table, rb, heads in shapes:
        for memory, per_row in (("pinned", pinned_row_s), ("device", device_row_s)):
            for rows in (65536, 262144):
                rr[f"{memory}:{table}:{rb}:uniform:h{heads}:n{rows}"] = {
                    "memory": memory, "order": "random", "ids": "uniform", "host_alloc": "torch", "rows": rows,
                    "row_bytes": rb, "table_bytes": table, "ms": 0.02 + rows * per_row(table, rb) * 1e3}
    return {"ceilings": {"h2d_gbps": 55.0, "d2d_gbps": 4000.0, "hbm_read_gbps": 4400.0, "random_row": rr},
            "device": {"sm_count": 132, "memory_bytes": 150 * 10**9}}


def synthetic(tables=(8 * GIB, 32 * GIB), tokens=(64, 128, 256, 512), computes=(50.0, 200.0), shapes=None):
    """Steps of the law at ``shapes`` (default: each table at 160 B rows, 16 heads)."""
    shapes = shapes or tuple((t, 160, 16) for t in tables)
    recs = []
    for impl, pf in (("device", False), ("pinned_uva", True), ("pinned_uva", False)):
        for table, rb, heads in shapes:
            for t in tokens:
                for cu in computes:
                    c, lk, st = law(impl, pf, t * heads, table, cu, rb, heads)
                    recs.append({"case_id": f"step.{impl}.{pf}.{table}.{rb}.{heads}.{t}.{cu}", "status": "ok",
                                 "kind": "step", "mode": "gpu", "world_size": 1, "impl": impl,
                                 "kernel": "triton_reference", "prefetch": pf, "ids_on": "device",
                                 "graph": "breakable", "num_tokens": t, "num_heads": heads, "rows": t * heads,
                                 "row_bytes": rb, "dim": rb, "dtype": "fp8", "table_bytes": table, "compute_us": cu,
                                 "compute_ms": c, "lookup_ms": lk, "step_ms": st,
                                 "_run_id": "20261201-000000-synthetic"})
    return recs


def test_a_known_law_over_five_shapes_is_recovered_and_predicts_a_held_out_shape_within_1_pct():
    m = build_model(synthetic(shapes=SHAPES), [law_meta()], strict=True)
    fit = next(f for k, f in m.fits.items() if k[0] == "pinned_uva" and k[2])
    assert fit.eff[0] == pytest.approx(1.3, rel=1e-3) and fit.l0 == pytest.approx(0.01, rel=1e-3)
    assert fit.l1 == pytest.approx(1e-6, rel=1e-2) and fit.c3 == pytest.approx(1e-9, rel=1e-2)
    assert fit.c4 == pytest.approx(3e-5, rel=1e-2) and fit.c2 == pytest.approx(0.0, abs=1e-12)
    assert fit.hides  # the law's prefetch hides its lookup behind the compute
    # every shape left out in turn, everything refitted on the other four: each step within 1 %
    assert m.shape_overall.n == 3 * 5 * 4 * 2 and m.shape_overall.worst_pct < 1.0
    # a shape no run holds (another table, row size and head count) is predicted on the law
    pr = predict(fit, m.rates, rows=384 * 12, table_bytes=24 * GIB, compute_us=175.0, row_bytes=384, tokens=384)
    assert any("384 B rows" in o for o in pr.outside)
    assert pr.step_ms == pytest.approx(law("pinned_uva", True, 384 * 12, 24 * GIB, 175.0, 384, 12)[2], rel=0.01)


def test_the_compute_at_a_measured_token_count_is_its_own():
    """A matmul chain whose time is not linear in its tokens (256 tokens faster than 128, as the
    H200's GEMM tiles ran): every shape holds the same token counts, so a held-out shape's compute
    is the others' at that count, not the line's."""
    recs = synthetic(shapes=SHAPES)
    bump = {64: 0.0, 128: 0.03, 256: -0.02, 512: 0.01}
    for r in recs:
        c = r["compute_ms"] = r["compute_ms"] + bump[r["num_tokens"]]
        lookup = r["lookup_ms"]
        r["step_ms"] = c + (max(0.0, lookup - c) if r["prefetch"] else lookup) + 0.003
    m = build_model(recs, [law_meta()])
    assert m.shape_overall.n and m.shape_overall.worst_pct < 1.0
    fit = next(f for k, f in m.fits.items() if k[0] == "device")
    assert fit.offsets[(256, 50.0)] < 0 < fit.offsets[(128, 50.0)]


def test_a_prefetch_whose_steps_do_not_hide_is_fitted_serial():
    """A prefetched path whose steps are compute + lookup (its side-stream kernel competing for the
    SMs, as the UVA kernel's on the H200): the serial form fits its residual better, so the model
    charges the whole lookup, and a held-out shape is still predicted on the law."""
    recs = synthetic(shapes=SHAPES)
    for r in recs:
        if r["impl"] == "pinned_uva" and r["prefetch"]:
            r["step_ms"] = r["compute_ms"] + r["lookup_ms"] + 0.003
    m = build_model(recs, [law_meta()])
    fit = next(f for k, f in m.fits.items() if k[0] == "pinned_uva" and k[2])
    assert not fit.hides
    serial = [c for c in m.shape_cases if "prefetch on" in c.path]
    assert serial and max(c.rel_err for c in serial) < 0.01


def test_the_strict_shape_hold_out_interpolates_the_held_out_ceilings_and_is_worse():
    """With the held-out shape's ceilings removed too, its rate comes from the other shapes' ceilings
    (log-log in the table, the sector minimum and the link for another row size): still close on a
    smooth law, but not exact -- the error is measured, not assumed."""
    m = build_model(synthetic(shapes=SHAPES), [law_meta()], strict=True)
    strict = [c.rel_err for c in m.strict_cases]
    assert len(strict) == m.shape_overall.n and 0.0 < max(strict) and max(strict) * 100 > m.shape_overall.worst_pct


def test_another_machine_scales_the_rate_terms():
    """A 375 GB/s link (a Grace Hopper's C2C) makes the pinned rate term 375/55 x faster; the resident
    path does not change; the physical floor follows the given link."""
    from ple_bench.advise.model import physical_floor

    m = build_model(synthetic(shapes=SHAPES), [law_meta()], loo=False)
    pinned = next(f for k, f in m.fits.items() if k[0] == "pinned_uva" and not k[2])
    device = next(f for k, f in m.fits.items() if k[0] == "device")
    gh = m.rates.machine.given("test", h2d_gbps=375.0)
    rows, table, rb = 512 * 16, 32 * GIB, 256
    here = predict(pinned, m.rates, rows=rows, table_bytes=table, compute_us=200.0, row_bytes=rb)
    there = predict(pinned, m.rates, rows=rows, table_bytes=table, compute_us=200.0, row_bytes=rb, machine=gh)
    term = 1.3 * rows * pinned_row_s(table, rb) * 1e3
    assert here.lookup_ms - there.lookup_ms == pytest.approx(term * (1 - 55.0 / 375.0), rel=0.01)
    assert "another machine" in there.outside
    same = [predict(device, m.rates, rows=rows, table_bytes=table, compute_us=200.0, row_bytes=rb, machine=mm).step_ms
            for mm in (None, gh)]
    assert same[0] == pytest.approx(same[1])
    assert physical_floor(pinned, m.rates, rows, row_bytes=rb, target=gh)[0] == \
        pytest.approx(rows * rb / 375e6)


def test_leave_one_out_is_not_zero_on_noisy_data():
    recs = synthetic()
    recs[5]["step_ms"] *= 1.5  # one measurement off the law: its own prediction misses it
    m = build_model(recs, [law_meta(((8 * GIB, 160, 16), (32 * GIB, 160, 16)))])
    assert m.loo_overall.worst_case == recs[5]["case_id"] and m.loo_overall.worst_pct > 20


def test_etp_reduce_is_alpha_beta_and_the_link_bounds_it():
    r = Rates(reduce_alpha_ms=0.015, reduce_busbw_gbps=240.0)
    assert reduce_ms(r, 1, 1e6) == 0.0
    assert reduce_ms(r, 4, 1e6) == pytest.approx(0.015 + 1e6 * 1.5 / 240e9 * 1e3)
    # over 2 nodes with a 50 GB/s link and 5 us latency: the link's bandwidth, two more latencies
    assert reduce_ms(r, 4, 1e6, nodes=2, link_gbps=50, link_latency_us=5) == \
        pytest.approx(0.015 + 0.010 + 1e6 * 1.5 / 50e9 * 1e3)
    with pytest.raises(ValueError, match="no all-reduce"):
        reduce_ms(Rates(), 2, 1e6)


def _cli(*args):
    return run_cli("advise", *args)


SHAPE = ["--dim", "160", "--dtype", "fp8", "--heads", "16", "--compute-us", "200"]


@pytest.fixture(scope="module")
def runs():
    return [str(p) for p in fixture_runs()]


def test_advise_what_if_marks_predicted_and_writes_html(runs, tmp_path):
    html = tmp_path / "advice.html"
    proc = _cli("--table-bytes", "200GB", "--tokens", "64,512", *SHAPE, "--runs", *runs, "--etp", "4",
                "--json", "--html", str(html))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    m = out["model"]
    assert m["verdict"].startswith("ETP 4") and out["verdict"] == m["verdict"]
    opts = [o for a in m["answers"] for o in a["options"]]
    assert opts and all(o["source"] == "predicted" for o in opts)  # an ETP 4 group was never measured
    assert all(o["error_median_pct"] is not None for o in opts if o["error"].startswith("leave-one-out"))
    assert m["loo_overall"]["n"] > 100 and m["what_would_change"]
    page = html.read_text()
    assert 'id="verdict"' in page and "predicted" in page and "data:image/png;base64" in page
    assert "leave-one-out" in page


def test_advise_marks_a_measured_case_measured(runs):
    proc = _cli("--table-bytes", "47.7GiB", "--tokens", "256", *SHAPE, "--runs", *runs, "--graph", "any", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    opts = json.loads(proc.stdout)["model"]["answers"][0]["options"]
    measured = [o for o in opts if o["source"] == "measured"]
    assert measured and all(o["run_id"] and o["error"] == "" for o in measured)


@pytest.mark.parametrize("extra, key", [
    (["--etp", "3", "--nodes", "2"], "--etp / --nodes"),
    (["--etp", "4", "--nodes", "2"], "--link-gbps"),
    (["--host-cores", "0"], "--host-cores"),
    (["--link-gbps", "-1"], "--link-gbps"),
    (["--hbm-bytes", "10GiB", "--host-bytes", "10GiB", "--etp", "2"], "fits neither"),
])
def test_advise_impossible_what_ifs_exit_2(runs, extra, key):
    proc = _cli("--table-bytes", "47.7GiB", "--tokens", "64", *SHAPE, "--runs", *runs[-1:], *extra)
    assert proc.returncode == 2 and key in proc.stderr, proc.stderr


def test_advise_zero_tokens_exits_2_before_running_anything():
    proc = _cli("--table-bytes", "1GiB", "--tokens", "0", *SHAPE)
    assert proc.returncode == 2 and "--tokens" in proc.stderr


@pytest.mark.slow  # a subprocess running eight decode-step cases (Triton under the interpreter)
@pytest.mark.skipif(gpu_available(), reason="a GPU: the self-run measures and ranks (tests/gpu covers it)")
def test_advise_functional_check_on_a_cpu_runs_its_cases_and_ranks_nothing(tmp_path):
    """``advise --functional-check`` without a GPU: it runs its own cases (each path once, functional
    mode), says they are not timings and ranks nothing: its one line on stdout is the check's tally."""
    proc = subprocess.run([sys.executable, "-m", "ple_bench", "advise", "--table-bytes", "1GiB", "--dim", "160",
                           "--dtype", "fp8", "--heads", "4", "--tokens", "8", "--compute-us", "20",
                           "--results-dir", str(tmp_path), "--functional-check"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "not timings" in proc.stderr and "nothing is ranked" in proc.stderr
    (line,) = proc.stdout.strip().splitlines()  # no ranking, no verdict: the tally alone
    assert line.startswith("advise: functional run: no performance verdict")  # the one verdict's words
    assert "functional check done" in line and "nothing ranked" in line
    (run,) = [p for p in tmp_path.iterdir() if (p / "meta.json").exists()]
    recs = load_records(run)
    suite = load_suite(run / "advise.toml")  # its cases and the resident baselines they need
    assert sorted(r["case_id"] for r in recs) == sorted(c.case_id for c in suite.cases)
    assert all(r["mode"] == "functional" for r in recs)
    # every path advise compares ran; only graph modes a CPU cannot run are skipped, with the reason
    ok = [r for r in recs if r["status"] == "ok"]
    assert {r["impl"] for r in ok} == {c.impl for c in suite.cases} == {"device", "pinned_uva", "pinned_host_flag"}
    assert f"functional check done: {len(ok)} ok, 0 failed, 0 invalid;" in line
    assert all(r["status"] == "skipped" and "needs CUDA" in r["reason"] for r in recs if r["status"] != "ok"), \
        [(r["case_id"], r["status"], r["reason"]) for r in recs if r["status"] != "ok"]


def test_a_prefetch_cannot_hide_the_etp_reduce():
    """The all-reduce runs in finalize after the compute: a prefetched path whose local lookup is
    fully hidden still exposes the whole reduce, and its step grows by exactly that much."""
    from ple_bench.advise.model import PathFit

    fit = PathFit(key=("pinned_cpu_gather", "", True, "host", "breakable", "uniform", 0), c0=0.01, c1=1e-3, c2=0.0,
                  l0=0.02, l1=1e-5, e0=0.0, e1=0.0, n=10, tables=(GIB, 64 * GIB), rows=(1024, 8192),
                  computes=(50.0, 200.0), resident=False, host_gather=True, prefetch=True, row_bytes=160)
    rates = Rates(reduce_alpha_ms=0.015, reduce_busbw_gbps=240.0)
    one = predict(fit, rates, rows=4096, table_bytes=32 * GIB, compute_us=200.0)
    four = predict(fit, rates, rows=4096, table_bytes=32 * GIB, compute_us=200.0, etp=4)
    red = reduce_ms(rates, 4, 4 * 4096 * 160)
    assert one.exposed_ms == pytest.approx(0.0)  # the local lookup hides behind 0.21 ms of compute
    assert four.reduce_ms == pytest.approx(red) and four.exposed_ms == pytest.approx(red)
    assert four.step_ms - four.compute_ms == pytest.approx(red)


# ------------------------------------------------------------------ bounded fits, floors, honest error

def _step(impl, tokens, *, lookup, compute_ms, step, table=32 * GIB, compute_us=200.0, timer="host_sync",
          ids="uniform", ids_on="device", prefetch=True, graph="breakable", run="20261201-000000-synthetic"):
    return {"case_id": f"step.{impl}.{timer}.{ids}.{ids_on}.{prefetch}.{graph}.{table}.{tokens}.{compute_us}",
            "status": "ok", "kind": "step", "mode": "gpu", "world_size": 1, "impl": impl, "kernel": "",
            "prefetch": prefetch, "ids_on": ids_on, "graph": graph, "timer": timer, "ids": ids,
            "host_alloc": "" if impl == "device" else "torch", "num_tokens": tokens, "num_heads": 16,
            "rows": tokens * 16, "row_bytes": 160, "table_bytes": table, "compute_us": compute_us,
            "compute_ms": compute_ms, "lookup_ms": lookup, "step_ms": step, "_run_id": run}


#: the host-gather ceilings of a run's meta.json: 1 K rows in 0.035 ms ... 64 K rows in 0.62 ms
HOST_GATHER = {f"{32 * GIB}:{rows}:160": {"ms": ms, "rows": rows, "row_bytes": 160, "table_bytes": 32 * GIB,
                                          "threads": 16, "timer": "host_sync"}
               for rows, ms in ((1024, 0.035), (8192, 0.116), (65536, 0.62))}
META = {"ceilings": {"h2d_gbps": 55.0, "d2d_gbps": 4000.0, "host_gather": HOST_GATHER}}


def noisy_cpu_gather():
    """The device-ids CPU gather as a user's trial measured it: four noisy points whose lookup (and
    compute, and step) fall with the rows -- an unconstrained line has negative per-row slopes."""
    pts = [(64, 0.30, 0.235, 0.36), (256, 0.29, 0.232, 0.35), (512, 0.21, 0.226, 0.33), (1024, 0.20, 0.224, 0.31)]
    recs = [_step("pinned_cpu_gather", t, lookup=lk, compute_ms=c, step=st, compute_us=cu)
            for t, lk, c, st in pts for cu in (200.0,)]
    recs += [_step("pinned_cpu_gather", t, lookup=lk, compute_ms=c - 0.1, step=st - 0.1, compute_us=100.0)
             for t, lk, c, st in pts]
    return recs


def test_noisy_points_get_no_negative_slope_and_no_step_below_its_floor():
    import numpy as np

    from ple_bench.advise.model import physical_floor

    recs = noisy_cpu_gather()
    rows = [r["rows"] for r in recs]
    # the trap is real: least squares on these points gives negative per-row slopes
    assert np.polyfit(rows, [r["lookup_ms"] for r in recs], 1)[0] < 0
    X = np.array([[1.0, r["compute_us"], r["rows"]] for r in recs])
    assert np.linalg.lstsq(X, [r["compute_ms"] for r in recs], rcond=None)[0][2] < 0
    m = build_model(recs, [META])
    (f,) = m.fits.values()
    assert min(f.l1, f.c1, f.c2, f.e1) >= 0 and f.l0 >= 0
    fastest = 65536 / 0.62e-3  # rows/s: the fastest host_gather ceiling above
    for tokens in (2048, 4096):
        n = tokens * 16
        pr = predict(f, m.rates, rows=n, table_bytes=32 * GIB, compute_us=200.0)
        assert pr.extrapolated and any("rows" in o for o in pr.outside)
        # the host-gather ceiling binds: n rows at the fastest measured rate, and h2d
        assert pr.lookup_ms >= n / fastest * 1e3 - 1e-12 and pr.lookup_ms >= n * 160 / 55e6 - 1e-12
        assert pr.lookup_ms > 0.3  # above every lookup measured (0.20-0.30 ms at 1-16 K rows)
        assert pr.step_ms >= pr.compute_ms > 0
        assert pr.floors and "host-gather ceiling" in pr.floors[0]
    assert physical_floor(f, m.rates, 4096 * 16)[0] == pytest.approx(4096 * 16 / fastest * 1e3)


def test_a_lookup_never_predicts_below_the_smallest_it_measured_at_fewer_rows():
    from ple_bench.advise.model import PathFit

    # a fit whose line dips below what was measured at fewer rows (a steep intercept, no slope)
    fit = PathFit(key=("pinned_uva", "", False, "device", "breakable", 0, 0), c0=0.1, c1=0.0, c2=0.0, l0=0.01,
                  l1=0.0, e0=0.0, e1=0.0, n=2, tables=(32 * GIB, 32 * GIB), rows=(1024, 4096), computes=(0, 0),
                  resident=False, host_gather=False, prefetch=False, row_bytes=160,
                  measured=((1024, 32 * GIB, 0.05), (4096, 32 * GIB, 0.08)))
    pr = predict(fit, Rates(), rows=8192, table_bytes=32 * GIB, compute_us=0.0)
    assert pr.lookup_ms == pytest.approx(0.05) and "smallest it measured" in pr.floors[0]
    # a smaller table than any measured is not held to them (its rows are cheaper)
    assert predict(fit, Rates(), rows=8192, table_bytes=GIB, compute_us=0.0).lookup_ms == pytest.approx(0.01)


def test_leave_one_out_holds_out_a_configuration_group_with_its_ids_twin():
    """One configuration (one table, one compute) measured 50 % slow at every token count, and its
    twin that differs only in the id distribution measured the same: leaving one step out at a time
    with the twin in the fit predicted it from the twin (error ~0); the group and its twin left out
    together predict it from the other configurations (error ~33 %)."""
    from ple_bench.advise.model import config_group, leave_one_out, step_points

    recs = synthetic()
    twin = [dict(r, ids="ngram", case_id=r["case_id"] + ".ngram") for r in recs if r["kind"] == "step"]
    for r in recs + twin:
        r.setdefault("ids", "uniform")
    recs += twin
    slow = [r for r in recs if r["kind"] == "step" and r["impl"] == "pinned_uva" and r["prefetch"]
            and r["table_bytes"] == 8 * GIB and r["compute_us"] == 50.0]
    assert len(slow) == 8  # 4 token counts, both id distributions
    for r in slow:
        for k in ("compute_ms", "lookup_ms", "step_ms"):
            r[k] *= 1.5
    m = build_model(recs, [law_meta(((8 * GIB, 160, 16), (32 * GIB, 160, 16)))])
    pts = {p.case_id: p for p in step_points(recs)}
    assert len({config_group(pts[r["case_id"]]) for r in slow}) == 2  # the ids split the groups
    errs = {c.case_id: c.rel_err for c in leave_one_out(m.points, m.rates)}
    assert min(errs[r["case_id"]] for r in slow) > 0.2
    others = [e for cid, e in errs.items() if cid not in {r["case_id"] for r in slow}]
    assert max(others) < 0.5 and m.extrap_overall.n > 0


def test_fits_are_per_timer_and_never_mix():
    """The same path timed on the host clock: its steps 0.1 ms longer than the CUDA-event ones.
    Each timer's fit recovers its own law; a pooled fit would sit between them."""
    from ple_bench.advise.model import compute_fit

    recs = synthetic()
    steps = [r for r in recs if r["kind"] == "step"]

    def on_host(r):  # the same law, the compute 0.1 ms longer on the host clock
        c = r["compute_ms"] + 0.1
        exposed = (max(0.0, r["lookup_ms"] - c) if r["prefetch"] else r["lookup_ms"]) + 0.003
        return dict(r, timer="host_sync", case_id=r["case_id"] + ".host", compute_ms=c, step_ms=c + exposed)

    host = [on_host(r) for r in steps]
    for r in steps:
        r["timer"] = "cuda_event"
    m = build_model(recs + host, [law_meta(((8 * GIB, 160, 16), (32 * GIB, 160, 16)))])
    assert {k.timer for k in m.fits} == {"cuda_event", "host_sync"}
    for timer, extra in (("cuda_event", 0.0), ("host_sync", 0.1)):
        key = next(k for k in m.fits if k.timer == timer and k.impl == "pinned_uva" and k.prefetch)
        cf = compute_fit(m.points, key)
        assert cf.n == len(steps) and "timer" in cf.source
        pr = predict(m.fits[key], m.rates, rows=256 * 16, table_bytes=8 * GIB, compute_us=200)
        assert pr.compute_ms == pytest.approx(law("pinned_uva", True, 256 * 16, 8 * GIB, 200)[0] + extra, rel=0.01)
        assert pr.step_ms == pytest.approx(law("pinned_uva", True, 256 * 16, 8 * GIB, 200)[2] + extra, rel=0.01)
    assert m.loo_overall.worst_pct < 2  # no timer's steps predicted from the other's


def test_vs_hbm_is_against_the_resident_row_of_the_same_timer():
    from ple_bench.advise.what_if import WhatIf, options_at

    recs = [r for r in synthetic() if r["kind"] == "step"]
    host = [dict(r, timer="host_sync", case_id=r["case_id"] + ".host", step_ms=r["step_ms"] + 0.2)
            for r in recs if r["impl"] != "device"]
    for r in recs:
        r["timer"] = "cuda_event"
    m = build_model(recs + host, [])
    opts = options_at(m, tokens=256, heads=16, table_bytes=8 * GIB, compute_us=200.0, w=WhatIf(), hbm_bytes=None,
                      host_bytes=None, row_bytes=160)
    ev = [o for o in opts if o.placement != "HBM" and o.timer == "cuda_event"]
    hs = [o for o in opts if o.placement != "HBM" and o.timer == "host_sync"]
    assert ev and hs and all("cuda_event" in o.baseline and o.overhead_pct is not None for o in ev)
    # no host-timed resident step: no comparison (never the event-timed one)
    assert all(o.overhead_pct is None and o.baseline == "" and "host_sync" in o.baseline_note for o in hs)


@pytest.fixture(scope="module")
def archived_advice(runs):
    """The model's answer from every archived run at 2048 / 4096 tokens (past every measured step)."""
    from ple_bench.advise.what_if import WhatIf, model_advice
    from ple_bench.advise.model import load_runs

    records, metas = load_runs(runs)
    m = build_model(records, metas)
    adv = model_advice(m, table_bytes=int(47.7 * GIB), row_bytes=160, heads=16, tokens=[64, 2048, 4096],
                       compute_us=200.0, w=WhatIf(), hbm_bytes=None, host_bytes=None)
    return adv, metas, m.points


def adv_points(archived):
    return archived[2]


def test_archived_runs_predict_no_step_below_its_floor(archived_advice):
    from ple_bench.report.data import KERNEL_FREE_IMPLS

    adv, metas, _ = archived_advice
    adv_max_tokens = max(p.tokens for p in adv_points(archived_advice))
    assert adv_max_tokens < 2048
    h2d = max(m["ceilings"]["h2d_gbps"] for m in metas if (m.get("ceilings") or {}).get("h2d_gbps"))
    hg = max(v["rows"] / v["ms"] * 1e3 for m in metas for v in ((m.get("ceilings") or {}).get("host_gather") or {})
             .values() if v.get("row_bytes") == 160)
    checked = 0
    for ans in adv.answers:
        rows = ans.tokens * 16
        for o in ans.options:
            if o.source != "predicted":
                continue
            assert o.step_ms >= o.compute_ms >= 0, o
            if o.placement == "pinned host":
                assert o.lookup_ms >= rows * 160 / (h2d * 1e6) - 1e-12, o
                if o.path in KERNEL_FREE_IMPLS:
                    assert o.lookup_ms >= rows / hg * 1e3 - 1e-12, o
                    checked += 1
            if ans.tokens > adv_max_tokens:
                assert o.extrapolated, o  # past every path's measured rows
    assert checked


def test_printed_vs_hbm_is_the_ratio_of_the_two_printed_rows(archived_advice):
    import re

    from ple_bench.advise.answer import format_model_text

    adv = archived_advice[0]
    lines = format_model_text(adv)
    rows = {}
    pat = re.compile(r"^\s+(\d+) (.{11}) .{34} (on |off) \S+\s+\S+\s+.{5} \S+\s+\S+\s+([\d.]+)\s+([+-]\d+ %)?\s*"
                     r"(#\d+)?\s+([\d.]+)?\s+(measured|predicted)")
    compared = 0
    for ln in lines:
        if re.match(r"^\d+ tokens per step", ln):
            rows = {}
        mt = pat.match(ln)
        if not mt:
            continue
        idx, step, pct, ref, base = mt.group(1), float(mt.group(4)), mt.group(5), mt.group(6), mt.group(7)
        rows[f"#{idx}"] = step
        if pct:
            assert ref and base, ln
            assert rows.get(ref) == pytest.approx(float(base)) or ref not in rows  # the named row, printed above
            b = float(base)  # both printed to 0.0005 ms, the percentage to 0.5
            tol = 0.5 + 100 * 0.0005 * (1 / b + step / b**2)
            assert float(pct.split()[0]) == pytest.approx(100 * (step / b - 1), abs=tol), ln
            compared += 1
    assert compared > 20


def test_a_resident_steps_host_sync_twin_is_the_host_timed_baseline():
    """A resident event-timed step that also recorded its host-sync time (step_host_sync_ms) gives the
    host-timed pinned paths their like-for-like resident row."""
    from ple_bench.advise.what_if import WhatIf, options_at

    recs = [r for r in synthetic() if r["kind"] == "step"]
    host = [dict(r, timer="host_sync", case_id=r["case_id"] + ".host", step_ms=r["step_ms"] + 0.2)
            for r in recs if r["impl"] != "device"]
    for r in recs:
        r["timer"] = "cuda_event"
        if r["impl"] == "device":
            r["step_host_sync_ms"] = r["step_ms"] + 0.05
    m = build_model(recs + host, [])
    opts = options_at(m, tokens=256, heads=16, table_bytes=8 * GIB, compute_us=200.0, w=WhatIf(), hbm_bytes=None,
                      host_bytes=None, row_bytes=160)
    base = next(o for o in opts if o.placement == "HBM" and o.timer == "host_sync")
    assert base.source == "measured" and base.case_id.endswith("#host_sync")
    dev = next(o for o in opts if o.placement == "HBM" and o.timer == "cuda_event")
    assert base.step_ms == pytest.approx(dev.step_ms + 0.05)
    hs = [o for o in opts if o.placement != "HBM" and o.timer == "host_sync"]
    assert hs and all(o.baseline == base.path_id and o.overhead_pct == pytest.approx(100 * (o.step_ms / base.step_ms - 1))
                      for o in hs)


def test_a_breakable_resident_steps_full_graph_is_the_hbm_row_as_in_the_record():
    """A resident breakable step also times its full graph (full_step_ms, full_step_host_sync_ms):
    the model's HBM row for a pinned option is that full graph where it is faster, the figure
    record.Peers holds the pinned step against -- not the breakable step (run
    20261202-074630-traffic_steps-7e52 printed -9 % against 0.218 ms where the record says -3 %
    against the full graph's 0.204 ms)."""
    from ple_bench.advise.what_if import WhatIf, options_at

    recs = [r for r in synthetic() if r["kind"] == "step"]
    for r in recs:
        r["timer"] = "cuda_event"
        if r["impl"] == "device":
            r["full_step_ms"] = r["step_ms"] - 0.03
            r["step_host_sync_ms"] = r["step_ms"] + 0.05
            r["full_step_host_sync_ms"] = r["step_ms"] + 0.02
    m = build_model(recs, [])
    opts = options_at(m, tokens=256, heads=16, table_bytes=8 * GIB, compute_us=200.0, w=WhatIf(), hbm_bytes=None,
                      host_bytes=None, row_bytes=160)
    hbm = {(o.graph, o.timer): o for o in opts if o.placement == "HBM"}
    assert {("full", "cuda_event"), ("full", "host_sync"), ("breakable", "host_sync")} <= set(hbm)
    full = hbm[("full", "cuda_event")]
    assert full.case_id.endswith("#full") and full.step_ms == pytest.approx(hbm[("breakable", "cuda_event")].step_ms - 0.03)
    pinned = [o for o in opts if o.placement != "HBM" and o.timer == "cuda_event"]
    assert pinned and all(o.baseline == full.path_id and o.baseline_step_ms == full.step_ms for o in pinned)


def test_a_new_runs_steps_are_predicted_by_a_model_that_never_saw_them():
    from ple_bench.advise.model import calibrate, heldout_runs, step_points

    recs = synthetic(shapes=SHAPES)
    new = [r for r in recs if r["row_bytes"] == 640]  # the 48 GiB x 640 B x 16 heads shape, measured later
    rates = calibrate(recs, [law_meta()])
    cases = heldout_runs(step_points([r for r in recs if r["row_bytes"] != 640]), rates, step_points(new))
    assert len(cases) == len(new) and max(c.rel_err for c in cases) < 0.01
    assert {c.shape for c in cases} == {"48 GiB x 640 B x 16 heads"}


def test_the_compute_offset_is_interpolated_between_measured_token_counts_and_none_past_them():
    from ple_bench.advise.model import compute_offset

    offsets = {(128, 175.0): 0.03, (256, 175.0): -0.02, (128, 50.0): 0.5}
    assert compute_offset(offsets, 128, 175.0) == 0.03 and compute_offset(offsets, 192, 175.0) == pytest.approx(0.005)
    assert compute_offset(offsets, 1024, 175.0) == 0.0 and compute_offset(offsets, 64, 175.0) == 0.0
    assert compute_offset(offsets, 192, 100.0) == 0.0 and compute_offset(offsets, None, 175.0) == 0.0


def test_an_outlying_newest_run_does_not_decide_the_fit():
    """Three runs of the law; the newest measured the UVA kernel's steps 40 % fast, two runs
    (archived evidence of a bug) 20x slow.  Each case's point is the median run's (step, compute and
    lookup of one run), so the fit recovers the law; fitted on the newest run alone it would not."""
    from ple_bench.advise.model import median_run, step_points
    from ple_bench.record import as_record

    runs = ["20261201-000000-a", "20261202-000000-b", "20261203-000000-c", "20261204-000000-d",
            "20261205-000000-e"]
    recs = []
    for run in runs:
        for r in synthetic():
            r = dict(r, _run_id=run)
            uva = r["impl"] == "pinned_uva"
            scale = 0.6 if uva and run == runs[-1] else 20.0 if uva and run in runs[:2] else 1.0
            for k in ("compute_ms", "lookup_ms", "step_ms"):
                r[k] *= scale
            recs.append(r)
    meta = [law_meta(((8 * GIB, 160, 16), (32 * GIB, 160, 16)))]
    law_steps = {r["case_id"]: r["step_ms"] for r in synthetic()}
    pts = step_points(recs)
    assert {p.runs for p in pts} == {5} and len(pts) == len(law_steps)
    assert all(p.step_ms == pytest.approx(law_steps[p.case_id]) for p in pts)
    uva = [p for p in pts if p.key.impl == "pinned_uva"]
    assert {p.run_id for p in uva} <= {runs[2], runs[3]}  # a median run: neither the newest nor the slow pair
    fit = next(f for k, f in build_model(recs, meta, loo=False).fits.items() if k[0] == "pinned_uva" and k[2])
    assert fit.eff[0] == pytest.approx(1.3, rel=1e-2)
    newest = next(f for k, f in build_model([r for r in recs if r["_run_id"] == runs[-1]], meta, loo=False).fits.items()
                  if k[0] == "pinned_uva" and k[2])
    assert newest.eff[0] < 1.0  # the newest run alone: the outlier decides
    # an even count: the lower of the two middle runs, never their mean
    two = [as_record(dict(recs[0], step_ms=ms)) for ms in (5.0, 0.2)]
    assert median_run(two).step_ms == 0.2
    # a case whose configuration changed in its newest run is fitted on the newest configuration's runs
    moved = [dict(r, compute_us=175.0) if r["_run_id"] == runs[-1] else r for r in recs if r["case_id"] == pts[0].case_id]
    (p,) = step_points(moved)
    assert p.runs == 1 and p.compute_us == 175.0
