"""``pytest suites/``: a suite's cases as pytest-benchmark benchmarks on ple_bench's
engine (suites/conftest.py, suites/test_suite_cases.py).

Each test runs pytest in a subprocess (CPU forced, so it behaves the same on a
GPU machine) and checks the outcome and the ``--benchmark-json`` document, which
pytest-benchmark's own loader and ``compare`` CLI must read."""

from __future__ import annotations

import json
import logging
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from ple_bench.spec.suite import list_suites, load_suite

pytest.importorskip("pytest_benchmark")
from pytest_benchmark.storage.file import FileStorage  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SMOKE = {c.case_id: c for c in load_suite("smoke").cases}


def _smoke_id(prefix: str) -> str:
    hits = [cid for cid in SMOKE if cid.startswith(prefix + "-")]
    assert len(hits) == 1, (prefix, hits)
    return hits[0]


LOOKUP_DEVICE = _smoke_id("lookup.device.v4096.d64.fp32.h4.t16")
LOOKUP_PINNED_PF = _smoke_id("lookup.pinned_uva.v4096.d64.bf16.h4.t16.pf")
STEP_DEVICE = _smoke_id("step.device.v4096.d160.fp8.h4.t8.c20us")
MULTI_RANK = _smoke_id("lookup.device.v4096.d64.bf16.h4.t8.tp1etp2dp2")


def _pytest(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PLE_BENCH_FORCE_CPU="1")
    env.pop("PYTEST_ADDOPTS", None)
    for name in [n for n in env if n.startswith("PYTEST_XDIST_")]:
        env.pop(name)  # a pytest of its own, not an xdist worker (pytest-benchmark turns itself off in one)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def _benchmarks_by_case(doc: dict) -> dict[str, dict]:
    return {b["extra_info"]["case_id"]: b for b in doc["benchmarks"]}


@pytest.mark.slow  # pytest suites/ in a new interpreter: a suite's cases run end to end
def test_smoke_cases_become_benchmarks(tmp_path):
    selected = [LOOKUP_DEVICE, LOOKUP_PINNED_PF, STEP_DEVICE, MULTI_RANK]
    out_json = tmp_path / "bench.json"
    proc = _pytest("suites/", "-q", "-rs", "--ple-suite", "smoke", "--ple-rounds", "3",
                   "--ple-warmup-rounds", "1", "-k", " or ".join(selected), f"--benchmark-json={out_json}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"\b3 passed, 1 skipped\b", proc.stdout), proc.stdout
    assert re.search(r"SKIPPED \[1\] .*multi-rank case \(tp=1 etp=2 dp=2: 2 ranks\)", proc.stdout), proc.stdout

    doc = json.loads(out_json.read_text())
    benches = _benchmarks_by_case(doc)
    assert set(benches) == {LOOKUP_DEVICE, LOOKUP_PINNED_PF, STEP_DEVICE}  # one per case that ran
    for cid, bench in benches.items():
        case = SMOKE[cid]
        assert bench["name"] == f"test_case[{cid}]"
        assert bench["group"] == f"smoke/{case.kind}"
        stats = bench["stats"]
        assert stats["rounds"] == 3 and stats["iterations"] == 1 and len(stats["data"]) == 3
        assert all(t > 0 for t in stats["data"]) and stats["min"] <= stats["median"] <= stats["max"]
        info = bench["extra_info"]
        assert info["suite"] == "smoke" and info["mode"] == "functional" and info["timer"] == "host"
        for axis, value in case.axes().items():  # every axis of the case
            assert info[axis] == value, axis
        # the engine's own measurement, alongside pytest-benchmark's
        assert info["engine_timer"] == "host_monotonic"
        samples = info["engine_samples_ms"]
        assert len(samples) >= 1 and all(s > 0 for s in samples)
        assert info["engine_median_ms"] == pytest.approx(statistics.median(samples))
        assert info["timed"] == ("decode step" if case.kind == "step" else "lookup")
    step_info = benches[STEP_DEVICE]["extra_info"]
    assert step_info["engine_step_ms"] == step_info["engine_median_ms"] and step_info["engine_lookup_ms"] > 0
    assert benches[LOOKUP_PINNED_PF]["extra_info"]["prefetch"] is True
    smoke_id_sets = load_suite("smoke").timing["id_sets"]
    for cid in (LOOKUP_DEVICE, LOOKUP_PINNED_PF):  # the same id rotation as the engine's
        info = benches[cid]["extra_info"]
        assert info["id_sets"] == info["engine_id_sets"] == smoke_id_sets
    assert step_info["id_sets"] >= 2

    # pytest-benchmark's own loader and compare CLI read the document
    storage = FileStorage(tmp_path / "storage", logger=logging.getLogger("pb"))
    loaded = list(storage.load_benchmarks(str(out_json)))
    assert sorted(b["name"] for b in loaded) == sorted(f"test_case[{c}]" for c in benches)
    assert all(b["rounds"] == 3 and b["median"] > 0 for b in loaded)
    cmp = subprocess.run([sys.executable, "-m", "pytest_benchmark", "compare", str(out_json),
                          "--group-by=group", "--columns=min,median"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert cmp.returncode == 0, cmp.stdout + cmp.stderr
    for cid in benches:
        assert cid in cmp.stdout
    assert "smoke/lookup" in cmp.stdout and "smoke/step" in cmp.stdout


@pytest.mark.slow  # pytest suites/ in a new interpreter: a suite's cases run end to end
def test_invalid_case_fails_and_skip_case_skips(tmp_path):
    suite = tmp_path / "mini.toml"
    suite.write_text(
        '[suite]\ndescription = "pytest-suites test"\n'
        '[suite.timing]\nwarmup_ms = 0\nmin_samples = 2\nmax_samples = 3\nmin_time_s = 0.0\nmax_time_s = 0.1\n'
        "[defaults]\nvocab_size = 512\ndim = 32\nnum_heads = 2\nnum_tokens = 4\ndtype = \"fp16\"\n"
        '[[group]]\nname = "wrong"\nimpl = "tests.plugin_backends:WrongRowsBackend"\n'
        '[[group]]\nname = "right"\nimpl = "device"\ngraph = ["eager", "full"]\n'
    )
    out_json = tmp_path / "bench.json"
    proc = _pytest("suites/", "-q", "-rs", "--ple-suite", str(suite), "--ple-rounds", "2",
                   f"--benchmark-json={out_json}")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(r"\b1 failed, 1 passed, 1 skipped\b", proc.stdout), proc.stdout
    assert "invalid (wrong result, not timed)" in proc.stdout and "differ from the reference" in proc.stdout
    assert re.search(r"SKIPPED \[1\] .*graph=full needs CUDA", proc.stdout), proc.stdout
    doc = json.loads(out_json.read_text())
    assert [b["extra_info"]["impl"] for b in doc["benchmarks"]] == ["device"]  # only the valid case is timed
    assert doc["benchmarks"][0]["group"] == "mini/lookup"


def test_suites_collected_only_when_named():
    # `pytest suites/` collects one test per smoke case (CPU default), ids = case_id
    proc = _pytest("suites/", "--collect-only", "-q")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ids = re.findall(r"test_case\[(.+?)\]", proc.stdout)
    assert sorted(ids) == sorted(SMOKE)
    # the repository's plain `pytest` (testpaths = tests) does not go into suites/; the test files
    # of tests/ but this one's initial are left out, so that the check does not import them all
    # (suites/ is outside the pattern, so a plain pytest that went there would still collect it)
    plain = _pytest("--collect-only", "-q", f"--ignore-glob={REPO / 'tests'}/test_[!p]*.py")
    assert "tests/test_pytest_suites.py::" in plain.stdout, plain.stdout[-2000:]
    assert "suites/" not in plain.stdout
    # the suite loader sees only the TOML files next to conftest.py
    names = {s.name for s in list_suites()}
    assert "smoke" in names and not names & {"conftest", "test_suite_cases"}
