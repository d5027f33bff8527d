"""Regression compare: threshold AND Mann-Whitney significance, exit codes,
unmatched cases, HTML diff, and the nightly script end to end."""

from __future__ import annotations

import math
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from ._fake_runs import CEILINGS, gpu_cases, gpu_meta, lookup_record, write_gpu_run, write_run
from ple_bench.spec.case import Case
from ple_bench.commands.compare import compare_main
from ple_bench.report.compare import compare_case, compare_runs
from ple_bench.results import load_records

REPO = Path(__file__).resolve().parent.parent
TARGET = Case(impl="pinned_uva", dtype="fp8", dim=160, vocab_size=1 << 24, num_heads=16, num_tokens=1024)
OTHER = Case(impl="device", dtype="bf16", dim=160, vocab_size=1 << 20, num_heads=16, num_tokens=1024)


def lookups(case: Case) -> bool:  # a small, fast subset of the fake suite
    return case.kind == "lookup" and case.num_tokens == 1024 and case.dim == 160 and case.world_size == 1


def slower(case_id: str, by: float):
    return lambda case: by if case.case_id == case_id else 1.0


def run_cli(*args: str) -> tuple[int, str]:
    import contextlib
    import io

    buf = io.StringIO()
    err = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        code = compare_main(list(args))
    return code, buf.getvalue() + err.getvalue()


def test_run_against_itself_passes(tmp_path):
    run = write_gpu_run(tmp_path / "results", "base", seed=1, only=lookups)
    result = compare_runs(run, run)
    assert result.cases and not result.regressions and not result.improvements
    assert {c.verdict for c in result.cases} == {"same"}
    assert all(c.change_pct == 0 and c.p_value == 1.0 for c in result.cases)
    code, out = run_cli(str(run), str(run), "--reports-dir", str(tmp_path / "reports"))
    assert code == 0 and "PASS" in out


def test_planted_regression_is_found_and_named(tmp_path):
    base = write_gpu_run(tmp_path / "results", "base", seed=1, only=lookups)
    cand = write_gpu_run(tmp_path / "results", "cand", seed=2, only=lookups, factor=slower(TARGET.case_id, 1.2))
    result = compare_runs(base, cand)
    assert [c.case_id for c in result.regressions] == [TARGET.case_id]
    reg = result.regressions[0]
    assert 15 < reg.change_pct < 25 and reg.p_value < 0.01 and reg.n_baseline == reg.n_candidate == 30
    # Everything else (2% noise, different seeds) is not called.
    assert {c.verdict for c in result.cases if c.case_id != TARGET.case_id} == {"same"}
    reports = tmp_path / "reports"
    code, out = run_cli(str(base), str(cand), "--reports-dir", str(reports), "--strict-pooled")
    assert code == 1
    line = next(l for l in out.splitlines() if TARGET.case_id in l)
    assert line.startswith("regression") and "+" in line
    assert "FAIL" in out
    html = (reports / "compare-base-vs-cand.html").read_text()
    assert TARGET.case_id in html and "verdict-regression" in html
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", html)


def test_pooled_verdicts_are_advisory_unless_strict(tmp_path):
    """One run a side: the regression is printed, with the advisory note, and the exit code is 0;
    --strict-pooled gives the old gate (exit 1).  A broken case fails either way."""
    base = write_gpu_run(tmp_path / "results", "base", seed=1, only=lookups, include_broken=False)
    cand = write_gpu_run(tmp_path / "results", "cand", seed=2, only=lookups, include_broken=False,
                         factor=slower(TARGET.case_id, 1.2))
    reports = tmp_path / "reports"
    code, out = run_cli(str(base), str(cand), "--reports-dir", str(reports))
    assert code == 0
    assert re.search(rf"^regression .*{re.escape(TARGET.case_id)}$", out, re.M)
    assert "advisory: samples within one run are not independent" in out and "PASS (advisory)" in out
    html = (reports / "compare-base-vs-cand.html").read_text()
    assert "Advisory:" in html and "verdict-regression" in html
    code, out = run_cli(str(base), str(cand), "--reports-dir", str(reports), "--strict-pooled")
    assert code == 1 and "FAIL" in out and "advisory:" not in out
    from ple_bench.results import RunWriter

    RunWriter(cand).append({"case_id": OTHER.case_id, "status": "failed", "reason": "CUDA error: misaligned"})
    code, out = run_cli(str(base), str(cand), "--reports-dir", str(reports))
    assert code == 1 and "misaligned" in out


def test_improvement_does_not_fail(tmp_path):
    base = write_gpu_run(tmp_path / "results", "base", seed=1, only=lookups)
    cand = write_gpu_run(tmp_path / "results", "cand", seed=2, only=lookups, factor=slower(OTHER.case_id, 0.8))
    result = compare_runs(base, cand)
    assert [c.case_id for c in result.improvements] == [OTHER.case_id] and not result.regressions
    assert result.exit_code == 0


def test_noisy_few_samples_are_not_called(tmp_path):
    base = write_gpu_run(tmp_path / "results", "base", seed=3, only=lookups, n_samples=6, noise_cv=0.5)
    cand = write_gpu_run(tmp_path / "results", "cand", seed=4, only=lookups, n_samples=6, noise_cv=0.5,
                         factor=lambda c: 1.2)
    result = compare_runs(base, cand)
    assert not result.regressions and not result.improvements
    # Changes beyond the threshold exist, but none is significant at 6 samples with 50% noise.
    assert any(c.verdict == "noisy" for c in result.cases)
    assert result.exit_code == 0
    # Below MIN_SAMPLES even a 50% slowdown is "insufficient", never a regression.
    base3 = write_gpu_run(tmp_path / "results", "base3", seed=5, only=lookups, n_samples=3, noise_cv=0.01)
    cand3 = write_gpu_run(tmp_path / "results", "cand3", seed=6, only=lookups, n_samples=3, noise_cv=0.01,
                          factor=lambda c: 1.5)
    result = compare_runs(base3, cand3)
    assert {c.verdict for c in result.cases} == {"insufficient"} and result.exit_code == 0


def test_threshold_is_respected(tmp_path):
    base = write_gpu_run(tmp_path / "results", "base", seed=7, only=lookups, noise_cv=0.005)
    cand = write_gpu_run(tmp_path / "results", "cand", seed=8, only=lookups, noise_cv=0.005,
                         factor=slower(TARGET.case_id, 1.08))
    assert [c.case_id for c in compare_runs(base, cand, threshold_pct=5).regressions] == [TARGET.case_id]
    strict = compare_runs(base, cand, threshold_pct=10)
    assert not strict.regressions and strict.exit_code == 0
    target = next(c for c in strict.cases if c.case_id == TARGET.case_id)
    assert target.verdict == "same" and target.p_value < 0.01  # significant, yet under the threshold
    code, _ = run_cli(str(base), str(cand), "--threshold", "10", "--reports-dir", str(tmp_path / "r"), "--strict-pooled")
    assert code == 0
    code, _ = run_cli(str(base), str(cand), "--threshold", "5", "--reports-dir", str(tmp_path / "r"), "--strict-pooled")
    assert code == 1


def test_alpha_is_respected(tmp_path):
    base = write_gpu_run(tmp_path / "results", "base", seed=9, only=lookups, n_samples=8, noise_cv=0.05)
    cand = write_gpu_run(tmp_path / "results", "cand", seed=10, only=lookups, n_samples=8, noise_cv=0.05,
                         factor=slower(TARGET.case_id, 1.12))
    loose = next(c for c in compare_runs(base, cand, alpha=0.05).cases if c.case_id == TARGET.case_id)
    assert loose.change_pct > 5 and 1e-4 < loose.p_value < 0.05 and loose.verdict == "regression"
    strict = next(c for c in compare_runs(base, cand, alpha=1e-4).cases if c.case_id == TARGET.case_id)
    assert strict.verdict == "noisy" and strict.p_value == loose.p_value


def test_p_value_is_scipys_mann_whitney(tmp_path):
    base = write_gpu_run(tmp_path / "results", "base", seed=11, only=lookups, n_samples=12, noise_cv=0.1)
    cand = write_gpu_run(tmp_path / "results", "cand", seed=12, only=lookups, n_samples=12, noise_cv=0.1,
                         factor=lambda c: 1.1)
    b = {r["case_id"]: r for r in load_records(base)}
    c = {r["case_id"]: r for r in load_records(cand)}
    cid = TARGET.case_id
    got = compare_case(b[cid], c[cid], 5.0, 0.01)
    assert got.p_value == pytest.approx(mannwhitneyu(b[cid]["samples_ms"], c[cid]["samples_ms"],
                                                     alternative="two-sided").pvalue)
    assert got.change_pct == pytest.approx((c[cid]["median_ms"] / b[cid]["median_ms"] - 1) * 100)


def test_bad_input_exits_2(tmp_path, capsys):
    run = write_gpu_run(tmp_path / "results", "base", seed=1, only=lookups)
    code, out = run_cli(str(tmp_path / "missing"), str(run))
    assert code == 2 and "no such run directory" in out
    (tmp_path / "no-meta").mkdir()
    code, out = run_cli(str(run), str(tmp_path / "no-meta"))
    assert code == 2 and "no meta.json" in out
    # Different suites with nothing in common is not a pass.
    other = write_gpu_run(tmp_path / "results", "other", seed=2, suite="other", include_broken=False,
                          only=lambda c: c.kind == "step")
    code, out = run_cli(str(run), str(other), "--reports-dir", str(tmp_path / "reports"))
    assert code == 2 and "nothing in common is not a pass" in out
    result = compare_runs(run, other)
    assert result.only_in_baseline and result.only_in_candidate and not result.cases


def test_unmatched_and_broken_cases(tmp_path):
    base = write_gpu_run(tmp_path / "results", "base", seed=1, only=lookups, include_broken=False)
    cand_only = lambda c: lookups(c) and c.case_id != OTHER.case_id  # noqa: E731
    cand = write_gpu_run(tmp_path / "results", "cand", seed=1, only=cand_only, include_broken=False)
    result = compare_runs(base, cand)
    assert result.only_in_baseline == [OTHER.case_id] and result.only_in_candidate == []
    assert result.exit_code == 0  # a case that went missing is listed, not failed
    # A case that was measured and now fails is "broken": the gate fails.
    from ple_bench.results import RunWriter

    RunWriter(cand).append({"case_id": TARGET.case_id, "status": "failed", "reason": "CUDA error: misaligned"})
    result = compare_runs(base, cand)
    assert [b["case_id"] for b in result.broken] == [TARGET.case_id] and result.exit_code == 1
    code, out = run_cli(str(base), str(cand), "--reports-dir", str(tmp_path / "reports"))
    assert code == 1 and "broken" in out and "misaligned" in out


@pytest.mark.slow
def test_nightly_script_end_to_end(tmp_path):
    """scripts/nightly.sh with a stand-in run command (6 runs a night, the default): no baseline, start
    one from a night's runs, a night with a planted regression (run medians, 6 vs 6, Holm), a night
    accepted into the baseline, and the older one-run baseline with one run a night (pooled, advisory)."""
    maker = tmp_path / "fake_run.py"
    maker.write_text(
        "import os, sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from pathlib import Path\n"
        "from tests._fake_runs import write_gpu_run\n"
        f"from tests.test_compare import lookups, slower, TARGET\n"
        "n = int(os.environ['NIGHT'])\n"
        "res = Path(os.environ['PLE_BENCH_RESULTS'])\n"
        "k = len(list(res.glob(f'2026113{n}-*'))) + 1\n"
        "factor = slower(TARGET.case_id, 1.2) if n == 3 else None\n"
        "write_gpu_run(res, f'2026113{n}-0200{k}0-nightly-000{n}', seed=10 * n + k,\n"
        "              only=lookups, include_broken=False, factor=factor,\n"
        "              started_at=f'2026-11-3{n}T02:0{k}:00+00:00')\n"
        "(res / f'2026113{n}-0200{k}0-nightly-000{n}' / 'calibration.json').write_text('{}')\n"
        "with open(res / 'argv.log', 'a') as fh:\n"
        "    fh.write(f'{n} ' + ' '.join(sys.argv[1:]) + '\\n')\n")
    env = dict(os.environ, PLE_BENCH_PYTHON=sys.executable, PLE_BENCH_RESULTS=str(tmp_path / "results"),
               PLE_BENCH_REPORTS=str(tmp_path / "reports"), PLE_BENCH_RUN_CMD=f"{sys.executable} {maker}",
               PYTHONPATH=str(REPO))

    def night(n: int, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(REPO / "scripts" / "nightly.sh")], env=dict(env, NIGHT=str(n), **extra),
                              capture_output=True, text=True, timeout=300)

    def night_runs(n: int) -> list[str]:
        return [f"2026113{n}-0200{k}0-nightly-000{n}" for k in range(1, 7)]

    baseline = tmp_path / "results" / "baseline"

    def baseline_runs() -> list[str]:
        assert baseline.is_dir() and not baseline.is_symlink()
        links = sorted(baseline.iterdir())
        assert all(p.is_symlink() for p in links)
        return [p.resolve().name for p in links]

    first = night(1)
    assert first.returncode == 2 and "no baseline" in first.stderr
    # A later night: the baseline is started from its three runs; then a night with a planted regression.
    second = night(2, PLE_BENCH_INIT_BASELINE="1")
    assert second.returncode == 0, second.stderr
    assert baseline_runs() == night_runs(2)
    argv = (tmp_path / "results" / "argv.log").read_text().splitlines()
    second_night = [line for line in argv if line.startswith("2 ")]  # the first run calibrates, the others reuse it
    assert second_night[0] == "2 " and all(
        line == f"2 --calibration {tmp_path / 'results' / night_runs(2)[0] / 'calibration.json'}"
        for line in second_night[1:]), second_night
    third = night(3)
    assert third.returncode == 1, third.stdout + third.stderr
    argv = (tmp_path / "results" / "argv.log").read_text().splitlines()
    assert [line for line in argv if line.startswith("3 ")] == [
        f"3 --calibration {baseline / night_runs(2)[0] / 'calibration.json'}"] * 6  # the baseline's
    assert re.search(rf"^regression .* 6/6  {re.escape(TARGET.case_id)}$", third.stdout, re.M)
    assert "run medians of 6 vs 6 runs" in third.stdout and "Holm over 12 cases" in third.stdout
    assert "not independent" not in third.stdout
    assert baseline_runs() == night_runs(2)  # a failing night does not move the baseline
    new = tmp_path / "results" / night_runs(3)[-1]
    assert (new / "pytest-benchmark.json").exists()
    report = (tmp_path / "reports" / new.name / "index.html").read_text()
    assert "Trend over 15 runs" in report  # the last 14 + this one; the baseline's symlinks are not counted
    assert (tmp_path / "reports" / f"compare-{night_runs(2)[0]}+5-vs-{night_runs(3)[0]}+5.html").exists()
    summary = (tmp_path / "reports" / f"compare-{new.name}.md").read_text()
    assert re.search(rf"\| {re.escape(TARGET.case_id)} \|.*\| SLOW \|", summary)
    assert (tmp_path / "reports" / f"compare-{new.name}.csv").exists()
    history = (tmp_path / "reports" / "history-nightly.html").read_text()
    assert history.count("data:image/png;base64,") == 12 and "history of 12 cases over 18 runs" in third.stdout
    # An accepted night: it passes against the old baseline and becomes the baseline.
    fourth = night(4, PLE_BENCH_ACCEPT="1")
    assert fourth.returncode == 0, fourth.stdout + fourth.stderr
    assert baseline_runs() == night_runs(4)
    assert all((tmp_path / "results" / name / "meta.json").exists() for name in night_runs(2))  # runs kept
    # The older layout: a baseline that is one run directory, one run a night: pooled samples, said so.
    fifth = night(5, PLE_BENCH_RUNS="1", PLE_BENCH_BASELINE=str(tmp_path / "results" / night_runs(4)[0]))
    assert fifth.returncode == 0, fifth.stdout + fifth.stderr
    assert "advisory: samples within one run are not independent" in fifth.stdout


# ------------------------------------------------------------ several runs a side (run medians)

def run_offsets(seed: int, cv: float):
    """A factor giving every case its own run-level offset (log-normal, ``cv``): what a run's table
    allocation or machine state does to all of that run's samples at once."""
    rng = np.random.default_rng(seed)
    sigma = math.sqrt(math.log(1 + cv * cv))
    return lambda case: float(rng.lognormal(0.0, sigma))


def runs(tmp_path, prefix: str, seeds, factor=None, run_cv: float = 0.0, **kw) -> list[Path]:
    out = []
    for seed in seeds:
        offsets = run_offsets(1000 + seed, run_cv) if run_cv else (lambda case: 1.0)
        planted = factor or (lambda case: 1.0)
        out.append(write_gpu_run(tmp_path / "results", f"{prefix}{seed}", seed=seed, only=lookups,
                                 factor=lambda case, o=offsets, p=planted: o(case) * p(case), **kw))
    return out


def test_six_vs_six_real_shift_is_a_regression_after_holm(tmp_path):
    base = runs(tmp_path, "base", (1, 2, 3, 4, 5, 6), run_cv=0.01)
    cand = runs(tmp_path, "cand", (11, 12, 13, 14, 15, 16), run_cv=0.01, factor=slower(TARGET.case_id, 1.2))
    result = compare_runs(base, cand)
    assert result.mode == "runs" and result.alpha == 0.05 and result.p_adjust == "holm"
    assert [c.case_id for c in result.regressions] == [TARGET.case_id]
    assert {c.verdict for c in result.cases if c.case_id != TARGET.case_id} == {"same"}
    reg = result.regressions[0]
    assert reg.basis == "runs" and reg.n_baseline == reg.n_candidate == 6 and 15 < reg.change_pct < 25
    # The raw p is scipy's one-sided exact test on the run medians (complete separation: 1/C(12,6));
    # the adjusted p is Holm's over the 12 tested cases: the smallest p times 12.
    medians = {side: [statistics.median(next(r for r in load_records(d) if r["case_id"] == TARGET.case_id)
                                        ["samples_ms"]) for d in dirs] for side, dirs in (("b", base), ("c", cand))}
    assert reg.p_value == pytest.approx(mannwhitneyu(medians["b"], medians["c"], alternative="less").pvalue)
    assert reg.p_value == pytest.approx(1 / 924)
    assert len(result.tested) == 12 and reg.p_adjusted == pytest.approx(12 / 924)
    assert reg.baseline_ms == pytest.approx(statistics.median(medians["b"]))
    assert not result.warnings
    reports = tmp_path / "reports"
    code, out = run_cli(*map(str, base), "--vs", *map(str, cand), "--reports-dir", str(reports))
    assert code == 1 and "FAIL" in out and "run medians of 6 vs 6 runs" in out and "Holm over 12 cases" in out
    line = next(l for l in out.splitlines() if TARGET.case_id in l)
    assert line.startswith("regression") and " 6/6 " in line and " 0.0011 " in line and " 0.013 " in line
    assert "not independent" not in out  # the caveat is for pooled samples only
    html = (reports / "compare-base1+5-vs-cand11+5.html").read_text()
    assert "verdict-regression" in html and "Holm-adjusted" in html and "not independent" not in html


def test_three_vs_three_cannot_call_anything_after_holm_and_says_so(tmp_path):
    """3 vs 3 runs: the smallest exact one-sided p is 1/20, and Holm over 12 cases needs 0.05/12 for
    the first call: a real 20 % shift is "noisy", and the output says how many runs it takes
    (5 a side: 12/252 <= 0.05).  Per case (--p-adjust none) it is called, as the rule used to."""
    base = runs(tmp_path, "base", (1, 2, 3), run_cv=0.01)
    cand = runs(tmp_path, "cand", (4, 5, 6), run_cv=0.01, factor=slower(TARGET.case_id, 1.2))
    result = compare_runs(base, cand)
    target = next(c for c in result.cases if c.case_id == TARGET.case_id)
    assert target.verdict == "noisy" and target.p_value == pytest.approx(0.05)
    assert target.p_adjusted == pytest.approx(0.6)  # 12 x 0.05 (ties at the floor share it)
    assert not result.regressions and result.exit_code == 0
    (warning,) = [w for w in result.warnings if "no case can be called" in w]
    assert "3 vs 3" in warning and "12 tested cases" in warning and "5 runs a side" in warning
    per_case = compare_runs(base, cand, p_adjust="none")
    assert [c.case_id for c in per_case.regressions] == [TARGET.case_id] and per_case.exit_code == 1
    code, out = run_cli(*map(str, base), "--vs", *map(str, cand), "--reports-dir", str(tmp_path / "r"))
    assert code == 0 and "5 runs a side reach it" in out
    code, _ = run_cli(*map(str, base), "--vs", *map(str, cand), "--reports-dir", str(tmp_path / "r"),
                      "--p-adjust", "none")
    assert code == 1


def test_holm_and_runs_needed():
    from ple_bench.report.compare import holm, runs_needed

    # Holm's adjusted p (checked by hand): sorted 0.01, 0.02, 0.04, 0.3 of m = 4 -> 0.04, 0.06, 0.08, 0.3.
    assert holm([0.3, 0.01, 0.04, 0.02]) == pytest.approx([0.3, 0.04, 0.08, 0.06])
    assert holm([0.5, 0.5]) == pytest.approx([1.0, 1.0]) and holm([]) == []
    # The nightly suite: 23 cases at 0.05 need 6 runs a side (23/924 = 0.025; 23/252 = 0.09).
    assert runs_needed(23, 0.05) == 6 and runs_needed(12, 0.05) == 5 and runs_needed(1, 0.05) == 3


def test_three_vs_three_noise_only_passes(tmp_path):
    """No code change, only run-level noise: each run's own small offset per case, and one candidate
    run 15% slow in every case (a bad table allocation, a busy host).  Its samples against one baseline
    run's call every case a regression; the median of 3 run medians is not moved by one bad run."""
    base = runs(tmp_path, "base", (1, 2, 3), run_cv=0.01)
    bad_run = runs(tmp_path, "cand", (4,), run_cv=0.01, factor=lambda case: 1.15)
    cand = bad_run + runs(tmp_path, "cand", (5, 6), run_cv=0.01)
    pooled = compare_runs(base[0], cand[0])
    assert pooled.mode == "samples" and len(pooled.regressions) == len(pooled.cases)  # the caveat, shown
    result = compare_runs(base, cand)
    assert result.mode == "runs" and not result.regressions and not result.improvements
    assert len(result.cases) == len(pooled.cases) and result.exit_code == 0
    code, out = run_cli(*map(str, base), "--vs", *map(str, cand), "--reports-dir", str(tmp_path / "reports"))
    assert code == 0 and "PASS" in out


def test_alpha_below_the_run_count_floor_is_said(tmp_path):
    base = runs(tmp_path, "base", (1, 2, 3))
    cand = runs(tmp_path, "cand", (4, 5, 6), factor=slower(TARGET.case_id, 1.2))
    result = compare_runs(base, cand, alpha=0.01, p_adjust="none")
    assert not result.regressions and result.exit_code == 0
    assert next(c for c in result.cases if c.case_id == TARGET.case_id).verdict == "noisy"
    assert any("below the smallest p" in w and "3 vs 3" in w for w in result.warnings)
    # 4 vs 4 runs go below it (1/70): the same shift is called at alpha 0.02.
    more = compare_runs(base + runs(tmp_path, "base", (7,)), cand + runs(tmp_path, "cand", (8,),
                        factor=slower(TARGET.case_id, 1.2)), alpha=0.02, p_adjust="none")
    assert [c.case_id for c in more.regressions] == [TARGET.case_id] and not more.warnings


def test_single_run_output_says_samples_are_not_independent(tmp_path):
    base = write_gpu_run(tmp_path / "results", "base", seed=1, only=lookups)
    cand = write_gpu_run(tmp_path / "results", "cand", seed=2, only=lookups)
    reports = tmp_path / "reports"
    code, out = run_cli(str(base), str(cand), "--reports-dir", str(reports))
    assert code == 0
    assert "samples within one run are not independent" in out and "p-value on pooled samples is optimistic" in out
    assert "not independent" in (reports / "compare-base-vs-cand.html").read_text()
    # Two runs a side are still pooled (and still say so); --vs with one run a side is the same as BASE CAND.
    two = compare_runs(runs(tmp_path, "b", (1, 2)), runs(tmp_path, "c", (3, 4)))
    assert two.mode == "samples" and two.caveat and {c.n_baseline for c in two.cases} == {60}
    code_vs, out_vs = run_cli(str(base), "--vs", str(cand), "--reports-dir", str(reports))
    assert code_vs == 0 and "not independent" in out_vs


def test_several_runs_without_vs_is_bad_usage(tmp_path):
    a, b, c = runs(tmp_path, "r", (1, 2, 3))
    code, out = run_cli(str(a), str(b), str(c), "--reports-dir", str(tmp_path / "reports"))
    assert code == 2 and "--vs" in out
    code, out = run_cli(str(a), str(b), str(c), "--vs", str(a), str(tmp_path / "missing"), str(c))
    assert code == 2 and "no such run directory" in out


# ------------------------------------------------------------ throttled samples

def _throttled_run(results: Path, run_id: str, seed: int, n_throttled: int, flags: bool = True) -> Path:
    """One lookup case: 30 good samples around 1 ms, plus ``n_throttled`` samples at 1.5 ms taken
    while the SM clock was throttled; ``median_ms`` is over the good ones, as the timer stores it."""
    rng = np.random.default_rng(seed)
    good = list(1.0 * rng.lognormal(0, 0.01, 30))
    slow = list(1.5 * rng.lognormal(0, 0.01, n_throttled))
    rec = lookup_record(TARGET, good, "h2d_gbps", CEILINGS)
    rec.update(samples_ms=good + slow, throttled_samples=n_throttled, n_samples=30,
               median_ms=statistics.median(good))
    rec["samples_throttled"] = [False] * 30 + [True] * n_throttled if flags else None
    return write_run(results, run_id, gpu_meta(run_id), [rec])


def test_throttled_samples_are_excluded_consistently(tmp_path):
    res = tmp_path / "results"
    base = _throttled_run(res, "base", 1, 0)
    cand = _throttled_run(res, "cand", 2, 30)  # half its samples throttled and 50% slower
    stored = next(r for r in load_records(cand))
    (c,) = compare_runs(base, cand).cases
    # The median shown is the run's own median_ms, and the test saw exactly those 30 samples.
    assert c.verdict == "same" and c.n_candidate == 30 and c.candidate_ms == pytest.approx(stored["median_ms"])
    good = stored["samples_ms"][:30]
    base_samples = next(r for r in load_records(base))["samples_ms"]
    assert c.p_value == pytest.approx(mannwhitneyu(base_samples, good, alternative="two-sided").pvalue)
    # Run medians drop them too (each run's median is over its unthrottled samples).
    bases = [_throttled_run(res, f"b{i}", 10 + i, 0) for i in range(3)]
    cands = [_throttled_run(res, f"c{i}", 20 + i, 30) for i in range(3)]
    (r,) = compare_runs(bases, cands).cases
    assert r.verdict == "same" and abs(r.change_pct) < 2
    # An old record counts throttled samples without flagging them: median and test both use every
    # sample (so they still agree with each other), and the output says so.
    old = _throttled_run(res, "old", 2, 30, flags=False)
    result = compare_runs(base, old)
    (o,) = result.cases
    assert o.n_candidate == 60 and o.candidate_ms == pytest.approx(statistics.median(
        next(r for r in load_records(old))["samples_ms"]))
    assert o.verdict == "regression"
    assert any("do not flag" in w or "does not flag" in w for w in result.warnings)


def _set_matmuls(run: Path, counts: dict[str, int]) -> None:
    """Give the step records of a stored run their compute's matmul count (``counts`` by case id)."""
    import json

    path = run / "records.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for r in recs:
        if r.get("kind") == "step":
            r["compute_matmuls"] = counts.get(r["case_id"], 7)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_steps_calibrated_to_different_compute_are_not_compared_as_regressions(tmp_path):
    """A step whose compute ran a different number of matmuls on the two sides did other work:
    verdict ``workload`` (exit 0), however much slower; the same slowdown with the same compute
    is a regression."""
    def steps(case):
        return case.kind == "step" and case.compute_us == 200.0

    step = next(c for c in gpu_cases()["step"] if steps(c))
    base = write_gpu_run(tmp_path / "results", "base", seed=1, only=steps, include_broken=False)
    cand = write_gpu_run(tmp_path / "results", "cand", seed=2, only=steps, include_broken=False,
                         factor=slower(step.case_id, 1.2))
    _set_matmuls(base, {step.case_id: 10})
    _set_matmuls(cand, {step.case_id: 11})
    result = compare_runs(base, cand)
    by_id = {c.case_id: c for c in result.cases}
    assert by_id[step.case_id].verdict == "workload" and by_id[step.case_id].change_pct > 15
    assert not result.regressions and result.exit_code == 0
    assert {c.verdict for c in result.cases if c.case_id != step.case_id} == {"same"}
    code, out = run_cli(str(base), str(cand), "--reports-dir", str(tmp_path / "reports"))
    assert code == 0 and "1 workload" in out
    _set_matmuls(cand, {step.case_id: 10})
    again = compare_runs(base, cand)
    assert [c.case_id for c in again.regressions] == [step.case_id]


# ------------------------------------------------------------ timers, functional runs

HOST_CASE = Case(impl="pinned_cpu_gather", ids_on="host", dtype="bf16", dim=128, vocab_size=1 << 20, num_heads=16,
                 num_tokens=256)


def _timed_run(results: Path, run_id: str, seed: int, cases: dict, *, old: bool = False) -> Path:
    """One run of the given cases ({case: (median ms, timer)}); ``old``: written as a record before
    schema versions (no schema_version, upgraded on load), as the spin-hold runs of host paths were."""
    rng = np.random.default_rng(seed)
    recs = [lookup_record(case, list(ms * rng.lognormal(0, 0.01, 30)), None, CEILINGS, timer=timer)
            for case, (ms, timer) in cases.items()]
    return write_run(results, run_id, gpu_meta(run_id), recs, derive=not old)


def test_a_case_timed_differently_is_not_comparable(tmp_path):
    """A host path timed on CUDA events behind the spin hold (an old record) against the same case
    on the host-sync timer reads 91 % faster: not comparable, both timers named, exit code untouched."""
    res = tmp_path / "results"
    base = _timed_run(res, "base", 1, {HOST_CASE: (10.0, "cuda_event"), TARGET: (1.0, "cuda_event")}, old=True)
    cand = _timed_run(res, "cand", 2, {HOST_CASE: (0.9, "host_sync"), TARGET: (1.0, "cuda_event")})
    assert next(r for r in load_records(base) if r["case_id"] == HOST_CASE.case_id).get("upgraded_from") == 1
    result = compare_runs(base, cand, strict_pooled=True)
    by_id = {c.case_id: c for c in result.cases}
    host = by_id[HOST_CASE.case_id]
    assert host.verdict == "not comparable" and -92 < host.change_pct < -90 and host.p_value is None
    assert (host.baseline_timer, host.candidate_timer) == ("cuda_event", "host_sync")
    assert result.not_comparable == [host] and not result.improvements and not result.regressions
    assert by_id[TARGET.case_id].verdict == "same" and result.exit_code == 0
    reports = tmp_path / "reports"
    code, out = run_cli(str(base), str(cand), "--reports-dir", str(reports), "--strict-pooled",
                        "--markdown", str(tmp_path / "s.md"))
    assert code == 0 and "1 not comparable" in out
    line = next(l for l in out.splitlines() if HOST_CASE.case_id in l)
    assert line.startswith("not comparable") and "baseline timer cuda_event, candidate timer host_sync" in line
    html = (reports / "compare-base-vs-cand.html").read_text()
    assert 'id="not-comparable"' in html and "cuda_event → host_sync" in html
    md = (tmp_path / "s.md").read_text()
    assert re.search(rf"\| {re.escape(HOST_CASE.case_id)} \|.*\| not comparable \| baseline timer cuda_event", md)
    # The same -91 % with the same timer on both sides is an improvement.
    same = _timed_run(res, "cand2", 3, {HOST_CASE: (0.9, "cuda_event"), TARGET: (1.0, "cuda_event")})
    assert [c.case_id for c in compare_runs(base, same).improvements] == [HOST_CASE.case_id]


def _scale_samples(run: Path, by: float) -> None:
    import json

    path = run / "records.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for r in recs:
        if r.get("status") == "ok":
            r["samples_ms"] = [s * by for s in r["samples_ms"]]
            r["median_ms"] *= by
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_functional_runs_get_no_verdict(tmp_path):
    """CPU functional runs, the candidate twice as slow: no verdict (exit 0 even with --strict-pooled,
    and on run medians), in the words the HTML report uses for such a run."""
    from ._fake_runs import write_cpu_run

    res = tmp_path / "results"
    base = write_cpu_run(res, "base", seed=1)
    cand = write_cpu_run(res, "cand", seed=2)
    _scale_samples(cand, 2.0)
    result = compare_runs(base, cand, strict_pooled=True)
    assert result.no_verdict and result.cases and {c.verdict for c in result.cases} == {"no verdict"}
    assert not result.regressions and result.exit_code == 0
    reports = tmp_path / "reports"
    code, out = run_cli(str(base), str(cand), "--reports-dir", str(reports), "--strict-pooled")
    assert code == 0 and "No verdict: functional-mode runs time the CPU, not the GPU" in out
    assert "No verdict: functional-mode runs time the CPU" in (reports / "compare-base-vs-cand.html").read_text()
    bases = [write_cpu_run(res, f"b{i}", seed=10 + i) for i in range(3)]
    cands = [write_cpu_run(res, f"c{i}", seed=20 + i) for i in range(3)]
    for c in cands:
        _scale_samples(c, 2.0)
    runs_result = compare_runs(bases, cands, p_adjust="none")
    assert runs_result.mode == "runs" and runs_result.exit_code == 0
    assert {c.verdict for c in runs_result.cases} == {"no verdict"}
    # The same doubling on GPU records is a regression (so the no-verdict above is the mode's doing).
    gpu_b = write_gpu_run(res, "gb", seed=1, only=lookups, include_broken=False)
    gpu_c = write_gpu_run(res, "gc", seed=2, only=lookups, include_broken=False)
    _scale_samples(gpu_c, 2.0)
    assert compare_runs(gpu_b, gpu_c, strict_pooled=True).exit_code == 1


# ------------------------------------------------------------ markdown / CSV summaries

def _md_rows(path: Path) -> list[dict[str, str]]:
    lines = [l for l in path.read_text().splitlines() if l.startswith("|")]
    header = [h.strip() for h in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in l.strip("|").split("|")))) for l in lines[2:]]


def test_markdown_and_csv_summaries(tmp_path):
    import pandas as pd

    base = write_gpu_run(tmp_path / "results", "base", seed=1, only=lookups, include_broken=False)
    cand = write_gpu_run(tmp_path / "results", "cand", seed=2, only=lookups, include_broken=False,
                         factor=lambda c: 1.2 if c.case_id == TARGET.case_id else 0.8 if c.case_id == OTHER.case_id
                         else 1.0)
    md, csv = tmp_path / "out" / "cmp.md", tmp_path / "out" / "cmp.csv"
    code, out = run_cli(str(base), str(cand), "--reports-dir", str(tmp_path / "reports"), "--markdown", str(md),
                        "--csv", str(csv))
    assert code == 0 and f"markdown: {md}" in out and f"CSV: {csv}" in out
    result = compare_runs(base, cand)
    df = pd.read_csv(csv)
    # case_id plus the axes that differ across the cases (here impl, vocab_size, dtype; not num_tokens).
    assert list(df.columns[:4]) == ["case_id", "impl", "vocab_size", "dtype"] and "num_tokens" not in df.columns
    status = dict(zip(df["case_id"], df["status"]))
    assert status.pop(TARGET.case_id) == "SLOW" and status.pop(OTHER.case_id) == "FAST"
    assert set(status.values()) == {"SAME"} and len(df) == len(result.cases)
    row = df.set_index("case_id").loc[TARGET.case_id]
    target = next(c for c in result.cases if c.case_id == TARGET.case_id)
    assert row["p"] == pytest.approx(target.p_value) and row["change_pct"] == pytest.approx(target.change_pct)
    assert row["candidate_ms"] == pytest.approx(target.candidate_ms) and row["impl"] == "pinned_uva"
    assert 0.5 < row["baseline_noise_pct"] < 5 and math.isnan(row["p_adjusted"])  # pooled: no adjustment
    rows = {r["case_id"]: r for r in _md_rows(md)}
    assert rows[TARGET.case_id]["status"] == "SLOW" and rows[TARGET.case_id]["change"].startswith("+")
    assert rows[OTHER.case_id]["status"] == "FAST" and len(rows) == len(df)
    assert "advisory: samples within one run are not independent" in md.read_text()


def test_markdown_and_csv_carry_adjusted_p(tmp_path):
    import pandas as pd

    base = runs(tmp_path, "base", (1, 2, 3, 4, 5, 6), run_cv=0.01)
    cand = runs(tmp_path, "cand", (11, 12, 13, 14, 15, 16), run_cv=0.01, factor=slower(TARGET.case_id, 1.2))
    md, csv = tmp_path / "cmp.md", tmp_path / "cmp.csv"
    code, _ = run_cli(*map(str, base), "--vs", *map(str, cand), "--reports-dir", str(tmp_path / "r"),
                      "--markdown", str(md), "--csv", str(csv))
    assert code == 1
    row = pd.read_csv(csv).set_index("case_id").loc[TARGET.case_id]
    assert row["status"] == "SLOW" and row["p"] == pytest.approx(1 / 924) and row["p_adjusted"] == pytest.approx(12 / 924)
    md_row = next(r for r in _md_rows(md) if r["case_id"] == TARGET.case_id)
    assert md_row["p"] == "0.00108" and md_row["p adjusted"] == "0.013" and md_row["status"] == "SLOW"


# ------------------------------------------------------------ false-alarm rate of the nightly gate

def _simulated_night(rng: np.random.Generator, n_runs: int, n_cases: int = 23, cv: float = 0.04):
    """Baseline and candidate runs of an unchanged night: each run's median of each case log-normal
    around 1 ms with ``cv`` run-to-run spread (what separate runs of one build do)."""
    from ple_bench.report.data import Run

    sigma = math.sqrt(math.log(1 + cv * cv))

    def side(prefix: str) -> list:
        return [Run(path=Path(f"{prefix}{k}"), meta={"run_id": f"{prefix}{k}", "mode": "gpu", "status": "complete"},
                    records=[{"case_id": f"case{i:02d}", "status": "ok", "timer": "cuda_event", "median_ms": float(m)}
                             for i, m in enumerate(rng.lognormal(0.0, sigma, n_cases))])
                for k in range(n_runs)]
    return side("b"), side("c")


def test_unchanged_nights_rarely_fail():
    """120 simulated unchanged nights of the nightly gate (23 cases, 6 runs a side, 4 % run-to-run
    spread, threshold 5 %): with Holm the share of nights with any false regression stays under 10 %
    (Holm bounds it by alpha = 5 %; measured 2.9 % over 2000 nights, docs/nightly.md).  The per-case
    rule (alpha 0.05 for each case, what compare did before) fails on the same nights about a third
    of the time (and 3 vs 3 runs, the earlier nightly count, 43 %)."""
    from ple_bench.report.compare import compare_loaded

    rng = np.random.default_rng(20261201)
    nights = 120
    failed = {"holm": 0, "none": 0}
    for _ in range(nights):
        bases, cands = _simulated_night(rng, 6)
        for adjust in failed:
            failed[adjust] += bool(compare_loaded(bases, cands, p_adjust=adjust).regressions)
    assert failed["holm"] / nights < 0.10
    assert failed["none"] / nights > 0.20  # the bound above is one the old rule fails


# ------------------------------------------------------------ history page

def _set_meta(run: Path, **fields) -> None:
    import json

    meta = json.loads((run / "meta.json").read_text())
    meta.update(fields)
    (run / "meta.json").write_text(json.dumps(meta))


def test_history_page_over_commits(tmp_path):
    """Five nightly runs on five commits (written out of order), two of them the baseline (symlinks in
    results/baseline, as nightly.sh keeps it), the newest with the target 50 % slower, and a run of
    another suite that is not drawn."""
    from ple_bench.report.history import load_history

    res = tmp_path / "results"
    commits = ["a1b2c3d4e5f6", "b2c3d4e5f6a1", "c3d4e5f6a1b2", "d4e5f6a1b2c3", "e5f6a1b2c3d4-dirty"]
    order = [3, 0, 4, 1, 2]  # the write order; started_at gives the real one
    paths = {}
    for i in order:
        run = write_gpu_run(res, f"run{i}-{commits[i][:4]}", seed=i, only=lookups, include_broken=False,
                            started_at=f"2026-11-2{i}T02:00:00+00:00",
                            factor=slower(TARGET.case_id, 1.5) if i == 4 else None)
        _set_meta(run, git_commit=commits[i])
        paths[i] = run
    write_gpu_run(res, "other-suite", seed=9, suite="paths", only=lookups, started_at="2026-11-30T02:00:00+00:00")
    (res / "baseline").mkdir()
    for i in (0, 1):
        (res / "baseline" / paths[i].name).symlink_to(paths[i].resolve())
    history = load_history(res)
    assert history.suite == "nightly" and [r.path.name for r in history.runs] == [paths[i].name for i in range(5)]
    assert history.commits == ["a1b2c3d", "b2c3d4e", "c3d4e5f", "d4e5f6a", "e5f6a1b*"]
    assert sorted(history.baseline_ids) == sorted(paths[i].name for i in (0, 1))
    target = next(c for c in history.cases if c.case_id == TARGET.case_id)
    medians = [statistics.median(next(r for r in load_records(paths[i]) if r["case_id"] == TARGET.case_id)
                                 ["samples_ms"]) for i in range(5)]
    assert target.medians == pytest.approx(medians)
    assert target.band == pytest.approx((min(medians[:2]), max(medians[:2])))
    assert target.medians[4] > 1.3 * target.band[1]  # the planted slowdown stands out of the band
    reports = tmp_path / "reports"
    code, out = run_cli("--history", str(res), "--reports-dir", str(reports))
    assert code == 0, out
    html = (reports / "history-nightly.html").read_text()
    assert html.count('<img src="data:image/png;base64,') == len(history.cases) == 12
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", html)
    positions = [html.index(f"<code>{c}</code>") for c in history.commits]
    assert positions == sorted(positions) and TARGET.case_id in html
    # --history-last and the positional baseline runs; bad input exits 2 with the reason.
    last = load_history(res, baseline_dirs=[paths[4]], last=2)
    assert last.commits == ["d4e5f6a", "e5f6a1b*"] and last.baseline_ids == [paths[4].name]
    code, out = run_cli("--history", str(tmp_path / "missing"))
    assert code == 2 and "no such results directory" in out
    code, out = run_cli("--history", str(res), "--suite", "nope", "--reports-dir", str(reports))
    assert code == 2 and "no runs of suite 'nope'" in out
    code, out = run_cli("--history", str(res), "--vs", str(paths[0]))
    assert code == 2 and "takes no --vs" in out


def _repeated_run(tmp_path, run_id: str, center_ms: float, seed: int) -> Path:
    """One run of two lookups, each repeated in 4 processes x 2 rounds (process-level spread ~1 %)."""
    rng = np.random.default_rng(seed)
    recs = []
    for tokens in (256, 1024):
        case = Case(kind="lookup", impl="device", num_tokens=tokens)
        reps = [{"process": p, "round": r, "ms": {"median_ms": center_ms * tokens / 256 * (1 + rng.normal(0, 0.01))},
                 "se_ms": {}} for p in range(4) for r in range(2)]
        samples = [reps[0]["ms"]["median_ms"]] * 9
        rec = lookup_record(case, samples, None, CEILINGS, replicates=reps, processes=4, rounds=2)
        rec["median_ms"] = statistics.fmean(e["ms"]["median_ms"] for e in reps)
        recs.append(rec)
    return write_run(tmp_path, run_id, gpu_meta(run_id), recs)


def test_repeated_cases_are_judged_on_their_process_means_with_one_run_a_side(tmp_path):
    base = _repeated_run(tmp_path, "20261207-100000-nightly-aaaa", 1.0, seed=1)
    same = _repeated_run(tmp_path, "20261207-110000-nightly-bbbb", 1.0, seed=2)
    slow = _repeated_run(tmp_path, "20261207-120000-nightly-cccc", 1.10, seed=3)
    quiet = compare_runs([base], [same])
    assert quiet.exit_code == 0 and {c.basis for c in quiet.cases} == {"processes"}
    assert all(c.n_baseline == 4 and c.n_candidate == 4 for c in quiet.cases) and not quiet.advisory
    loud = compare_runs([base], [slow])
    # one run a side, yet a 10 % slowdown over 4 independent processes a side fails the gate (not advisory)
    assert loud.exit_code == 1 and len(loud.regressions) == 2
    assert all(c.p_adjusted is not None and c.p_adjusted <= 0.05 for c in loud.regressions)
