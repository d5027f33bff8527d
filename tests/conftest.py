"""Shared pytest setup: the repository root on ``sys.path`` (so ``tests.*``
modules, e.g. a backend given by import path, and ``ple_bench`` import without
an install), a fixed torch seed per test, and the ``gpu`` marker's skip where
``ple_bench.env`` says there is no usable GPU (none, or ``PLE_BENCH_FORCE_CPU``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


def pytest_collection_modifyitems(config, items):
    from ple_bench import env

    if env.gpu_available():  # the one environment policy: PLE_BENCH_FORCE_CPU counts as no GPU
        return
    why = f"{env.FORCE_CPU_ENV} is set" if env.force_cpu() else "this machine has none"
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU ({why})")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed_torch():
    torch.manual_seed(1234)
    yield
