"""The CUDA runtime this process has loaded (torch's ``libcudart``), called
through ctypes where a Python-level call costs more than the work: one
``cudaMemcpyAsync`` is a few microseconds this way, while a torch copy on a
side stream (a stream context, the copy's dispatch) costs tens of microseconds
of host time on the lent H200 machines (scripts/gpu/host_gather_profile.py)."""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any

#: cudaMemcpyHostToDevice
MEMCPY_H2D = 1


def loaded_libcudart() -> str | None:
    """Path of the libcudart this process has loaded, None when none is."""
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                if "libcudart.so" in line:
                    return line.split()[-1]
    except OSError:
        pass
    return None


@functools.lru_cache(maxsize=1)
def memcpy_async() -> Any | None:
    """ctypes ``cudaMemcpyAsync(dst, src, count, kind, stream)``, or None (no
    libcudart loaded, or ``PLE_BENCH_RAW_CUDART=0``)."""
    if os.environ.get("PLE_BENCH_RAW_CUDART") == "0":
        return None
    path = loaded_libcudart()
    if path is None:
        return None
    try:
        fn = ctypes.CDLL(path).cudaMemcpyAsync
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


def copy_h2d_async(dest, src, stream) -> None:
    """``dest`` (device, contiguous) <- ``src`` (pinned host, contiguous, same bytes),
    asynchronously on ``stream``: one raw runtime call where it can be had, else
    torch's copy on that stream."""
    import torch

    nbytes = src.numel() * src.element_size()
    fn = memcpy_async()
    if fn is not None and dest.is_contiguous() and src.is_contiguous() and src.is_pinned() \
            and nbytes == dest.numel() * dest.element_size():
        err = fn(dest.data_ptr(), src.data_ptr(), nbytes, MEMCPY_H2D, stream.cuda_stream)
        if err != 0:
            raise RuntimeError(f"cudaMemcpyAsync (host->device, {nbytes} bytes) failed: cudaError {err}")
        return
    if stream == torch.cuda.current_stream(dest.device):
        dest.copy_(src, non_blocking=True)
    else:
        with torch.cuda.stream(stream):
            dest.copy_(src, non_blocking=True)
