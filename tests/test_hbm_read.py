"""The read-only HBM ceiling (ple_bench/measure/hbm_read.py) on the CPU: its Triton kernel (under
the interpreter) loads every element, the last partial block's too, and writes nothing on the
ceiling's buffer; the ceiling is the faster of its kernels, bytes read only; a decoder step's
memory-bound share is held against it (record.derive), never in functional mode.  On the GPU:
tests/gpu/test_decoder_compute.py (the ceiling is at least the decoder's own read rate)."""

from __future__ import annotations

import pytest
import torch

from ple_bench import record
from ple_bench.measure.hbm_read import BLOCK, check_stream_read, measure_hbm_read, read_kernels, stream_read


def test_the_stream_kernel_loads_every_element():
    gen = torch.Generator().manual_seed(5)
    buf = torch.randn(3 * BLOCK + 17, generator=gen)  # a partial last block
    assert (buf < 0).sum() > 0 and buf[-1] != 0
    assert check_stream_read(buf)
    buf[-1] = -7.0  # the very last element, in the partial block
    x = buf.clone()
    stream_read(x)
    assert x[-1] == 7.0 and torch.equal(x, buf.abs())


def test_the_ceiling_buffer_is_not_written():
    buf = torch.full((2 * BLOCK,), 1.0)
    for run in read_kernels(buf).values():
        run()
    assert torch.equal(buf, torch.full((2 * BLOCK,), 1.0))


def test_the_ceiling_is_the_faster_kernel_in_bytes_read():
    res = measure_hbm_read(torch.device("cpu"), 4 * BLOCK * 4 + 3, 0.05, min_repeats=1, max_repeats=2)
    assert res["hbm_read_bytes"] == 4 * BLOCK * 4  # whole blocks of float32
    kernels = {k for k in res if k.startswith("hbm_read_gbps_")}
    assert kernels == {"hbm_read_gbps_torch_sum", "hbm_read_gbps_triton_stream"}
    assert res["hbm_read_gbps"] == max(res[k] for k in kernels) > 0


def test_a_kernel_that_fails_is_said_and_the_other_is_the_ceiling(monkeypatch):
    import ple_bench.measure.hbm_read as hbm_read

    def broken(buf):
        raise RuntimeError("no Triton here")
    monkeypatch.setattr(hbm_read, "stream_read", broken)
    res = measure_hbm_read(torch.device("cpu"), 2 * BLOCK * 4, 0.05, min_repeats=1, max_repeats=2)
    assert res["hbm_read_error_triton_stream"] == "RuntimeError: no Triton here"
    assert "hbm_read_gbps_triton_stream" not in res and res["hbm_read_gbps"] == res["hbm_read_gbps_torch_sum"]


def _decoder_rec(mode="gpu"):
    return {"kind": "step", "status": "ok", "mode": mode, "compute": "decoder", "compute_us": 0.0,
            "compute_bytes": 6e9, "compute_ms": 1.5, "compute_in_step_ms": 1.5, "compute_region_alone_ms": 1.5}


def test_the_decoder_share_is_held_against_the_read_ceiling():
    rec = record.derive(_decoder_rec(), {"d2d_gbps": 3900.0, "hbm_read_gbps": 4400.0})
    assert rec["compute_hbm_gbps"] == pytest.approx(4000.0)
    assert rec["compute_pct_of_d2d"] == pytest.approx(100 * 4000 / 3900)  # past a copy's ceiling: read only
    assert rec["compute_pct_of_hbm_read"] == pytest.approx(100 * 4000 / 4400)
    old_run = record.derive(_decoder_rec(), {"d2d_gbps": 3900.0})  # a run before the read ceiling
    assert old_run["compute_pct_of_hbm_read"] is None and old_run["compute_pct_of_d2d"] is not None
    functional = record.derive(_decoder_rec("functional"), {"hbm_read_gbps": 4400.0})
    assert functional["compute_pct_of_hbm_read"] is None
    assert "compute_pct_of_hbm_read" in record.RECORD_KEYS
