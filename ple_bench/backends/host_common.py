"""The host-side lookup paths' shared machinery: ids brought to the host, the
host thread that runs a prefetch, the ordering of the side stream
(:class:`HostPathEmbedding`, the base of ``pinned_cpu_gather`` and
``pinned_copy_engine``), and the default size of a host gather's thread team
(:func:`default_gather_threads`, read by ``pinned_cpu_gather``,
``pinned_host_graph`` and ``pinned_host_flag``).

A *host path* (:class:`HostPathEmbedding`) does its lookup with the host's
cores -- a gather into pinned staging plus one host->device copy, or a batch
of row copies issued to the copy engines -- so its calls occupy the calling
host thread (``blocks_host``) and read the ids on the host
(``reads_ids_on_host``).  Subclasses implement one method,
:meth:`HostPathEmbedding.host_rows`: rows of host ids into a destination, any
device work enqueued on the given stream.

Where the ids are decides what the path waits for:

* **host ids** (a pinned host tensor, known when the step starts, as a
  server's scheduler knows them): ``start_prefetch`` hands the ids to the
  path's host thread at once -- no device->host copy, no wait on the main
  stream -- so the host work runs while the GPU computes (e.g. replays the
  compute segment of a breakable graph).  The side stream waits only until the
  previous step's consumer has read the prefetch buffer.
* **device ids** (produced by an earlier kernel): the ids are copied
  device->host on the side stream after the main stream's work so far, and the
  host thread waits for that copy before it can start (the one device->host
  sync such a path cannot avoid).

``finalize`` does the host work, then (as ``pinned_uva``) the main stream
waits for the side stream.  Where the host work runs (``host_prefetch``):

* ``"deferred"`` (default): in ``finalize``, on the calling thread -- after the
  caller has launched the compute (in a graph replay, one launch), so the host
  gathers while the GPU computes; no hand-off to another thread;
* ``"thread"``: on the path's own host thread, started by ``start_prefetch`` --
  the work begins at once, but the hand-off and a second team of torch threads
  cost more than they win: on the H200 host (16 cores) a start_prefetch +
  finalize of 1 K-8 K rows took 0.41-0.51 ms threaded and 0.23-0.30 ms
  deferred, and behind 200 us of GPU work 0.43-0.48 ms threaded and 0.24-0.47
  ms deferred (measured on an H200; docs/lookup-paths.md).  The synchronous ``lookup`` does the host work on
the calling thread (a blocking device->host copy first when the ids are on the
device).  Only the host work itself is counted in ``host_thread_s``: waits for
the ids or for a free staging buffer are not CPU work.

Host work done on the calling thread cannot be captured in a CUDA graph: these
paths run eagerly, or as eager breaks of a breakable graph (see
:mod:`ple_bench.run.graphs`).  :mod:`.pinned_host_graph` (``pinned_host_graph``) does the
same gather as a host node of the graph instead, captured whole.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Sequence

import torch

from ..annotate import annotate
from .formats import int_view
from .pinned_uva import PinnedUVAEmbedding


#: most host threads a gather uses by default (beyond this a decode-size gather gains nothing)
MAX_DEFAULT_GATHER_THREADS = 16


def default_gather_threads() -> int:
    """The cores torch sees (its intra-op thread count), at most 16."""
    return max(1, min(MAX_DEFAULT_GATHER_THREADS, torch.get_num_threads()))


HOST_PREFETCH_MODES = ("thread", "deferred")


class HostPathEmbedding(PinnedUVAEmbedding):
    """A pinned table looked up by host work; see the module docstring."""

    supports_prefetch = True
    blocks_host = True
    reads_ids_on_host = True
    default_kernel = "torch_masked"  # not used by host paths' lookups
    #: the host thread's name prefix (for profilers and thread dumps)
    thread_name = "ple_host_path"

    def __init__(self, num_embeddings: int, embedding_dim: int, *, host_prefetch: str = "deferred",
                 **kwargs) -> None:
        if host_prefetch not in HOST_PREFETCH_MODES:
            raise ValueError(f"host_prefetch must be one of {HOST_PREFETCH_MODES}, got {host_prefetch!r}")
        super().__init__(num_embeddings, embedding_dim, **kwargs)
        self.host_prefetch = host_prefetch
        self._host_pool: ThreadPoolExecutor | None = None
        self._future: Future | None = None
        self._deferred: tuple | None = None  # host_prefetch="deferred": the work finalize does
        self._host_ids_buf: torch.Tensor | None = None  # pinned int64, for device ids
        self._inflight_ref: torch.Tensor | None = None

    # ----------------------------------------------------------- the one hook
    def host_rows(self, host_ids: torch.Tensor, dest: torch.Tensor, stream) -> None:
        """Rows of ``host_ids`` (CPU int64, flat, global ids) into ``dest``
        (``[n, dim]`` integer view on the device or, in functional mode, the
        host), zero rows for ids this rank does not own; device work goes on
        ``stream`` (None on the host).  Runs on the calling thread or on the
        path's host thread."""
        raise NotImplementedError

    def host_thread_initializer(self) -> Callable[[], None] | None:
        """Run once in the path's host thread when it starts (e.g. its torch thread count)."""
        return None

    # ----------------------------------------------------------- helpers
    def _pinned_host_ids(self, n: int) -> torch.Tensor:
        buf = self._host_ids_buf
        if buf is None or buf.shape[0] < n:
            buf = torch.empty(n, dtype=torch.int64, pin_memory=not self.functional)
            self._host_ids_buf = buf
        return buf[:n]

    def _pool(self) -> ThreadPoolExecutor:
        if self._host_pool is None:
            self._host_pool = ThreadPoolExecutor(1, thread_name_prefix=self.thread_name,
                                                 initializer=self.host_thread_initializer())
        return self._host_pool

    # ----------------------------------------------------------- lookup
    def local_lookup(self, ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        out = self._lookup_output(ids, out)
        flat = ids.reshape(-1)
        dest = int_view(out).view(-1, self.embedding_dim)
        with annotate("lookup", color="green"):
            host_ids = flat.to("cpu", torch.int64)  # blocking device->host copy for device ids
            stream = torch.cuda.current_stream(self.device) if dest.device.type == "cuda" else None
            self.host_rows(host_ids, dest, stream)
        return out

    # ----------------------------------------------------------- prefetch
    def start_prefetch(
        self, ids: torch.Tensor, dp_token_counts: Sequence[int] | None = None
    ) -> None:
        self._check_ids(ids)
        with annotate("prefetch_start", color="yellow"):
            self._deferred = None  # a deferred prefetch never finalized: drop it undone
            self._join()  # a threaded one never finalized: finish it, drop its result
            buffer, gathered, slot, local = self._prefetch_target(ids, dp_token_counts)
            flat = gathered.reshape(-1)
            n = flat.numel()
            dest = int_view(buffer).view(-1, self.embedding_dim)[:n]
            ids_ready = None
            if flat.device.type == "cpu":
                host_ids = flat.to(torch.int64)
                if self._stream is not None:
                    self._side_stream_start(ids_from_host=True)
            else:
                stream = self._stream
                self._side_stream_start(ids_from_host=False)
                host_ids = self._pinned_host_ids(n)
                with torch.cuda.stream(stream):
                    host_ids.copy_(flat.to(torch.int64), non_blocking=True)
                    ids_ready = torch.cuda.Event()
                    ids_ready.record(stream)
                flat.record_stream(stream)
                self._inflight_ref = flat
            if self.host_prefetch == "deferred":
                self._deferred = (host_ids, ids_ready, dest)
            else:
                self._future = self._pool().submit(self._prefetch_work, host_ids, ids_ready, dest)
            self._pending = (gathered.shape[0], slot, local)

    def _prefetch_work(self, host_ids: torch.Tensor, ids_ready, dest: torch.Tensor) -> None:
        if dest.device.type == "cpu":
            self.host_rows(host_ids, dest, None)
            return
        with torch.cuda.device(self.device):
            if ids_ready is not None:
                ids_ready.synchronize()  # device ids: the GPU must have produced them
            self.host_rows(host_ids, dest, self._stream)

    def _join(self) -> None:
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            try:
                self._prefetch_work(*deferred)
            finally:
                self._inflight_ref = None
        future, self._future = self._future, None
        if future is not None:
            try:
                future.result()
            finally:
                self._inflight_ref = None

    def finalize(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """Wait for the host thread, then as ``pinned_uva``: join the side
        stream, reduce over ETP, select this DP rank's rows."""
        if self._future is None and self._deferred is None:
            raise RuntimeError("pinned PLE finalize requires a prior start_prefetch")
        self._join()
        return super().finalize(out)

    def close(self) -> None:
        self._deferred = None  # a deferred prefetch never finalized: nothing was started
        try:
            self._join()
        except Exception:  # noqa: BLE001 - closing: the error was the caller's to see
            pass
        if self._host_pool is not None:
            self._host_pool.shutdown(wait=True)
        self._host_pool = None
        self._host_ids_buf = None
        super().close()


class StagingBuffer:
    """A pinned host buffer reused by every lookup, and the event that says the
    last host->device copy out of it has finished (so it may be overwritten)."""

    def __init__(self, pinned: bool) -> None:
        self.pinned = pinned
        self._buf: torch.Tensor | None = None
        self._event: torch.cuda.Event | None = None  # one event, re-recorded (creating one per copy costs)
        self._in_use = False  # a copy out of the buffer was enqueued and not yet waited for
        self.lock = threading.Lock()

    def take(self, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
        """``[rows, cols]`` of the buffer, after the last copy out of it (call under ``lock``)."""
        if self._in_use:
            self._event.synchronize()
            self._in_use = False
        buf = self._buf
        if buf is None or buf.shape[0] < rows or buf.shape[1] != cols or buf.dtype != dtype:
            buf = torch.empty(max(rows, buf.shape[0] if buf is not None else 0), cols, dtype=dtype,
                              pin_memory=self.pinned)
            self._buf = buf
        return buf[:rows]

    def copied_on(self, stream) -> None:
        """A copy out of the buffer was enqueued on ``stream``."""
        if self._event is None:
            self._event = torch.cuda.Event()
        self._event.record(stream)
        self._in_use = True

    def release(self) -> None:
        self._buf = None
        self._event = None
        self._in_use = False
