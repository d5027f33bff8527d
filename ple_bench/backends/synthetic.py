"""Deterministic synthetic table content.

Row ``r`` column ``c`` of a table with seed ``s`` is a hash of ``(s, r, c)`` mapped
to a non-zero, finite float8 e4m3 value.  Every such value is exact in fp8, bf16,
fp16 and fp32, so a lookup can be checked bit-exactly against values recomputed
from the ids alone -- no copy of a 32 GiB table is needed for the reference, and
no value is ever zero (zeros would hide unwritten or masked rows)."""

from __future__ import annotations

import torch

_MASK31 = (1 << 31) - 1


def synthetic_rows(
    row_ids: torch.Tensor, dim: int, seed: int, dtype: torch.dtype
) -> torch.Tensor:
    """Values of rows ``row_ids`` (int64, any device) -> ``[len, dim]`` of ``dtype``."""
    rows = row_ids.reshape(-1, 1).to(torch.int64)
    cols = torch.arange(dim, device=row_ids.device, dtype=torch.int64).reshape(1, -1)
    h = (rows * 0x2545F491 + cols * 0x1B873593 + (seed * 0x5BD1E995 + 0x3C6EF372)) & _MASK31
    h = ((h ^ (h >> 15)) * 0x2C1B3C6D) & _MASK31
    h = ((h ^ (h >> 12)) * 0x297A2D39) & _MASK31
    h = h ^ (h >> 15)
    # e4m3fn bytes 0x01..0x7e are the positive finite non-zero values; bit 7 is the sign.
    byte = 1 + (h % 126) + ((h >> 8) & 1) * 128
    values = byte.to(torch.uint8).view(torch.float8_e4m3fn)
    return values if dtype == torch.float8_e4m3fn else values.to(dtype)


def fill_synthetic(
    table: torch.Tensor,
    first_row: int,
    seed: int,
    *,
    valid_rows: int | None = None,
    work_device: torch.device | str | None = None,
    chunk_elems: int = 1 << 26,
) -> None:
    """Fill ``table`` (rows ``first_row..``) in chunks, computing on ``work_device``
    (e.g. the GPU for a pinned host table) and copying into place."""
    num_rows, dim = table.shape
    valid_rows = num_rows if valid_rows is None else valid_rows
    work_device = torch.device(work_device) if work_device is not None else table.device
    step = max(1, chunk_elems // max(dim, 1))
    for start in range(0, valid_rows, step):
        stop = min(valid_rows, start + step)
        ids = torch.arange(first_row + start, first_row + stop, device=work_device)
        table[start:stop].copy_(synthetic_rows(ids, dim, seed, table.dtype), non_blocking=True)
    if valid_rows < num_rows:  # padding rows are never read; make them loud if they are
        pad = table[valid_rows:]
        if pad.dtype.is_floating_point and pad.dtype != torch.float8_e4m3fn:
            pad.fill_(float("nan"))
        else:
            pad.view(torch.uint8).fill_(0x7F)  # e4m3 NaN
    if work_device.type == "cuda":
        torch.cuda.synchronize(work_device)
