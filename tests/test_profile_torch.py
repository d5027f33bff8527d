"""``profile --tool torch`` / ``run --torch-trace``: a torch.profiler (Kineto) trace of
a case's measurement windows, the phases as named ranges, written as Chrome /
Perfetto trace JSON in the run folder.  On a CPU-only machine (functional mode)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
import torch

from ple_bench import annotate as annotate_mod
from ple_bench.annotate import annotate
from ple_bench.measure import TimingPolicy, measure, run_sampling
from ple_bench.measure.profiler import TorchTrace, set_torch_trace, torch_trace_case, torch_trace_window
from ple_bench.measure.stopping import SampleCount, Stopper
from ple_bench.measure.profiler import torch_trace_name
from ple_bench.spec.suite import load_suite
from tests._cli import run_cli
from tests.test_cli import cli

SAMPLES = 4


def _smoke_case(**want) -> str:
    for case in load_suite("smoke").cases:
        if all(getattr(case, k) == v for k, v in want.items()):
            return case.case_id
    raise AssertionError(f"no smoke case with {want}")


def _ranges(trace: dict) -> Counter:
    """Named ranges (record_function / annotate) of a trace, with their counts."""
    return Counter(e["name"] for e in trace["traceEvents"] if e.get("cat") == "user_annotation")


def _profile(tmp_path: Path, case_id: str) -> tuple[dict, Path, str]:
    proc = cli("profile", "--suite", "smoke", "--case", case_id, "--tool", "torch", "--samples", str(SAMPLES),
               "--results-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    printed = re.search(r"^trace: (\S+) ", proc.stdout, re.M)
    assert printed, proc.stdout
    path = Path(printed.group(1))
    assert path.name == torch_trace_name(case_id)
    assert path.parent.parent == tmp_path  # results/<run_id>/trace_<case_id>.json
    assert (path.parent / "records.jsonl").exists() and (path.parent / "meta.json").exists()
    assert "ui.perfetto.dev" in proc.stdout and "chrome://tracing" in proc.stdout
    trace = json.loads(path.read_text())
    assert isinstance(trace["traceEvents"], list) and trace["traceEvents"]
    assert path.stat().st_size < 5e6
    return trace, path, proc.stdout


@pytest.mark.slow  # python -m ple_bench profile: a new interpreter, the run it starts and its worker
def test_profile_torch_prefetch_lookup_case(tmp_path):
    case_id = _smoke_case(kind="lookup", impl="pinned_uva", prefetch=True, ids="uniform", world_size=1,
                          kernel="")
    trace, path, _ = _profile(tmp_path, case_id)
    names = _ranges(trace)
    # the phases of the measured call, as named ranges; one pair per recorded sample
    assert names["prefetch_start"] >= SAMPLES and names["prefetch_finalize"] >= SAMPLES, names
    assert names["measurement lookup"] == 1  # the CPU run measures one warm lookup
    # only the sampling window: nothing of the warm-up, the gate or the table fill
    assert not {"warmup", "table_fill", f"case {case_id}"} & set(names), names
    windows = trace["ple_bench"]["windows"]
    assert [w["label"] for w in windows] == ["lookup"] and windows[0]["samples"] == SAMPLES
    rec = json.loads((path.parent / "records.jsonl").read_text().splitlines()[0])
    assert rec["status"] == "ok" and rec["case_id"] == case_id


@pytest.fixture(scope="module")
def step_trace(tmp_path_factory) -> dict:
    """``profile --tool torch`` of the smoke suite's eager pinned_uva prefetch step (run once)."""
    case_id = _smoke_case(kind="step", impl="pinned_uva", prefetch=True, graph="eager", kernel="")
    return _profile(tmp_path_factory.mktemp("step"), case_id)[0]


@pytest.mark.slow  # reads step_trace: profile --tool torch end to end
def test_profile_torch_step_case(step_trace):
    trace = step_trace
    names = _ranges(trace)
    for phase in ("decode_step", "compute", "prefetch_start", "prefetch_finalize", "step_lookup",
                  "step_compute"):
        assert names[phase] >= 1, (phase, names)
    # the step window records exactly SAMPLES steps, however the sampler batches them
    assert names["decode_step"] == SAMPLES and names["step_lookup"] == SAMPLES
    assert {w["label"] for w in trace["ple_bench"]["windows"]} == {"step", "step_lookup", "step_compute"}
    assert "warmup" not in names


def test_profile_torch_dry_run_runs_nothing(tmp_path):
    case_id = _smoke_case(kind="lookup", impl="device", prefetch=False, dtype="bf16", ids="uniform",
                          world_size=1, kernel="")
    proc = run_cli("profile", "--suite", "smoke", "--case", case_id, "--tool", "torch", "--dry-run",
                   "--results-dir", str(tmp_path), cpu=True)
    assert proc.returncode == 0, proc.stderr
    assert "run --suite" in proc.stdout and "--torch-trace 10 --samples 10" in proc.stdout
    assert f"{tmp_path}/<run_id>/trace_{case_id}.json" in proc.stdout
    assert not list(tmp_path.iterdir())
    proc = run_cli("profile", "--suite", "smoke", "--case", case_id, "--tool", "torch", "--dry-run",
                   "--metrics", "gpu__time_duration.sum", cpu=True)
    assert proc.returncode == 2 and "ncu options" in proc.stderr


def test_run_torch_trace_rejects_zero(tmp_path):
    proc = run_cli("run", "--suite", "smoke", "--case", "lookup.device.*", "--torch-trace", "0",
                   "--results-dir", str(tmp_path), cpu=True)
    assert proc.returncode == 2 and "--torch-trace" in proc.stderr


# ---------------------------------------------------------------- in-process units
def test_annotate_emits_torch_ranges_only_while_a_window_records(tmp_path):
    from torch.profiler import ProfilerActivity, profile

    assert not annotate_mod.torch_ranges_enabled()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with annotate("outside_window"):
            torch.ones(2).sum()
    assert "outside_window" not in {e.name for e in prof.events()}  # no cost when not profiling

    pol = TimingPolicy(warmup_ms=0, min_samples=3, max_samples=3, min_time_s=0, max_time_s=5, max_noise=0,
                       cold_l2=False, hot=False, graph=False)

    def fn():
        with annotate("my_phase"):
            torch.ones(4).sum()

    out = tmp_path / "t.json"
    with torch_trace_case(out, 10):
        measure(fn, device="cpu", policy=pol, label="mine")
    assert not annotate_mod.torch_ranges_enabled()  # switched off after the window
    names = _ranges(json.loads(out.read_text()))
    assert names["my_phase"] == 3 and names["measurement mine"] == 1


def test_window_records_at_most_max_samples_and_merges_windows(tmp_path):
    calls: list[int] = []

    def take_batch(k: int):
        calls.append(k)
        for _ in range(k):
            with annotate("sample"):
                torch.ones(1).add_(1)
        return [1.0] * k, None

    out = tmp_path / "merged.json"
    with torch_trace_case(out, 5) as trace:
        for label in ("first", "second"):
            with torch_trace_window(label) as wrap:
                res = run_sampling(wrap(take_batch), Stopper([SampleCount(12)]), max_samples=12, batch_size=8)
            assert len(res.samples_ms) == 12  # the phase still takes all its samples
    assert calls == [5, 3, 4] * 2  # the batch that passes the limit is split at it
    data = json.loads(out.read_text())
    names = _ranges(data)
    assert names["sample"] == 10 and names["measurement first"] == names["measurement second"] == 1
    assert [w["samples"] for w in data["ple_bench"]["windows"]] == [5, 5]
    assert len(trace.windows) == 2
    meta = [e for e in data["traceEvents"] if e.get("ph") == "M" and e.get("name") == "process_name"]
    assert len(meta) == 1  # the second session's process metadata is not repeated


def test_no_trace_without_a_window(tmp_path):
    out = tmp_path / "none.json"
    with torch_trace_case(out, 5):
        pass
    assert not out.exists()
    assert TorchTrace(3).write(out) is None
    with torch_trace_window("off") as wrap:  # no trace collecting: the identity
        assert wrap(len) is len
    set_torch_trace(None)


def test_torch_trace_name_is_a_plain_file_name():
    assert torch_trace_name("a.b-c") == "trace_a.b-c.json"
    assert torch_trace_name("x/y:z", rank=1) == "trace_x_y_z.rank1.json"
    with pytest.raises(ValueError):
        TorchTrace(0)


# ------------------------------------------- the trace analysis of tests/gpu/test_profile_streams_gpu.py
def _check_script():
    from tests.gpu import trace_streams

    return trace_streams


def _gpu_like_trace(lookup_stream: int) -> dict:
    """A Kineto-shaped trace of one decode step: CPU ranges and launches on thread 1,
    the GPU work they became on streams, linked by correlation ids."""
    def x(cat, name, ts, dur, tid, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1 if tid == 1 else 0, "tid": tid, "ts": ts,
                "dur": dur, "args": args}
    return {"traceEvents": [
        x("user_annotation", "measurement step", 0, 1000, 1),
        x("user_annotation", "decode_step", 10, 90, 1),
        x("user_annotation", "prefetch_start", 12, 8, 1),
        x("user_annotation", "compute", 22, 38, 1),
        x("user_annotation", "prefetch_finalize", 62, 8, 1),
        x("user_annotation", "prefetch_start", 2000, 8, 1),  # outside the step window: ignored
        x("cuda_driver", "cuLaunchKernel", 15, 2, 1, correlation=1),
        x("cuda_runtime", "cudaLaunchKernel", 30, 2, 1, correlation=2),
        x("cuda_runtime", "cudaLaunchKernel", 40, 2, 1, correlation=3),
        x("cuda_runtime", "cudaMemcpyAsync", 65, 2, 1, correlation=4),
        x("cuda_driver", "cuLaunchKernel", 2003, 2, 1, correlation=5),
        x("kernel", "ple_lookup_row_per_program", 100, 50, lookup_stream, correlation=1, stream=lookup_stream),
        x("kernel", "sm90_xmma_gemm_bf16", 110, 20, 7, correlation=2, stream=7),
        x("kernel", "sm90_xmma_gemm_bf16", 130, 20, 7, correlation=3, stream=7),
        x("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 160, 5, 7, correlation=4, stream=7),
        x("kernel", "ple_lookup_row_per_program", 3000, 50, 99, correlation=5, stream=99),
    ]}


def test_trace_check_follows_launches_to_their_streams():
    mod = _check_script()
    res = mod.analyse(_gpu_like_trace(lookup_stream=20))
    assert res["steps"] == 1 and res["has_kernels"]
    assert res["lookup_streams"] == [20] and res["lookup_names"] == ["ple_lookup_row_per_program"]
    assert res["compute_streams"] == [7]
    assert res["phases"]["prefetch_finalize"] == {(7, "gpu_memcpy", "Memcpy DtoD (Device -> Device)"): 1}
    assert res["overlap"] == pytest.approx(0.8)  # 40 of the lookup's 50 us beside the matmuls
    same = mod.analyse(_gpu_like_trace(lookup_stream=7))
    assert set(same["lookup_streams"]) & set(same["compute_streams"])  # check 2 would FAIL


@pytest.mark.slow  # reads step_trace: profile --tool torch end to end
def test_trace_check_on_a_cpu_trace_finds_no_gpu_work(step_trace):
    mod = _check_script()
    res = mod.analyse(step_trace)
    assert res["steps"] == SAMPLES and not res["has_kernels"] and not res["lookup_streams"]
    assert set(mod.PHASES) <= set(res["range_names"])


@pytest.mark.slow  # python -m ple_bench run: a new interpreter and two worker ranks
def test_run_torch_trace_writes_one_trace_per_rank(tmp_path):
    case_id = _smoke_case(kind="lookup", impl="pinned_uva", prefetch=True, tp=1, etp=2, dp=2)
    proc = cli("run", "--suite", "smoke", "--case", case_id, "--torch-trace", "3", "--no-report",
               "--no-progress", "--results-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    for rank in (0, 1):
        trace = json.loads((run_dir / torch_trace_name(case_id, rank)).read_text())
        names = _ranges(trace)
        assert names["prefetch_start"] == 3 and names["gather_ids"] >= 3, (rank, names)
        assert {w["label"] for w in trace["ple_bench"]["windows"]} >= {"lookup", "gather"}


def test_a_failing_phase_keeps_its_window_and_stops_the_profiler(tmp_path):
    def take_batch(k: int):
        with annotate("before_error"):
            torch.ones(1).add_(1)
        raise RuntimeError("boom")

    out = tmp_path / "failed.json"
    with pytest.raises(RuntimeError, match="boom"):
        with torch_trace_case(out, 5):
            with torch_trace_window("failing") as wrap:
                run_sampling(wrap(take_batch), Stopper([SampleCount(3)]), max_samples=3)
    assert not annotate_mod.torch_ranges_enabled()
    assert _ranges(json.loads(out.read_text()))["before_error"] == 1
    with torch_trace_case(tmp_path / "next.json", 2):  # the profiler was stopped: a new session starts
        with torch_trace_window("next") as wrap:
            run_sampling(wrap(lambda k: ([1.0] * k, None)), Stopper([SampleCount(2)]), max_samples=2)
    assert (tmp_path / "next.json").exists()
