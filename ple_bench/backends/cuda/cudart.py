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

import torch

#: cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost
MEMCPY_H2D = 1
MEMCPY_D2H = 2


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
def runtime() -> Any | None:
    """The loaded libcudart as a ctypes library with the few calls the host paths
    make typed (``cudaMemcpyAsync``; event create / record / synchronize / destroy,
    stream wait; ``cudaLaunchHostFunc``, whose address the host-graph path hands to its
    native module), or None (no libcudart loaded, or ``PLE_BENCH_RAW_CUDART=0``)."""
    if os.environ.get("PLE_BENCH_RAW_CUDART") == "0":
        return None
    path = loaded_libcudart()
    if path is None:
        return None
    vp, i = ctypes.c_void_p, ctypes.c_int
    try:
        lib = ctypes.CDLL(path)
        for name, args in (("cudaMemcpyAsync", [vp, vp, ctypes.c_size_t, i, vp]),
                           ("cudaEventCreateWithFlags", [ctypes.POINTER(vp), ctypes.c_uint]),
                           ("cudaEventRecord", [vp, vp]), ("cudaEventSynchronize", [vp]),
                           ("cudaEventDestroy", [vp]), ("cudaStreamWaitEvent", [vp, vp, ctypes.c_uint]),
                           ("cudaLaunchHostFunc", [vp, vp, vp])):
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = i
    except (OSError, AttributeError):
        return None
    return lib


def memcpy_async() -> Any | None:
    """ctypes ``cudaMemcpyAsync(dst, src, count, kind, stream)`` of :func:`runtime`, or None."""
    lib = runtime()
    return lib.cudaMemcpyAsync if lib is not None else None


def _check(err: int, what: str) -> None:
    if err != 0:
        raise RuntimeError(f"{what} failed: cudaError {err}")


class RawEvent:
    """A CUDA event without timing (``cudaEventDisableTiming``), called through
    ctypes: a record or a wait is one runtime call, no Python-level wrapper.
    Only for eager code (never inside a graph capture)."""

    DISABLE_TIMING = 2

    def __init__(self) -> None:
        self._rt = runtime()
        if self._rt is None:
            raise RuntimeError("RawEvent needs a loaded libcudart")
        handle = ctypes.c_void_p()
        _check(self._rt.cudaEventCreateWithFlags(ctypes.byref(handle), self.DISABLE_TIMING), "cudaEventCreateWithFlags")
        self.handle = handle.value

    def record(self, stream_handle: int) -> None:
        _check(self._rt.cudaEventRecord(self.handle, stream_handle), "cudaEventRecord")

    def synchronize(self) -> None:
        _check(self._rt.cudaEventSynchronize(self.handle), "cudaEventSynchronize")

    def wait_on(self, stream_handle: int) -> None:
        """``stream_handle`` waits (on the device) for this event's last record."""
        _check(self._rt.cudaStreamWaitEvent(stream_handle, self.handle, 0), "cudaStreamWaitEvent")

    def close(self) -> None:
        if self.handle is not None and self._rt is not None:
            self._rt.cudaEventDestroy(self.handle)
        self.handle = None

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown order
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


def current_stream_handle(device_index: int) -> int:
    """The raw ``cudaStream_t`` of the current stream of ``device_index`` (torch's own, no Stream object)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


def function_address(name: str) -> int:
    """The address of libcudart's ``name`` (for a native module that calls it), 0 without a runtime."""
    lib = runtime()
    if lib is None:
        return 0
    return int(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0)


def memcpy_raw(dest_ptr: int, src_ptr: int, nbytes: int, kind: int, stream_handle: int) -> None:
    """One raw ``cudaMemcpyAsync`` of ``kind`` (:data:`MEMCPY_H2D`, :data:`MEMCPY_D2H`) on
    ``stream_handle``; also valid during a stream capture (a memcpy node of the graph)."""
    err = memcpy_async()(dest_ptr, src_ptr, nbytes, kind, stream_handle)
    if err != 0:
        raise RuntimeError(f"cudaMemcpyAsync (kind {kind}, {nbytes} bytes) failed: cudaError {err}")


def memcpy_h2d_raw(dest_ptr: int, src_ptr: int, nbytes: int, stream_handle: int) -> None:
    """One raw ``cudaMemcpyAsync`` host->device (pinned source) on ``stream_handle``."""
    fn = memcpy_async()
    err = fn(dest_ptr, src_ptr, nbytes, MEMCPY_H2D, stream_handle)
    if err != 0:
        raise RuntimeError(f"cudaMemcpyAsync (host->device, {nbytes} bytes) failed: cudaError {err}")


def copy_h2d_async(dest, src, stream) -> None:
    """``dest`` (device, contiguous) <- ``src`` (pinned host, contiguous, same bytes),
    asynchronously on ``stream``: one raw runtime call where it can be had, else
    torch's copy on that stream."""
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
