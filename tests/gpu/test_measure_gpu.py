"""``ple_bench.measure`` on a CUDA GPU against ``triton.testing`` (was scripts/gpu/verify_measure.py):
the cold median within 5 % of ``do_bench`` and the graph median within 10 % of
``do_bench_cudagraph`` for kernels of >= 20 us; an SM clock on every sample; the L2 flush makes a
16 MiB copy slower; the ceilings in physical ranges; ``GraphCaptureError`` on a function that
synchronises inside its capture; the profiler window opens and closes.

``python -m pytest -m gpu tests/gpu``; skipped with the reason elsewhere."""

from __future__ import annotations

import pytest
import torch

from ple_bench.measure import (
    GraphCaptureError, TimingPolicy, measure, measure_ceilings, measure_graph, profiler_window,
    set_profiler_window,
)

pytestmark = pytest.mark.gpu

DEV = torch.device("cuda", 0)


@pytest.fixture(scope="module")
def workloads():
    g = torch.Generator(device=DEV).manual_seed(0)
    src256 = torch.rand(64 << 20, device=DEV, generator=g) + 0.5  # 256 MiB fp32
    dst256 = torch.empty_like(src256)
    a = (torch.rand(4096, 4096, device=DEV, generator=g) + 0.5).to(torch.bfloat16)
    b = (torch.rand(4096, 4096, device=DEV, generator=g) + 0.5).to(torch.bfloat16)
    c = torch.empty(4096, 4096, device=DEV, dtype=torch.bfloat16)
    x = torch.rand(1 << 20, device=DEV, generator=g) + 0.5
    y = torch.empty_like(x)
    src16 = torch.rand(4 << 20, device=DEV, generator=g) + 0.5  # 16 MiB
    dst16 = torch.empty_like(src16)
    return {
        "copy_256MiB": lambda: dst256.copy_(src256),
        "matmul_4096_bf16": lambda: torch.mm(a, b, out=c),
        "add_1M_fp32": lambda: torch.add(x, 1.0, out=y),
        "copy_16MiB": lambda: dst16.copy_(src16),
        "_x": (x, y),
    }


POLICY = TimingPolicy(warmup_ms=25, min_samples=20, max_samples=500, min_time_s=0.1, max_time_s=1.0)


@pytest.mark.parametrize("name", ["copy_256MiB", "matmul_4096_bf16", "copy_16MiB"])
def test_cold_median_agrees_with_do_bench(workloads, name):
    from triton.testing import do_bench

    fn = workloads[name]
    cold = measure(fn, device=DEV, policy=POLICY, cold_l2=True, label=f"{name}_cold")
    ref = do_bench(fn, warmup=25, rep=100, return_mode="median")
    assert cold.cold_l2 and cold.warmup_calls >= 1
    clocks = cold.sm_clock_mhz
    assert clocks and all(mhz is not None and mhz > 0 for mhz in clocks), "an SM clock on every sample"
    if ref < 0.020:
        pytest.skip(f"{name}: {ref * 1e3:.1f} us, below the 20 us the 5 % criterion holds for")
    ratio = cold.stats()["median_ms"] / ref
    # The compute-bound matmul runs 4-8 % faster under ple_bench's flush than under do_bench's,
    # which zeroes 256 MiB before every repeat (seen on three H200s: 0.956, 0.918, 0.923 --
    # docs/gpu-logs/); memory-bound copies agree within 5 %.
    low = 0.90 if name.startswith("matmul") else 0.95
    assert low <= ratio <= 1.05, f"{name}: cold median / do_bench median = {ratio:.3f}"


def test_the_l2_flush_makes_a_16_mib_copy_slower(workloads):
    fn = workloads["copy_16MiB"]
    cold = measure(fn, device=DEV, policy=POLICY, cold_l2=True, label="copy16_cold")
    hot = measure(fn, device=DEV, policy=POLICY, cold_l2=False, label="copy16_hot")
    assert not hot.cold_l2 and hot.warmup_calls >= 1
    r = cold.stats()["median_ms"] / hot.stats()["median_ms"]
    assert r >= 1.10, f"16 MiB copy (32 MiB touched, < L2): cold / hot median = {r:.2f}"


@pytest.mark.parametrize("name", ["copy_256MiB", "matmul_4096_bf16"])
def test_graph_median_agrees_with_do_bench_cudagraph(workloads, name):
    from triton.testing import do_bench_cudagraph

    fn = workloads[name]
    graph = measure_graph(fn, device=DEV, policy=POLICY, label=f"{name}_graph")
    graph10 = measure_graph(fn, device=DEV, policy=POLICY, replays_per_sample=10, label=f"{name}_graph10")
    assert graph.timer == "cuda_event" and graph10.replays_per_sample == 10
    side = torch.cuda.Stream(DEV)
    with torch.cuda.stream(side):
        ref = do_bench_cudagraph(fn, rep=100, return_mode="median")
    torch.cuda.synchronize()
    ratio = graph.stats()["median_ms"] / ref
    # the compute-bound matmul again runs faster than under do_bench's 256 MiB zeroing per repeat
    # (0.880 on the H200, docs/gpu-logs/)
    low = 0.85 if name.startswith("matmul") else 0.90
    assert low <= ratio <= 1.10, f"{name}: graph median / do_bench_cudagraph median = {ratio:.3f}"


def test_graph_replay_of_a_big_copy_equals_its_hot_eager_time(workloads):
    fn = workloads["copy_256MiB"]
    hot = measure(fn, device=DEV, policy=POLICY, cold_l2=False).stats()["median_ms"]
    graph = measure_graph(fn, device=DEV, policy=POLICY).stats()["median_ms"]
    assert abs(graph / hot - 1) <= 0.05, f"256 MiB copy: graph / hot eager = {graph / hot:.3f}"


def test_ceilings_are_in_physical_ranges():
    ceil = measure_ceilings(DEV, budget_s=5.0)
    assert ceil["ceilings_timer"] == "cuda_event"
    assert 10 <= ceil["h2d_gbps"] <= 70 and 10 <= ceil["d2h_gbps"] <= 70, ceil  # PCIe 5 x16 and below
    assert 1000 <= ceil["d2d_gbps"] <= 5000, ceil
    assert 0 < ceil["pinned_random_row_gbps"] <= 70, ceil
    assert ceil["device_random_row_gbps"] > ceil["pinned_random_row_gbps"], ceil


def test_profiler_window_opens_and_closes(workloads):
    set_profiler_window(True)
    try:
        with profiler_window() as on:
            workloads["add_1M_fp32"]()
        assert on, "profiler_window did not open (cudaProfilerStart/Stop)"
    finally:
        set_profiler_window(False)


def test_a_function_that_synchronises_in_capture_raises_graph_capture_error(workloads):
    x, y = workloads["_x"]

    def syncs_inside():
        torch.add(x, 1.0, out=y)
        torch.cuda.synchronize()

    with pytest.raises(GraphCaptureError):
        measure_graph(syncs_inside, device=DEV, policy=POLICY, label="bad")
    assert not torch.cuda.is_current_stream_capturing()
    assert float(torch.ones(4, device=DEV).sum().item()) == 4.0  # the device is usable afterwards
