"""Cold-L2 measurement: evict the GPU's L2 cache between samples.

An :class:`L2Flusher` owns one buffer of at least twice the device's L2 size
(never less than :data:`MIN_FLUSH_BYTES`), allocated once per device and
reused; ``flush()`` zeroes it on the current stream (a memset that writes every
line, as nvbench and ``triton.testing.do_bench`` do).  The flush is enqueued
*before* a sample's start event, never inside the timed region.

On a CPU device flushing is a no-op and ``L2Flusher.active`` is False.
"""

from __future__ import annotations

import threading

import torch

from ..env import resolve_device

#: lower bound of the flush buffer when the L2 size is unknown or small
MIN_FLUSH_BYTES = 64 << 20

_flushers: dict[int, "L2Flusher"] = {}
_lock = threading.Lock()


def l2_size_bytes(device: torch.device | str) -> int | None:
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    idx = device.index if device.index is not None else torch.cuda.current_device()
    size = getattr(torch.cuda.get_device_properties(idx), "L2_cache_size", 0)
    return int(size) or None


class L2Flusher:
    def __init__(self, device: torch.device | str) -> None:
        device = resolve_device(device)
        self.device = device
        self.l2_bytes = l2_size_bytes(device)
        self.buffer: torch.Tensor | None = None
        if device.type == "cuda":
            self.nbytes = max(2 * (self.l2_bytes or 0), MIN_FLUSH_BYTES)
            # int32 elements: the memset kernel writes 4 bytes per element or more
            self.buffer = torch.empty(self.nbytes // 4, dtype=torch.int32, device=device)
        else:
            self.nbytes = 0

    @property
    def active(self) -> bool:
        return self.buffer is not None

    def flush(self) -> None:
        """Enqueue the eviction on the current stream (asynchronous)."""
        if self.buffer is not None:
            self.buffer.zero_()


def get_flusher(device: torch.device | str) -> L2Flusher:
    """The shared flusher of ``device`` (created on first use)."""
    device = torch.device(device)
    if device.type != "cuda":
        return L2Flusher(device)
    idx = device.index if device.index is not None else torch.cuda.current_device()
    with _lock:
        flusher = _flushers.get(idx)
        if flusher is None:
            flusher = _flushers[idx] = L2Flusher(torch.device("cuda", idx))
        return flusher


def l2_flush(device: torch.device | str) -> None:
    """Flush ``device``'s L2 on its current stream (no-op on CPU)."""
    get_flusher(device).flush()
