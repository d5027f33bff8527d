"""``pinned_cpu_gather`` (:class:`PinnedCPUGatherEmbedding`): the host's cores gather the rows
(one ``index_select`` on the host table with torch's intra-op threads, or the native row loop of
:mod:`.cuda.native`) into a pinned staging buffer, then one asynchronous host->device copy on the
side stream.  No GPU thread touches host memory row by row.

It keeps ``pinned_uva``'s interface, prefetch buffer, side stream, ETP reduce and DP selection
(through :class:`~.host_common.HostPathEmbedding`), and runs in CPU functional mode too.  It runs
no kernel, so it refuses ``sm_limit`` (a green-context side stream).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import time
from typing import Sequence

import torch

from ..annotate import annotate
from .cuda.cudart import RawEvent, copy_h2d_async, current_stream_handle, memcpy_h2d_raw, runtime
from .cuda.native import host_gather_module, native_error, new_host_gather
from .host_common import HostPathEmbedding, StagingBuffer, default_gather_threads


@contextlib.contextmanager
def torch_threads(n: int):
    """Run the block with torch's intra-op thread count of this thread at ``n``."""
    before = torch.get_num_threads()
    if before == n:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def byte_rows(t: torch.Tensor) -> torch.Tensor:
    """``[rows, row_bytes]`` uint8 view of a 2-D tensor: torch's index_select then
    copies whole rows and splits ``rows`` into tasks of ``32 KiB / row_bytes``."""
    return t.view(torch.uint8).view(t.shape[0], -1)


class PinnedCPUGatherEmbedding(HostPathEmbedding):
    """Host gather + one H2D copy.

    The gather is one ``torch.index_select`` of the rows into a pinned staging
    buffer (reused: a new gather waits only for the last copy out of it), with
    torch's own intra-op threads -- ``gather_threads`` of them (default: the
    cores torch sees, at most 16) -- and nothing around it: one level of
    parallelism.  Then one asynchronous host->device copy of the staging buffer
    into the output, on the side stream when prefetching.  Ids this rank does
    not own (ETP > 1) get zero rows.  See :mod:`.host_common` for where the
    ids come from and what the prefetch waits for.
    """

    name = "pinned_cpu_gather"

    gathers_on_host = True

    thread_name = "ple_cpu_gather"
    sm_limit_refusal = ("pinned_cpu_gather gathers on the host's cores and copies with the copy "
                        "engines; no SMs run its lookup, so an SM limit does not apply")

    def __init__(self, num_embeddings: int, embedding_dim: int, *, gather_threads: int = 0,
                 **kwargs) -> None:
        super().__init__(num_embeddings, embedding_dim, **kwargs)
        if isinstance(gather_threads, bool) or not isinstance(gather_threads, int) or gather_threads < 0:
            raise ValueError(f"gather_threads must be a non-negative integer, got {gather_threads!r}")
        self._direct_state: _DirectState | None = None
        self._fast_lookup = None  # the native lookup with nothing around it (see _fast)
        self._gather_threads = gather_threads or default_gather_threads()
        self._staging = StagingBuffer(pinned=not self.functional)
        self._direct_pending: tuple | None = None
        self._direct_static: bool | None = None  # the call-independent part of _direct_ok
        self._direct_on = True
        self._native = True

    def _reset_direct(self) -> None:
        """Drop the direct path's state (rebuilt on its next call with the current settings)."""
        self._direct_pending = None
        self._fast_lookup = None
        if self._direct_state is not None:
            self._direct_state.close()
            self._direct_state = None

    @property
    def direct(self) -> bool:
        """The direct path (see :meth:`_direct_ok`); False forces the general one (for A/B checks)."""
        return self._direct_on

    @direct.setter
    def direct(self, value: bool) -> None:
        self._direct_on = bool(value)
        self._fast_lookup = None

    @property
    def native(self) -> bool:
        """The direct path in one C++ call where it builds (:mod:`.native`); False: its
        Python steps (for A/B checks; a change rebuilds the direct path's state)."""
        return self._native

    @native.setter
    def native(self, value: bool) -> None:
        if bool(value) != self._native:
            self._native = bool(value)
            self._reset_direct()

    @property
    def gather_threads(self) -> int:
        """Host threads of a gather (torch's intra-op threads during the call); a change
        rebuilds the direct path's state, whose native call keeps the count."""
        return self._gather_threads

    @gather_threads.setter
    def gather_threads(self, value: int) -> None:
        if int(value) != self._gather_threads:
            self._gather_threads = int(value)
            self._reset_direct()

    def host_thread_initializer(self):
        n = self.gather_threads
        return lambda: torch.set_num_threads(n)

    # ----------------------------------------------------------- host side
    def host_gather(self, host_ids: torch.Tensor, dest: torch.Tensor) -> None:
        """Rows of ``host_ids`` (CPU int64, flat, global) into ``dest`` (CPU
        ``[n, dim]``), zero rows for ids outside the shard; counted as host work."""
        with self.host_thread_time(), torch_threads(self.gather_threads):
            table = self._table_bytes()
            out = byte_rows(dest)
            start, end = self.shard.vocab_start, self.shard.vocab_end
            if start == 0 and end == self.num_embeddings:  # the whole table: every id is this rank's
                torch.index_select(table, 0, host_ids, out=out)
                return
            owned = (host_ids >= start) & (host_ids < end)
            local = torch.where(owned, host_ids - start, torch.zeros_like(host_ids))
            torch.index_select(table, 0, local, out=out)
            out.masked_fill_(~owned.unsqueeze(1), 0)

    def _table_bytes(self) -> torch.Tensor:
        """The table as ``[rows, row_bytes]`` uint8 (a view, made once per table)."""
        cached = getattr(self, "_table_bytes_view", None)
        if cached is None or cached[0] is not self.weight:
            cached = self._table_bytes_view = (self.weight, byte_rows(self.weight))
        return cached[1]

    def host_rows(self, host_ids: torch.Tensor, dest: torch.Tensor, stream) -> None:
        if dest.device.type == "cpu":
            self.host_gather(host_ids, dest)
            return
        with self._staging.lock:
            staging = self._staging.take(host_ids.numel(), dest.shape[1], dest.dtype)
            self.host_gather(host_ids, staging)
            copy_h2d_async(dest, staging, stream)
            self._staging.copied_on(stream)

    # ----------------------------------------------------------- the direct path
    def _direct_ok(self, ids: torch.Tensor, dp_token_counts) -> bool:
        """The common server case, done with nothing around the work: one rank
        owns the whole table (no ETP, no DP gather), the ids are a host tensor, and
        the host work runs on the calling thread (``host_prefetch="deferred"``).
        On CUDA it also needs the loaded libcudart (raw copy, raw events) and no
        graph capture in progress; anything else takes the general path."""
        if not self.direct or ids.device.type != "cpu" or not self._direct_static_ok():
            return False
        return self.functional or not torch.cuda.is_current_stream_capturing()

    def _direct_static_ok(self) -> bool:
        """The call-independent part of :meth:`_direct_ok` (computed once)."""
        static = self._direct_static
        if static is None:
            topo = self.topology
            static = self._direct_static = (
                self.host_prefetch == "deferred" and topo.replicas == 1 and topo.etp == 1
                and self.groups.etp_group is None
                and (self.functional or runtime() is not None))
        return static

    def _direct(self) -> "_DirectState":
        st = self._direct_state
        if st is None:
            st = self._direct_state = _DirectState(self)
        return st

    def _fast(self):
        """``lookup``'s common case as one closure: host ids of the right shape and dtype,
        within the staging, no capture, the native call built -- then only the NVTX range,
        the stream handle and the native call run (each Python step around a 1 K-row gather
        costs 0.3-1 us on the lent hosts). Returns None where the direct path's native call
        does not apply; the closure returns None for a call it does not take."""
        if not self._direct_on or not self._direct_static_ok():
            return None
        st = self._direct()
        nat = st.native
        if nat is None:
            return None
        native_lookup, last_s, capacity = nat.lookup, nat.last_s, st.capacity
        heads = self.num_heads
        id_dtypes = (torch.int64, torch.int32)
        if self.functional:  # rows straight into a host output: no stream, no capture
            def stream() -> int:
                return 0

            def capturing() -> bool:
                return False
        else:
            stream = functools.partial(current_stream_handle, self.device.index)
            capturing = torch.cuda.is_current_stream_capturing

        def fast(ids: torch.Tensor):
            if (not ids.is_cpu or ids.dim() != 2 or ids.shape[1] != heads or ids.dtype not in id_dtypes
                    or ids.numel() > capacity or capturing()):
                return None
            with annotate("lookup", color="green"):
                out = native_lookup(ids, stream())
            if out is None:
                raise native_error(nat)
            self.host_thread_s += last_s()  # the calling thread's work: no other writer (deferred)
            return out

        return fast

    def _direct_rows(self, ids: torch.Tensor, out: torch.Tensor, stream_handle: int | None) -> None:
        """Rows of host ``ids`` into ``out`` (contiguous ``[tokens, heads*dim]`` or
        ``[tokens, heads, dim]``): one ``index_select`` into pinned staging, one raw
        host->device copy on ``stream_handle`` (on the host: straight into ``out``).
        One C++ call where the native module is built (native/host_gather.cpp);
        else the same steps from Python, written out here (not through
        :meth:`host_gather`): on the lent H200 hosts every Python layer around a
        1 K-row gather costs microseconds that the hand version does not pay
        (scripts/gpu/host_gather_direct.py)."""
        st = self._direct()
        nat = st.native
        if nat is not None:  # the call flattens the ids itself
            if ids.numel() > st.capacity:
                st.grow(ids.numel())
            spent = nat.rows(ids, out, stream_handle or 0)
            if spent < 0:
                raise native_error(nat)
            with self._host_time_lock:
                self.host_thread_s += spent
            return
        flat = ids.reshape(-1)
        n = flat.numel()
        if self.functional:
            self.host_gather(flat, out.view(torch.uint8).view(n, -1))
            return
        staging = st.staging(n)  # waits for the last copy out of it
        threads = self.gather_threads
        t0 = time.thread_time()
        if threads == torch.get_num_threads():
            torch.index_select(st.table, 0, flat, out=staging)
        else:
            with torch_threads(threads):
                torch.index_select(st.table, 0, flat, out=staging)
        spent = time.thread_time() - t0
        memcpy_h2d_raw(out.data_ptr(), staging.data_ptr(), n * st.row_bytes, stream_handle)
        st.copied.record(stream_handle)
        st.in_use = True
        with self._host_time_lock:
            self.host_thread_s += spent

    def lookup(self, ids: torch.Tensor, dp_token_counts: Sequence[int] | None = None) -> torch.Tensor:
        fast = self._fast_lookup if dp_token_counts is None else None  # built by the first direct call
        if fast:
            out = fast(ids)
            if out is not None:
                return out
        if not self._direct_ok(ids, dp_token_counts):
            return super().lookup(ids, dp_token_counts)
        self._check_ids(ids)
        if dp_token_counts is not None:
            self.slot_size(ids.shape[0], dp_token_counts)  # refuse bad counts as the general path does
        self._direct()
        if self._fast_lookup is None:
            self._fast_lookup = self._fast() or False
            if self._fast_lookup and dp_token_counts is None:
                out = self._fast_lookup(ids)
                if out is not None:
                    return out
        with annotate("lookup", color="green"):  # the Python steps, or rows past the staging
            out = torch.empty(ids.shape[0], self.num_heads * self.embedding_dim, dtype=self.storage_dtype,
                              device=self.device)
            self._direct_rows(ids, out, None if self.functional else current_stream_handle(self.device.index))
        return out

    def stats(self) -> dict:
        """``gather_impl``: which code ran the direct path's gather and copy (``native``:
        one C++ call, ``python``: the same steps from Python), or ``general`` where no
        call took the direct path (see :meth:`_direct_ok`)."""
        out = dict(super().stats())
        st = self._direct_state
        out["gather_impl"] = "general" if st is None else ("native" if st.native is not None else "python")
        return out

    def start_prefetch(self, ids: torch.Tensor, dp_token_counts: Sequence[int] | None = None) -> None:
        self._direct_pending = None
        if not self._direct_ok(ids, dp_token_counts):
            return super().start_prefetch(ids, dp_token_counts)
        self._check_ids(ids)
        if dp_token_counts is not None:
            self.slot_size(ids.shape[0], dp_token_counts)
        if ids.shape[0] > self.prefetch_rows:
            raise ValueError(f"pinned PLE prefetch buffer holds {self.prefetch_rows} rows, "
                             f"but the batch needs {ids.shape[0]}")
        self._deferred = None
        self._join()
        with annotate("prefetch_start", color="yellow"):
            if not self.functional:
                # the side stream's copy comes after the main stream's work so far (the
                # previous step's readers of the output), not after the compute launched next
                st = self._direct()
                main = current_stream_handle(self.device.index)
                st.main_mark.record(main)
                st.main_mark.wait_on(st.side_handle)
            self._direct_pending = (ids,)

    def finalize(self, out: torch.Tensor | None = None) -> torch.Tensor:
        pending, self._direct_pending = self._direct_pending, None
        if pending is None:
            return super().finalize(out)
        (ids,) = pending
        shape = (ids.shape[0], self.num_heads * self.embedding_dim)
        with annotate("prefetch_finalize", color="yellow"):
            if out is None:
                out = torch.empty(shape, dtype=self.storage_dtype, device=self.device)
                fresh = True
            else:
                if tuple(out.shape) != shape or out.dtype != self.storage_dtype or not out.is_contiguous():
                    raise ValueError(f"finalize output must be a contiguous {shape} of {self.storage_dtype}")
                fresh = False
            if self.functional:
                self._direct_rows(ids, out, None)
                return out
            st = self._direct()
            main = current_stream_handle(self.device.index)
            if fresh:  # a new block may have been in use on the main stream until now
                self._direct_rows(ids, out, main)
                return out
            self._direct_rows(ids, out, st.side_handle)
            st.side_done.record(st.side_handle)
            st.side_done.wait_on(main)
        return out

    def close(self) -> None:
        self._reset_direct()
        self._table_bytes_view = None
        super().close()
        self._staging.release()


class _DirectState:
    """What the direct path keeps between calls: the table's byte view, the pinned
    staging buffer (sized for ``prefetch_rows`` x heads rows, views cached per row
    count), the raw events that order it, and the native ``HostGather`` that does
    a call's whole work in C++ where it is built (None: the Python steps)."""

    def __init__(self, path: PinnedCPUGatherEmbedding) -> None:
        self.table = path._table_bytes()
        self.row_bytes = path.row_bytes
        self.functional = path.functional
        self._views: dict[int, torch.Tensor] = {}
        self._buf: torch.Tensor | None = None
        self._capacity = max(1, path.prefetch_rows) * path.num_heads
        self.in_use = False
        self.side_handle = 0
        if not self.functional:
            self.copied = RawEvent()  # the last copy out of staging
            self.main_mark = RawEvent()  # the main stream's work before a prefetch
            self.side_done = RawEvent()  # the side stream's copy of a prefetch
            if path._stream is None:
                path._stream = path._new_side_stream()
            self.side_handle = path._stream.cuda_stream
        self.native = None
        mod = host_gather_module() if path.native else None
        if mod is not None:
            if self.functional:
                fns, event = (0, 0, 0), 0
            else:
                rt = runtime()
                fns = tuple(ctypes.cast(f, ctypes.c_void_p).value
                            for f in (rt.cudaMemcpyAsync, rt.cudaEventRecord, rt.cudaEventSynchronize))
                event = self.copied.handle
            self.native = new_host_gather(self.table, path.storage_dtype, str(path.device),
                                          path.num_heads * path.embedding_dim, path.gather_threads, *fns, event)
            if not self.functional:
                self.grow(self._capacity)

    @property
    def capacity(self) -> int:
        """Rows the native path's staging holds (any count on the host, which stages nothing)."""
        return self._capacity if not self.functional else 1 << 62

    def grow(self, rows: int) -> None:
        """The native path's staging, ``rows`` rows at least (after the last copy out of the old one)."""
        if not self.native.wait():
            raise native_error(self.native)
        self._capacity = max(self._capacity, rows)
        self._buf = torch.empty(self._capacity, self.row_bytes, dtype=torch.uint8, pin_memory=True)
        if not self.native.set_staging(self._buf):
            raise native_error(self.native)

    def staging(self, rows: int) -> torch.Tensor:
        if self.in_use:
            self.copied.synchronize()
            self.in_use = False
        view = self._views.get(rows)
        if view is None:
            if self._buf is None or self._buf.shape[0] < rows:
                self._capacity = max(self._capacity, rows)
                self._buf = torch.empty(self._capacity, self.row_bytes, dtype=torch.uint8, pin_memory=True)
                self._views.clear()
            view = self._views[rows] = self._buf[:rows]
        return view

    def close(self) -> None:
        if not self.functional:
            if self.native is not None:
                self.native.wait()
            elif self.in_use:
                self.copied.synchronize()
            for ev in (self.copied, self.main_mark, self.side_done):
                ev.close()
        self.native = None
        self._views.clear()
        self._buf = None
        self.table = None
