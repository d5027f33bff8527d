"""Backend 1: the whole shard resident in GPU memory (host memory on a CPU-only
machine).  Masked lookup of this rank's shard, all-reduce over ETP, DP slot
selection; ``start_prefetch`` only records the ids."""

from __future__ import annotations

import torch

from .base import PLEEmbedding


class DeviceResidentEmbedding(PLEEmbedding):
    name = "device"
    supports_prefetch = False
    # One kernel, masked in-kernel (right for a shard, and for a whole table): the fastest correct
    # resident gather measured, and the reference every offloaded path is held against
    # (docs/faster-than-hbm.md: torch_masked's nine kernels and a copy cost a decode step 9-18 us).
    default_kernel = "triton_reference"
    # functional mode: the Triton interpreter takes seconds per lookup on a CPU
    cpu_kernel = "torch_masked"

    def allocate_table(self, rows: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(rows, dim, dtype=dtype, device=self.device)
