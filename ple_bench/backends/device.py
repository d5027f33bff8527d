"""Backend 1: the whole shard resident in GPU memory (host memory on a CPU-only
machine).  Masked lookup of this rank's shard, all-reduce over ETP, DP slot
selection; ``start_prefetch`` only records the ids."""

from __future__ import annotations

import torch

from .base import PLEEmbedding
from .registry import register_backend


@register_backend("device")
class DeviceResidentEmbedding(PLEEmbedding):
    supports_prefetch = False
    default_kernel = "torch_masked"

    def allocate_table(self, rows: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(rows, dim, dtype=dtype, device=self.device)
