"""A host→device copy kept busy beside a measurement: the ``h2d_background`` axis.

A server rarely has the host→device link to itself: KV-cache swaps, weight streaming and other
ranks' traffic share the copy engines and the PCIe / C2C link.  :class:`BackgroundH2D` starts a
thread that copies a pinned buffer to the GPU on a stream of its own, back to back (one copy in
flight, synchronized on that stream only), for as long as it is entered, and says the rate it
achieved (``background_h2d_gbps``): the share of the link the measured path did not have.

Graphs are captured before it starts (the step's checks capture them), so no capture sees its
thread.  While it runs, ``host_sync`` samples wait on the measured stream, not the device
(:func:`ple_bench.measure.timer.stream_scoped_sync`): a device-wide sync would wait for the copy in
flight and time it.  CUDA only."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import torch

from .timer import stream_scoped_sync

#: bytes per background copy: large enough to keep a copy engine busy (about 1 ms at 55 GB/s)
COPY_BYTES = 64 << 20


class BackgroundH2D:
    """``with BackgroundH2D(device): ...`` -- host→device copies of ``nbytes`` back to back on a
    stream of their own while the block runs; :attr:`gbps` the rate over every entered span."""

    def __init__(self, device, nbytes: int = COPY_BYTES) -> None:
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise NotImplementedError("h2d_background needs CUDA (a host→device copy engine)")
        gen = torch.Generator().manual_seed(0x5EED)
        # never copy zeros: a compressing or zero-skipping link would flatter the load
        self.src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen).pin_memory()
        self.dst = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        self.stream = torch.cuda.Stream(self.device)
        self.copied_bytes = 0
        self.seconds = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def _loop(self) -> None:
        try:
            torch.cuda.set_device(self.device)
            t0 = time.perf_counter()
            n = 0
            while not self._stop.is_set():
                with torch.cuda.stream(self.stream):
                    self.dst.copy_(self.src, non_blocking=True)
                self.stream.synchronize()
                n += 1
            self.seconds += time.perf_counter() - t0
            self.copied_bytes += n * self.src.numel()
        except BaseException as exc:  # noqa: BLE001 -- re-raised in the measuring thread
            self._error = exc

    def __enter__(self) -> "BackgroundH2D":
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="ple_bench-h2d-background", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._thread = None
        if self._error is not None:
            raise RuntimeError(f"the background host→device copy failed: {self._error}") from self._error

    @property
    def gbps(self) -> float | None:
        return self.copied_bytes / self.seconds / 1e9 if self.seconds else None

    def wrap(self, measure_fn: Callable[..., Any]) -> Callable[..., Any]:
        """``measure_fn`` with the background running through each of its calls."""
        def measured(*args: Any, **kwargs: Any) -> Any:
            with self, stream_scoped_sync():
                return measure_fn(*args, **kwargs)
        return measured
