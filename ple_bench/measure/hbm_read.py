"""A read-only HBM ceiling: how fast this GPU reads its own memory when nothing is written back.

``d2d_gbps`` (:mod:`ple_bench.measure.ceilings`) is a device copy and counts its read plus its
write bytes: it bounds a step that moves data, not one that only reads.  A decoder step reads
every layer's weights and its whole KV cache and writes almost nothing, and it reached 102 % of
the copy ceiling on an H200 -- so the copy ceiling is the wrong ceiling for it.  This one reads a
large device buffer (larger than any L2) and writes nothing (a few bytes), by two kernels, and keeps
the faster:

* ``torch_sum``: ``torch.sum`` of the buffer as float32 (torch's reduction kernel);
* ``triton_stream``: a Triton kernel, one program per :data:`BLOCK` float32 elements, each loads
  its block once (``evict_first``) and writes back, negated, only the elements that are negative:
  the buffer holds 1.0 everywhere, so every element is loaded to decide and nothing is written
  (:func:`check_stream_read` checks on a buffer with negatives that every one was reached).

Keys (GB/s, 1e9 B/s, bytes read only): ``hbm_read_gbps`` (the faster), ``hbm_read_gbps_torch_sum``,
``hbm_read_gbps_triton_stream``, and ``hbm_read_bytes`` (the buffer's size); a kernel that fails to
build or run leaves ``hbm_read_error_<kernel>`` (its error) instead of its figure, and the ceiling is
the faster of the others (none: no ``hbm_read_gbps``).  Timed as the other
once-per-run ceilings (:func:`ple_bench.measure.repeat.repeat_timed`: CUDA events on a GPU, the
host clock on a CPU, where it serves only to check the code).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..backends.kernels import triton_jit
from .repeat import repeat_timed

#: bytes read per call on a GPU (a quarter of the free memory at most), well past an H200's 50 MB L2
HBM_READ_BYTES = 2 << 30
#: float32 elements per program of the Triton kernel (32 KiB)
BLOCK = 8192

_built: dict[bool, Any] = {}


def _stream_kernel(interpret: bool):
    if interpret in _built:
        return _built[interpret]
    import triton.language as tl

    def stream_read_fix_negatives(x_ptr, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + offs, mask=offs < n, other=0.0, eviction_policy="evict_first")
        # a data-dependent store: every element must be loaded to decide it (none is written on a
        # buffer of 1.0); a reduction would do too, but the CPU interpreter cannot run tl.sum here
        tl.store(x_ptr + offs, -v, mask=(offs < n) & (v < 0.0))

    _built[interpret] = triton_jit(stream_read_fix_negatives, interpret)
    return _built[interpret]


def stream_read(buf: torch.Tensor) -> None:
    """Load every element of the flat float32 ``buf`` once; negate the negative ones in place
    (none on the ceiling's buffer of 1.0: nothing is written)."""
    kernel = _stream_kernel(interpret=buf.device.type == "cpu")
    kernel[(-(-buf.numel() // BLOCK),)](buf, buf.numel(), BLOCK=BLOCK, num_warps=8)


def check_stream_read(buf: torch.Tensor) -> bool:
    """On a copy of ``buf``: after :func:`stream_read` every element is its absolute value (every
    element, the last partial block's too, was loaded), and nothing else changed."""
    x = buf.clone()
    stream_read(x)
    return bool(torch.equal(x, buf.abs()))


def read_kernels(buf: torch.Tensor) -> dict[str, Callable[[], None]]:
    """name -> a call that reads all of ``buf`` (flat float32, no negative element) and writes at
    most 4 bytes."""
    acc = torch.empty((), dtype=torch.float32, device=buf.device)
    return {"torch_sum": lambda: torch.sum(buf, 0, out=acc),
            "triton_stream": lambda: stream_read(buf)}


def measure_hbm_read(device: torch.device, nbytes: int, budget_s: float, *, min_repeats: int = 3,
                     max_repeats: int = 25) -> dict[str, Any]:
    """The read-only ceiling of ``device`` over a buffer of ``nbytes`` (see the module doc)."""
    n = max(BLOCK, nbytes // 4 // BLOCK * BLOCK)
    buf = torch.full((n,), 1.0, dtype=torch.float32, device=device)  # touched: no lazily mapped pages
    res: dict[str, Any] = {"hbm_read_bytes": n * 4}
    kernels = read_kernels(buf)
    for name, run in kernels.items():
        try:
            seconds = repeat_timed(run, device=device, warmup=1, min_repeats=min_repeats, max_repeats=max_repeats,
                                   budget_s=budget_s / len(kernels)).median_s
        except Exception as exc:  # noqa: BLE001 -- a kernel that cannot build or run is said, not fatal to a run
            res[f"hbm_read_error_{name}"] = f"{type(exc).__name__}: {exc}"[:300]
            continue
        res[f"hbm_read_gbps_{name}"] = n * 4 / seconds / 1e9
    measured = [res[f"hbm_read_gbps_{name}"] for name in kernels if f"hbm_read_gbps_{name}" in res]
    if measured:
        res["hbm_read_gbps"] = max(measured)
    del buf, kernels
    return res


__all__ = ["HBM_READ_BYTES", "BLOCK", "measure_hbm_read", "read_kernels", "stream_read", "check_stream_read"]
