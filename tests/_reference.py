"""Plain references for the backend tests: random full tables (never zero,
with -0.0 mixed in), ids in each head's own range, the full-table lookup and
the masked lookup of one shard, poisoned outputs and byte comparisons.

Imported by the test modules and by the gloo rank processes (tests._dist)."""

from __future__ import annotations

import torch

POISON_BYTE = 0x7F  # e4m3 NaN; fp16 NaN; a huge finite fp32/bf16 no random table holds


def random_table(num_rows: int, dim: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A full ``[num_rows, dim]`` table of random values of ``dtype``.

    fp8 tables are random bytes (every finite e4m3 value, -0.0 = 0x80 included,
    NaN bytes replaced); other dtypes are ``randn`` scaled.  About 1 in 16
    entries is set to -0.0, whose bits a float sum (-0.0 + 0.0 = +0.0) would lose."""
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.float8_e4m3fn:
        raw = torch.randint(0, 256, (num_rows, dim), generator=gen, dtype=torch.int32)
        raw = torch.where((raw & 0x7F) == 0x7F, raw ^ 0x01, raw)  # no NaN bytes
        raw = torch.where(raw == 0, torch.full_like(raw, 0x11), raw)  # no +0.0
        table = raw.to(torch.uint8)
        neg_zero = torch.randint(0, 16, (num_rows, dim), generator=gen) == 0
        table[neg_zero] = 0x80
        return table.view(torch.float8_e4m3fn)
    table = (torch.randn(num_rows, dim, generator=gen) * 3.0).to(dtype)
    table[table == 0] = 1.0
    neg_zero = torch.randint(0, 16, (num_rows, dim), generator=gen) == 0
    table[neg_zero] = -0.0
    return table


def random_ids(
    tokens: int, heads: int, num_rows: int, seed: int, dtype: torch.dtype = torch.int64
) -> torch.Tensor:
    """``[tokens, heads]`` global ids, head ``h`` drawing from its own range of
    ``num_rows``; the first and last rows of the table are always included
    when there are at least two ids."""
    gen = torch.Generator().manual_seed(seed)
    bounds = [h * num_rows // heads for h in range(heads + 1)]
    cols = []
    for h in range(heads):
        lo, hi = bounds[h], max(bounds[h + 1], bounds[h] + 1)
        cols.append(torch.randint(lo, hi, (tokens,), generator=gen))
    ids = torch.stack(cols, dim=1) if tokens else torch.empty(0, heads, dtype=torch.int64)
    if tokens * heads >= 2:
        ids[0, 0] = 0
        ids[-1, -1] = num_rows - 1
    return ids.to(dtype)


def _byte_rows(full: torch.Tensor, flat_ids: torch.Tensor) -> torch.Tensor:
    # index raw bytes: works for every dtype on every device (fp8 indexing may not)
    return full.view(torch.uint8).index_select(0, flat_ids).view(full.dtype)


def full_lookup(full: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``[tokens, heads * dim]`` rows of the full table."""
    rows = _byte_rows(full, ids.reshape(-1).long().to(full.device))
    return rows.reshape(ids.shape[0], ids.shape[1] * full.shape[1])


def masked_lookup(full: torch.Tensor, ids: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """``[tokens, heads, dim]``: the rows in ``[start, end)``, zero bytes elsewhere."""
    flat = ids.reshape(-1).long().to(full.device)
    owned = (flat >= start) & (flat < end)
    rows = _byte_rows(full, torch.where(owned, flat, torch.zeros_like(flat)))
    rows.view(torch.uint8)[~owned] = 0
    return rows.reshape(ids.shape[0], ids.shape[1], full.shape[1])


def poisoned(shape, dtype: torch.dtype, device="cpu") -> torch.Tensor:
    """An output tensor whose every byte is 0x7F, so an unwritten element shows."""
    out = torch.empty(shape, dtype=dtype, device=device)
    out.view(torch.uint8).fill_(POISON_BYTE)
    return out


def bytes_of(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def assert_bytes_equal(actual: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    """Bit-exact equality, with the first differing element in the message."""
    assert tuple(actual.shape) == tuple(expected.shape), (
        f"{what}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    )
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    a, e = bytes_of(actual.cpu()), bytes_of(expected.cpu())
    if not torch.equal(a, e):
        width = actual.element_size()
        diff = (a != e).nonzero().reshape(-1)
        first = int(diff[0]) // width
        flat_a = actual.detach().cpu().reshape(-1)
        flat_e = expected.detach().cpu().reshape(-1)
        raise AssertionError(
            f"{what}: {diff.numel()} differing bytes of {a.numel()}; first at element {first}: "
            f"got {flat_a[first].float().item()!r} (bytes {a[first*width:(first+1)*width].tolist()}), "
            f"expected {flat_e[first].float().item()!r} (bytes {e[first*width:(first+1)*width].tolist()})"
        )
