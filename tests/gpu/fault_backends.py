"""Plug-in backends that fault on a GPU, loaded by import path (``tests.gpu.fault_backends:Name``)
by the GPU fault matrix (tests/gpu/test_fault_matrix_gpu.py), as a user's own class would be."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ple_bench.backends.device import DeviceResidentEmbedding


@triton.jit
def _wild_store(ptr, offset):
    tl.store(ptr + offset, 1.0)


class IllegalAddressBackend(DeviceResidentEmbedding):
    """Its lookup's kernel writes 4 TiB past its output: a sticky "illegal memory access" that
    leaves the worker's CUDA context unusable."""

    def lookup(self, ids, dp_token_counts=None):
        out = torch.empty(16, dtype=torch.float32, device=ids.device)
        _wild_store[(1,)](out, 1 << 40)
        torch.cuda.synchronize(ids.device)
        return super().lookup(ids, dp_token_counts)


class GpuHangBackend(DeviceResidentEmbedding):
    """Its lookup spins the GPU for about an hour and waits for it: a hang the runner must stop
    at ``--case-timeout``."""

    def lookup(self, ids, dp_token_counts=None):
        torch.cuda._sleep(10**13)  # cycles: thousands of seconds at any clock
        torch.cuda.synchronize(ids.device)
        return super().lookup(ids, dp_token_counts)
