"""Row-lookup kernels, swappable by name.

A kernel copies the rows of ``flat_ids`` that this rank owns from its shard
``table`` (rows ``vocab_start..vocab_end`` of the global table) into ``out`` and
writes zero rows for the ids it does not own.  Tables and outputs are passed as
same-width integer views (:func:`formats.int_view`), so every kernel moves raw
bytes and FP8 needs no float8 support from the kernel.

Signature::

    kernel(table[rows, dim], flat_ids[n] int64, out[n, dim], vocab_start, vocab_end) -> None

A kernel that can cap its grid also takes ``max_programs=`` (an int: the most
programs it launches) and says so with :func:`grid_capped` (the backend's
``grid_cap`` setting is then passed to it on every call, see
:meth:`PLEEmbedding.run_kernel`).

A kernel that reads the table's rows in ascending id order (it sorts the ids first, as the
``dedup`` kernels do) says so with :func:`sorted_reads`: the engine then holds it against a
random-row ceiling gathered in sorted order (:attr:`PLEEmbedding.reads_sorted`), since sorted
access buys locality (pages, TLB entries, DRAM and PCIe row buffers) that a random-order gather
does not get.
"""

from __future__ import annotations

import importlib
import os
from typing import Callable, Protocol

import torch


class LookupKernel(Protocol):
    def __call__(
        self,
        table: torch.Tensor,
        flat_ids: torch.Tensor,
        out: torch.Tensor,
        vocab_start: int,
        vocab_end: int,
    ) -> None: ...


_KERNELS: dict[str, LookupKernel] = {}


def grid_capped(fn: LookupKernel) -> LookupKernel:
    """Declare that ``fn`` takes ``max_programs=`` (a cap on its grid)."""
    fn.takes_max_programs = True  # type: ignore[attr-defined]
    return fn


def takes_grid_cap(kernel: LookupKernel) -> bool:
    """Whether ``kernel`` was declared :func:`grid_capped`."""
    return bool(getattr(kernel, "takes_max_programs", False))


def sorted_reads(fn: LookupKernel) -> LookupKernel:
    """Declare that ``fn`` reads the table's rows in ascending id order."""
    fn.reads_sorted = True  # type: ignore[attr-defined]
    return fn


def kernel_reads_sorted(kernel: LookupKernel) -> bool:
    """Whether ``kernel`` was declared :func:`sorted_reads`."""
    return bool(getattr(kernel, "reads_sorted", False))


def register_kernel(name: str) -> Callable[[LookupKernel], LookupKernel]:
    def deco(fn: LookupKernel) -> LookupKernel:
        _KERNELS[name] = fn
        return fn

    return deco


def get_kernel(name: str | LookupKernel) -> LookupKernel:
    if callable(name):
        return name
    if name not in _KERNELS:
        _load_extra_kernels()
    try:
        return _KERNELS[name]
    except KeyError:
        raise ValueError(f"unknown lookup kernel {name!r}; known: {sorted(_KERNELS)}") from None


def kernel_names() -> list[str]:
    _load_extra_kernels()
    return sorted(_KERNELS)


#: modules of faster variants, imported by name when a kernel is asked for: they register
#: themselves on import (named, not imported, here: no import circle through this registry); one
#: that fails to import is an error, not a kernel missing from the list
KERNEL_MODULES = ("ple_bench.backends.fast_kernels",)


def _load_extra_kernels() -> None:
    for module in KERNEL_MODULES:
        importlib.import_module(module)


@register_kernel("torch_masked")
def torch_masked_lookup(table, flat_ids, out, vocab_start, vocab_end):
    """Masked ``index_select`` (the device-resident reference: F.embedding on the shard)."""
    owned = (flat_ids >= vocab_start) & (flat_ids < vocab_end)
    local = torch.where(owned, flat_ids - vocab_start, torch.zeros_like(flat_ids))
    torch.index_select(table, 0, local, out=out)
    out.masked_fill_(~owned.unsqueeze(1), 0)


@register_kernel("torch_index")
def torch_index_lookup(table, flat_ids, out, vocab_start, vocab_end):
    """Plain ``index_select`` (``F.embedding``'s kernel), no mask: one kernel, what a server runs
    on a table it does not shard (vLLM's vocab-parallel embedding skips its mask at TP 1).  Every
    id must lie in ``[vocab_start, vocab_end)``: there is no zero row for the others (an
    ``IndexError`` on the CPU, a device-side assert on a GPU), so it is for unsharded tables."""
    torch.index_select(table, 0, flat_ids - vocab_start if vocab_start else flat_ids, out=out)


_triton_kernels: dict[bool, tuple] = {}


def triton_jit(fn, interpret: bool):
    """``triton.jit`` for the GPU, or for the CPU interpreter when ``interpret``.

    Triton reads ``TRITON_INTERPRET`` when a function is decorated, so kernels
    are decorated lazily, once per mode: the same process can then run CPU
    tensors under the interpreter (functional mode) and, with a GPU, compiled."""
    import triton  # decorated lazily: TRITON_INTERPRET is read at decoration

    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
    try:
        return triton.jit(fn)
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old


def _build_triton_kernel(interpret: bool):
    if interpret in _triton_kernels:
        return _triton_kernels[interpret]
    import triton  # decorated lazily: TRITON_INTERPRET is read at decoration
    import triton.language as tl  # (see triton_jit)

    def ple_lookup_row_per_program(
        table_ptr, ids_ptr, out_ptr, dim, vocab_start, vocab_end, BLOCK_D: tl.constexpr
    ):
        # One program per flattened id (the reference kernel's shape).
        pid = tl.program_id(0).to(tl.int64)
        gid = tl.load(ids_ptr + pid)
        owned = (gid >= vocab_start) & (gid < vocab_end)
        local = tl.where(owned, gid - vocab_start, 0)
        cols = tl.arange(0, BLOCK_D)
        in_row = cols < dim
        # Broadcast the scalar before combining (the interpreter rejects vector & scalar).
        owned_vec = tl.full([BLOCK_D], 0, tl.int32) + owned.to(tl.int32)
        vals = tl.load(table_ptr + local * dim + cols, mask=in_row & (owned_vec != 0), other=0)
        tl.store(out_ptr + pid * dim + cols, vals, mask=in_row)

    built = (triton, triton_jit(ple_lookup_row_per_program, interpret))
    _triton_kernels[interpret] = built
    return built


@register_kernel("triton_reference")
def triton_reference_lookup(table, flat_ids, out, vocab_start, vocab_end):
    """The reference Triton kernel: one program per id, ``BLOCK_D = next_pow2(dim)``."""
    n = flat_ids.numel()
    if n == 0:
        return
    triton, kernel = _build_triton_kernel(interpret=table.device.type == "cpu")
    dim = table.shape[1]
    kernel[(n,)](
        table, flat_ids, out, dim, vocab_start, vocab_end, BLOCK_D=triton.next_power_of_2(dim)
    )
