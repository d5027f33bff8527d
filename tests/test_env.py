"""One environment policy for every entry point (ple_bench/env.py): PLE_BENCH_FORCE_CPU hides a
GPU from the CLI, the workers, the torchrun path, the pytest suites and the NCCL/gloo choice; the
launcher is detected in one place."""

from __future__ import annotations

import torch

from ple_bench import env


def test_forced_cpu_hides_a_gpu_everywhere(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.delenv(env.FORCE_CPU_ENV, raising=False)
    assert env.gpu_available() and env.gpu_count() == 4
    assert env.device_for(5) == torch.device("cuda", 1) and env.device_for(5, local_rank=3) == torch.device("cuda", 3)
    monkeypatch.setenv(env.FORCE_CPU_ENV, "1")
    assert not env.gpu_available() and env.gpu_count() == 0 and env.device_for(5) == torch.device("cpu")
    # the entry points ask the same policy
    from ple_bench.commands import run as run_command
    from ple_bench.run import dispatch, provenance
    from suites import conftest

    assert not run_command._has_gpu() and dispatch.gpu_count() == 0 and not conftest.has_gpu()
    assert provenance.base_meta(type("S", (), {"name": "s", "path": "s.toml"})(), "functional")["gpu_count"] == 0


def test_launcher_detection(monkeypatch):
    for var in ("TORCHELASTIC_RUN_ID", env.IN_PROCESS_ENV, "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert env.launcher() == "self" and env.external_world_size() is None
    monkeypatch.setenv(env.IN_PROCESS_ENV, "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert env.launcher() == "in_process" and env.external_world_size() == 2
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    assert env.launcher() == "torchrun"
    from ple_bench.run.provenance import launch_info

    assert launch_info([])["launcher"] == "torchrun"
