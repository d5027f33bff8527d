"""The CLI end to end on a CPU-only machine: run, resume, interruption, bad suites, list, env,
profile --dry-run.  Failure isolation (wrong rows, a raising lookup, a killed, poisoned or hung
worker, each between good cases) is tests/test_fault_matrix.py's one run."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ple_bench import results
from tests._cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
AXES = ("impl", "vocab_size", "dim", "dtype", "num_heads", "num_tokens", "tp", "etp", "dp", "prefetch",
        "graph", "ids")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PLE_BENCH_FORCE_CPU"] = "1"
    return env


def cli(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ple_bench", *args], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=timeout, **kw)


def verb(*args: str):
    """A verb called in this process, CPU forced as in :func:`cli`: for what the verb does, not
    the process (exit codes, output); a new interpreter costs a torch import (2-5 s of CPU)."""
    return run_cli(*args, cpu=True)


def _only_run(results_dir: Path) -> Path:
    runs = list(results.iter_run_dirs(results_dir))
    assert len(runs) == 1, runs
    return runs[0]


def run_suite_text(tmp_path: Path, text: str) -> tuple[Path, dict]:
    """``python -m ple_bench run`` of a suite given as TOML text (no report); its one run
    folder and its ``meta.json``."""
    import json

    path = tmp_path / "suite.toml"
    path.write_text(text)
    res = tmp_path / "results"
    proc = cli("run", "--suite", str(path), "--results-dir", str(res), "--no-report")
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_dir = Path(_only_run(res))
    return run_dir, json.loads((run_dir / "meta.json").read_text())


def run_suite_records(tmp_path: Path, text: str) -> list[dict]:
    """The records of ``python -m ple_bench run`` of a suite given as TOML text (no report)."""
    import json

    run_dir, _ = run_suite_text(tmp_path, text)
    lines = (run_dir / "records.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


SUITE = """
[suite]
description = "test suite"
[suite.timing]
warmup_ms = 0
min_samples = 3
max_samples = 5
max_time_s = 0.2
[defaults]
vocab_size = 512
dim = 16
num_heads = 2
num_tokens = 4
[[group]]
name = "g"
impl = {impls}
dtype = {dtypes}
"""


def write_suite(tmp_path: Path, impls, dtypes=("bf16",), name="t") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(SUITE.format(impls=json.dumps(list(impls)), dtypes=json.dumps(list(dtypes))))
    return path


def test_bad_suite_exit_2_and_nothing_runs(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[suite]\ndescription="x"\n[[group]]\nimpl="device"\ndtype="fp7"\n')
    proc = verb("run", "--suite", str(bad), "--results-dir", str(tmp_path / "res"))
    assert proc.returncode == 2
    assert "bad.toml" in proc.stderr and "dtype" in proc.stderr and "fp8" in proc.stderr
    assert not (tmp_path / "res").exists()
    proc = verb("run", "--suite", "no_such_suite", "--results-dir", str(tmp_path / "res"))
    assert proc.returncode == 2 and not (tmp_path / "res").exists()


@pytest.mark.parametrize("impl, why", [
    ("tests.plugin_backends:NotABackend", "not a subclass of ple_bench.backends.PLEEmbedding"),
    ("tests.no_such_module:Backend", "cannot import backend module 'tests.no_such_module'"),
])
def test_bad_impl_import_path_exits_2_before_running(tmp_path, impl, why):
    """A plug-in backend that does not load is bad input (exit 2 at suite load, naming the group
    and the path), not a case recorded "skipped" in a run that exits 0."""
    suite = write_suite(tmp_path, ["device", impl])
    proc = verb("run", "--suite", str(suite), "--results-dir", str(tmp_path / "res"), "--no-report")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"{suite}: [[group]] #1 ('g'): key 'impl'" in proc.stderr
    assert repr(impl) in proc.stderr and why in proc.stderr
    assert not (tmp_path / "res").exists()  # nothing ran, not even the good impl
    proc = verb("list", "--suite", str(suite))
    assert proc.returncode == 2 and repr(impl) in proc.stderr


@pytest.mark.slow  # python -m ple_bench run of a suite: a new interpreter and its worker processes
def test_resume_runs_only_missing_cases(tmp_path):
    suite = write_suite(tmp_path, ["device"], dtypes=["fp32", "bf16", "fp8"])
    res = tmp_path / "res"
    assert cli("run", "--suite", str(suite), "--results-dir", str(res), "--no-report").returncode == 0
    run_dir = _only_run(res)
    lines = (run_dir / "records.jsonl").read_text().splitlines()
    assert len(lines) == 3
    (run_dir / "records.jsonl").write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])  # torn write
    proc = cli("run", "--resume", str(run_dir), "--no-report")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "2 to run" in proc.stderr
    recs = results.load_records(run_dir)
    assert len(recs) == 3 and all(r["status"] == "ok" for r in recs)
    assert json.loads(lines[0]) in recs  # the first record was kept as it was
    # an archived copy (records.jsonl.gz, as in docs/runs/) loads to the same records
    import gzip

    packed = tmp_path / "archived"
    packed.mkdir()
    (packed / "meta.json").write_text((run_dir / "meta.json").read_text())
    (packed / "records.jsonl.gz").write_bytes(gzip.compress((run_dir / "records.jsonl").read_bytes()))
    assert sorted(results.load(packed)["case_id"]) == sorted(r["case_id"] for r in recs)


@pytest.mark.slow  # python -m ple_bench run of a suite: a new interpreter and its worker processes
def test_ctrl_c_keeps_results(tmp_path):
    suite = tmp_path / "slow.toml"
    # 64 cases on 8 tables (a table is reused across token counts): the run lasts far longer than
    # the moment its first record appears
    suite.write_text(SUITE.format(impls='["device"]', dtypes='["fp32"]').replace(
        "num_tokens = 4", "num_tokens = [1, 2, 3, 4, 5, 6, 7, 8]").replace(
        "vocab_size = 512", "vocab_size = [512, 576, 640, 704, 768, 832, 896, 960]"))
    res = tmp_path / "res"
    proc = subprocess.Popen([sys.executable, "-m", "ple_bench", "run", "--suite", str(suite), "--results-dir",
                             str(res), "--no-report"], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            # a run from a shell's background job inherits SIGINT ignored, and
                            # Python then installs no KeyboardInterrupt: give the run Ctrl-C back
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    records = None
    while time.monotonic() < deadline:
        found = list(res.glob("*/records.jsonl"))
        if found and found[0].read_text().count("\n") >= 1:
            records = found[0]
            break
        time.sleep(0.1)
    assert records is not None, "no record appeared"
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    run_dir = records.parent
    meta = results.load_meta(run_dir)
    assert meta["status"] == "interrupted"
    recs = results.load_records(run_dir)
    assert 1 <= len(recs) < 64 and all(r["status"] == "ok" for r in recs)
    # the run says what it did not reach, where, and how to continue
    missing = meta["not_reached"]["g"]
    assert meta["cases_recorded"] == len(recs) and len(missing) == 64 - len(recs)
    assert not {r["case_id"] for r in recs} & set(missing)
    assert f"{len(recs)} of 64 cases recorded" in out
    assert f"not reached ({64 - len(recs)}):" in out and missing[0] in out
    command = f"continue with: {sys.executable} -m ple_bench run --resume {run_dir} --no-report"
    assert command in out and command in err


@pytest.mark.slow  # python -m ple_bench run of a suite: a new interpreter and its worker processes
def test_one_line_per_case_off_a_terminal_and_skips_in_the_summary(tmp_path):
    """Captured (not a terminal), the run prints one line per case -- no progress-bar frames --
    and its summary lists every skip with its reason."""
    path = tmp_path / "suite.toml"
    path.write_text(SUITE.format(impls='["device"]', dtypes='["fp32", "bf16"]') + """
[[group]]
name = "full graph"
kind = "step"
impl = "device"
graph = "full"
""")
    proc = cli("run", "--suite", str(path), "--results-dir", str(tmp_path / "res"), "--no-report")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "\r" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("[")]
    assert len(lines) == 3, proc.stderr
    recs = {r["case_id"]: r for r in results.load_records(_only_run(tmp_path / "res"))}
    skipped = next(r for r in recs.values() if r["status"] == "skipped")
    for line in lines:
        case_id = next(c for c in recs if c in line)
        rec = recs[case_id]
        if rec["status"] == "ok":
            assert line.split()[1] == "ok" and f"{rec['median_ms']:.4f} ms" in line
        else:
            assert line.split()[1] == "skipped" and line.endswith(f"{case_id}: {rec['reason']}")
    assert "3 of 3 cases recorded: 2 ok, 1 skipped" in proc.stdout
    assert f"1 x {skipped['reason']}: {skipped['case_id']}" in proc.stdout


def _interrupt(args: list[str], ready, timeout: float = 180) -> tuple[int, str, str]:
    """Start ``python -m ple_bench ARGS`` with Ctrl-C given back (see the test above), send the
    process group SIGINT once ``ready()`` holds; its exit code, stdout and stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "ple_bench", *args], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + timeout
    while not ready() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert proc.poll() is None, "it ended before it could be interrupted"
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def test_advise_without_a_gpu_refuses_in_seconds(tmp_path):
    res = tmp_path / "res"
    started = time.monotonic()
    proc = verb("advise", "--table-bytes", "47.7GiB", "--dim", "160", "--dtype", "fp8", "--heads", "16",
               "--tokens", "64,256,512", "--compute-us", "100", "--results-dir", str(res))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "no CUDA GPU" in proc.stderr and "--runs RUN_DIR" in proc.stderr
    assert re.search(r"--functional-check runs its \d+ cases", proc.stderr) and "Traceback" not in proc.stderr
    assert not res.exists() and time.monotonic() - started < 60


@pytest.mark.slow  # python -m ple_bench advise --functional-check: a new interpreter and its self-run
def test_ctrl_c_in_advise_exits_130_without_resume_advice(tmp_path):
    res = tmp_path / "res"
    rc, out, err = _interrupt(["advise", "--table-bytes", "1MiB", "--dim", "16", "--dtype", "bf16", "--heads", "1",
                               "--tokens", "8", "--compute-us", "10", "--results-dir", str(res),
                               "--functional-check"], lambda: bool(list(res.glob("*/meta.json"))))
    assert rc == 130, err[-2000:]
    assert "--resume" not in err + out and "nothing ranked" in err and "Traceback" not in err


@pytest.mark.slow  # python -m ple_bench profile: a new interpreter, the run it starts and its worker
def test_ctrl_c_in_profile_exits_130(tmp_path):
    from ple_bench.spec.suite import load_suite

    case = next(c for c in load_suite("smoke").cases if c.impl == "device")
    res = tmp_path / "res"
    rc, out, err = _interrupt(["profile", "--suite", "smoke", "--case", case.case_id, "--tool", "torch",
                               "--results-dir", str(res)], lambda: bool(list(res.glob("*/meta.json"))))
    assert rc == 130, err[-2000:]
    assert "Traceback" not in err


def test_list_json_and_table():
    proc = verb("list", "--suite", "smoke", "--json")
    assert proc.returncode == 0
    objs = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(objs) > 10 and all("case_id" in o and "impl" in o and "dtype" in o for o in objs)
    assert len({o["case_id"] for o in objs}) == len(objs)
    proc = verb("list")
    assert proc.returncode == 0 and "smoke" in proc.stdout and "default" in proc.stdout


def test_list_suite_is_narrow_by_default_and_wide_on_request():
    from ple_bench.spec.suite import load_suite

    suite = load_suite("default")
    narrow = verb("list", "--suite", "default")
    assert narrow.returncode == 0
    # 100 columns, but for a case id longer than 94 characters beside its index (the flag path in four
    # pieces on the production table: 96, the id faster_than_hbm gives it too)
    ids = {c.case_id for c in suite.cases}
    assert all(len(line) <= 100 or line.split()[-1] in ids for line in narrow.stdout.splitlines())
    assert max(map(len, narrow.stdout.splitlines())) <= 5 + max(map(len, ids))
    listed = [c.case_id for c in suite.cases if c.case_id in narrow.stdout]
    assert len(listed) == len(suite.cases)
    for group in suite.groups:  # each group headed by its name and the axes that vary in it
        assert f"[{group.name}] {len(group.case_ids)} case" in narrow.stdout
    assert "[vocab sweep] 36 cases, varying impl, vocab_size, num_tokens, prefetch" in narrow.stdout
    wide = verb("list", "--suite", "default", "--wide")
    header = next(line for line in wide.stdout.splitlines() if line.lstrip().startswith("#  case_id"))
    assert "host_alloc" in header.split() and "gather_threads" in header.split()
    assert max(map(len, wide.stdout.splitlines())) > 100


def test_env_reports_no_gpu():
    proc = verb("env")
    assert proc.returncode == 0
    assert "GPU" in proc.stdout and "UVA" in proc.stdout and "NVTX" in proc.stdout


def test_profile_dry_run_builds_commands():
    from ple_bench.spec.suite import load_suite

    case = next(c for c in load_suite("smoke").cases if c.impl == "pinned_uva")
    proc = verb("profile", "--suite", "smoke", "--case", case.case_id, "--tool", "ncu", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "ncu --clock-control none --nvtx --nvtx-include" in proc.stdout
    assert "--profile-from-start off" in proc.stdout and case.case_id in proc.stdout
    proc = verb("profile", "--suite", "smoke", "--case", case.case_id, "--tool", "nsys", "--dry-run")
    assert proc.returncode == 0
    assert "nsys profile" in proc.stdout and "--capture-range cudaProfilerApi" in proc.stdout
    proc = verb("profile", "--suite", "smoke", "--case", "lookup.*", "--tool", "ncu", "--dry-run")
    assert proc.returncode == 2 and "exactly one" in proc.stderr
    proc = verb("profile", "--suite", "smoke", "--case", case.case_id, "--tool", "ncu", "--dry-run",
               "--metrics", "gpu__time_duration.sum")
    assert proc.returncode == 0 and "--metrics gpu__time_duration.sum" in proc.stdout
    proc = verb("profile", "--suite", "smoke", "--case", case.case_id, "--tool", "nsys", "--dry-run",
               "--metrics", "gpu__time_duration.sum")
    assert proc.returncode == 2 and "ncu options" in proc.stderr
    proc = verb("profile", "--suite", "smoke", "--case", case.case_id, "--tool", "ncu", "--dry-run",
               "--cache-control", "none")
    assert proc.returncode == 0 and "--cache-control none" in proc.stdout


def test_a_reader_that_stops_early_gets_no_traceback():
    """``list --json | head -1``: the CLI stops quietly when its reader goes away."""
    import subprocess

    proc = subprocess.Popen([sys.executable, "-m", "ple_bench", "list", "--suite", "default", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=Path(__file__).resolve().parents[1])
    first = proc.stdout.readline()
    proc.stdout.close()  # the reader goes away after one line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0
    assert first.startswith(b'{"case_id"') and "Traceback" not in err and "BrokenPipe" not in err, err
