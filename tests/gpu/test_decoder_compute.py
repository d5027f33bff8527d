"""The decoder compute (ple_bench/compute.py) in the decode step on a CUDA GPU, at Qwen3-8B's
shape: captured as one full graph and in a breakable graph around a prefetched lookup, replayed
with fresh ids it passes the step's check (embeddings bit-exact, output = the layers + the
consumer), its output is finite; measured through run_step_case it is memory-bound: its HBM
bandwidth is more than 20 % of the run's device-copy ceiling at 256 tokens, context 4096, and at
most the run's read-only HBM ceiling (ple_bench/measure/hbm_read.py), whose kernel reads every byte.

``python -m pytest -m gpu tests/gpu/test_decoder_compute.py``; skipped with the reason elsewhere."""

from __future__ import annotations

import math

import pytest
import torch

from ple_bench import record
from ple_bench.spec.case import Case
from ple_bench.run.step import DecodeStep, check_step, run_step_case
from tests.gpu.test_graphs_gpu import DIM, DEV, HEADS, TOKENS, make_backend, random_ids

pytestmark = pytest.mark.gpu

VOCAB, SEED = 1 << 20, 2025
DECODER = dict(compute="decoder", decoder_shape="qwen3-8b", decoder_layers=2, context_len=4096)


@pytest.mark.parametrize("impl,prefetch,mode", [("device", False, "full"), ("pinned_uva", True, "full"),
                                                ("pinned_uva", True, "breakable")])
def test_decoder_step_captures_replays_and_checks(impl, prefetch, mode):
    backend = make_backend(impl, VOCAB, SEED)
    step = DecodeStep(backend, hidden=4096, num_tokens=TOKENS, prefetch=prefetch, graph=mode, device=DEV,
                      **DECODER)
    gen = torch.Generator(device=DEV).manual_seed(3)
    sets = [random_ids(VOCAB, gen) for _ in range(3)]
    check_step(step, sets, SEED)  # captures; each id set: poisoned outputs, replay, compare
    graph = step.graphs[("step", mode)]
    if mode == "full":
        assert len(graph.segments) == 1 and graph.eager_calls == []
    else:
        assert [c.fn.__func__.__name__ for c in graph.eager_calls] == ["start_prefetch", "finalize"]
    for ids in sets:
        step.set_inputs(ids)
        out = step.run()
        torch.cuda.synchronize(DEV)
        assert bool(torch.isfinite(out).all())
    step.close()
    backend.close()


def test_decoder_step_is_memory_bound_against_the_d2d_ceiling():
    from ple_bench.measure import TimingPolicy
    from ple_bench.measure.ceilings import measure_ceilings

    ceilings = measure_ceilings(DEV, budget_s=2.0, pinned_table_bytes=256 << 20)
    policy = TimingPolicy(warmup_ms=20.0, min_samples=10, max_samples=200, min_time_s=0.1, max_time_s=0.5,
                          max_noise=0.02, cold_l2=False, hot=False, graph=False)
    gen = torch.Generator(device=DEV).manual_seed(4)
    id_sets = torch.stack([random_ids(VOCAB, gen) for _ in range(4)])
    for impl, prefetch in (("device", False), ("pinned_uva", True)):
        backend = make_backend(impl, VOCAB, SEED)
        case = Case(kind="step", impl=impl, vocab_size=VOCAB, dim=DIM, dtype="fp8", num_heads=HEADS,
                    num_tokens=TOKENS, prefetch=prefetch, graph="breakable", **DECODER)
        rec = run_step_case(case, backend, id_sets, None, policy, DEV, table_seed=SEED)
        backend.close()
        rec.update(case.axes(), status="ok", mode="gpu")
        record.derive(rec, ceilings)
        for key in ("step_ms", "compute_ms", "full_step_ms", "compute_in_step_ms", "compute_region_alone_ms",
                    "compute_slowdown"):
            assert rec[key] is not None and math.isfinite(rec[key]), (impl, key, rec[key])
        # 2 layers x (0.39 GB of weights + 4.3 GB of KV cache) per step
        assert rec["compute_bytes"] > 9e9
        assert rec["compute_pct_of_d2d"] > 20, (impl, rec["compute_hbm_gbps"], ceilings["d2d_gbps"])
        # the read-only ceiling of the same run bounds what the layers read (a ceiling below it is wrong)
        assert ceilings["hbm_read_gbps"] >= rec["compute_hbm_gbps"], (impl, ceilings, rec["compute_hbm_gbps"])
        assert 0 < rec["compute_pct_of_hbm_read"] <= 100, (impl, rec["compute_pct_of_hbm_read"])
        print(f"{impl}: compute {rec['compute_ms']:.3f} ms, {rec['compute_hbm_gbps']:.0f} GB/s = "
              f"{rec['compute_pct_of_d2d']:.0f} % of d2d {ceilings['d2d_gbps']:.0f} GB/s, "
              f"{rec['compute_pct_of_hbm_read']:.0f} % of the HBM read ceiling {ceilings['hbm_read_gbps']:.0f} GB/s "
              f"(torch.sum {ceilings['hbm_read_gbps_torch_sum']:.0f}, Triton {ceilings['hbm_read_gbps_triton_stream']:.0f}); step {rec['step_ms']:.3f} "
              f"ms, full graph {rec['full_step_ms']:.3f} ms, slowdown {rec['compute_slowdown']:+.3f}")


def test_the_hbm_read_ceiling_reads_every_byte_and_beats_a_copy():
    """The read kernel reaches every element of a device buffer; reading alone moves at least the
    bytes per second a device copy reads (half of d2d_gbps, which counts read + write)."""
    from ple_bench.measure.ceilings import measure_ceilings
    from ple_bench.measure.hbm_read import BLOCK, check_stream_read

    gen = torch.Generator(device=DEV).manual_seed(6)
    assert check_stream_read(torch.randn(1000 * BLOCK + 17, generator=gen, device=DEV))
    ceilings = measure_ceilings(DEV, budget_s=2.0, pinned_table_bytes=256 << 20)
    assert not [k for k in ceilings if k.startswith("hbm_read_error")], ceilings  # both read kernels ran
    assert ceilings["hbm_read_bytes"] >= 256 << 20
    assert ceilings["hbm_read_gbps"] >= ceilings["d2d_gbps"] / 2, ceilings
    print(f"HBM read {ceilings['hbm_read_gbps']:.0f} GB/s (torch.sum {ceilings['hbm_read_gbps_torch_sum']:.0f}, "
          f"Triton {ceilings['hbm_read_gbps_triton_stream']:.0f}) vs d2d {ceilings['d2d_gbps']:.0f} GB/s")
