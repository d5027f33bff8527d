"""``pinned_host_graph``: the CPU gather as stream work -- a host node and a copy that a
CUDA graph captures, so a decode step with a host-resident table is ONE graph replay.

The rows of a lookup are gathered by the host's cores into pinned staging by a *host
function* enqueued on a stream (``cudaLaunchHostFunc``, the native module's
``HostGraphGather``: backends/cuda/native/host_gather.cpp), then one ``cudaMemcpyAsync``
staging -> output follows it on the same stream.  Enqueued during a stream capture they
become a host node and a memcpy node of the graph.  A prefetch forks a side stream from
the main stream, so in a full-graph step the branch

    main:  fork --------------- compute (matmuls) ---------- join -- consumer
    side:        host node (gather) -- memcpy node (copy) --'

runs beside the compute, and the replay is one launch: no eager break, no Python in the
step.  Nothing of the lookup blocks the calling thread (``blocks_host`` is False): the
host function runs on the CUDA driver's callback thread, with its own OpenMP team of
``gather_threads`` threads (no CUDA call inside it).

Why a backend of its own rather than a mode of ``pinned_cpu_gather``: that path's calls do
their work on the calling thread (``blocks_host``), which is what the engine times and
refuses to capture; this one declares ``host_work_capturable`` and never blocks, and the
two are measured side by side in the same step.

Where the ids are:

* host ids, eagerly: copied at once into the path's own pinned ids buffer (the caller may
  reuse its tensor); the next eager call waits until the host function that read them ran;
* host ids, during a capture: the host node reads the caller's tensor *when it runs* -- the
  ids must be a static pinned buffer that the scheduler fills before each replay, once
  the previous replay is done (a server needs that step's sampled tokens first; the
  decode step's ``set_inputs`` synchronizes before it writes host ids).  The tensor is
  kept alive while the backend lives;
* device ids: a device->host memcpy node into the path's pinned ids buffer precedes the
  host node (the ids are read on the host either way: ``reads_ids_on_host``).

Hazards: staging is shared by every call and every captured graph -- graph replays and
eager calls on one device are ordered by the streams (a replay's side branch ends before
the graph does; a prefetch's side stream waits for the main stream's work), so a host
node never overwrites rows a copy has not read.  An id past the table does not crash the
host node: its row is filled with 0x7F bytes (never a valid row) and the task records
the first such id; :meth:`PinnedHostGraphEmbedding.check_deferred_errors` (after a sync)
raises ``IndexError``.  Tasks live in the native object; on :meth:`close`, or when a larger
batch needs larger buffers (a new case on the same table), they are retired (kept for the
process, touching nothing; the old buffers kept until close), so a graph captured before
does no harm if replayed: its rows are stale, which the step's byte check catches.

One rank owns the whole table (ETP = DP = 1): the ETP reduce and the DP id gather are not
captured here (a host node cannot take part in a collective); other topologies are
refused (``NotImplementedError``: skipped).  On a CPU (functional mode) the host function
runs synchronously on the calling thread, the same native row loop (or ``index_select``
where the module does not build).
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..annotate import annotate
from .cuda.cudart import MEMCPY_D2H, MEMCPY_H2D, RawEvent, current_stream_handle, function_address, memcpy_raw
from .host_common import default_gather_threads
from .formats import int_view
from .cuda.native import host_gather_module, native_error, new_host_graph_gather
from .pinned_uva import PinnedUVAEmbedding

#: rows per OpenMP task of the host node's row loop (as the CPU gather's native loop)
DEFAULT_GRAIN = 64


class PinnedHostGraphEmbedding(PinnedUVAEmbedding):
    """Host gather as a host node + one copy node: capturable whole (see the module doc)."""

    name = "pinned_host_graph"

    blocks_host = False
    reads_ids_on_host = True
    gathers_on_host = True
    host_work_capturable = True
    default_kernel = "torch_masked"  # not used: the host node does the lookup
    side_stream_settings = frozenset({"stream_priority"})
    sm_limit_refusal = ("pinned_host_graph gathers on the host's cores and copies with the copy engines; "
                        "no SMs run its lookup, so an SM limit does not apply")

    def __init__(self, num_embeddings: int, embedding_dim: int, *, gather_threads: int = 0,
                 grain: int = DEFAULT_GRAIN, **kwargs) -> None:
        if isinstance(gather_threads, bool) or not isinstance(gather_threads, int) or gather_threads < 0:
            raise ValueError(f"gather_threads must be a non-negative integer, got {gather_threads!r}")
        if isinstance(grain, bool) or not isinstance(grain, int) or grain < 1:
            raise ValueError(f"grain must be a positive integer, got {grain!r}")
        super().__init__(num_embeddings, embedding_dim, **kwargs)
        topo = self.topology
        if topo.etp != 1 or topo.replicas != 1 or self.groups.etp_group is not None:
            raise NotImplementedError(
                "pinned_host_graph needs one rank owning the whole table (ETP = 1, no DP id gather): its "
                "host node cannot take part in the ETP reduce or the DP gather")
        self.gather_threads = gather_threads or default_gather_threads()
        self.grain = grain
        self._native = None  # HostGraphGather, or None (functional mode without the module)
        self._capacity = 0  # rows the staging and the ids buffers hold
        self._staging: torch.Tensor | None = None  # pinned uint8 [capacity, row_bytes]
        self._eager_ids: torch.Tensor | None = None  # pinned uint8 [capacity * 8]: eager ids
        self._capture_ids: torch.Tensor | None = None  # pinned uint8 [capacity * 8]: captured device ids
        self._eager_tasks: dict[tuple[int, bool], int] = {}  # (rows, int32 ids) -> task
        self._captured: list[tuple[int, torch.Tensor]] = []  # (task, the ids tensor it reads)
        # buffers of retired tasks that a captured graph's memcpy nodes still name (freed on close)
        self._kept: list[tuple] = []
        self._ids_free: RawEvent | None = None  # the last eager host function has read _eager_ids
        self._ids_busy = False
        self._host_pending: tuple | None = None  # start_prefetch -> finalize: (tokens, rows, ids)

    # ----------------------------------------------------------- buffers
    def _table_bytes(self) -> torch.Tensor:
        return self.weight.view(torch.uint8).view(self.weight.shape[0], -1)

    def _ensure(self, rows: int) -> None:
        """Staging, ids buffers and the native object for ``rows`` rows at least (eagerly)."""
        if rows <= self._capacity and (self._native is not None or self._staging is not None):
            return
        if not self.functional:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError("pinned_host_graph buffers must be allocated eagerly, before a graph capture")
            torch.cuda.synchronize(self.device)  # nothing may still use the old buffers
        self._retire()
        if self._captured:  # graphs captured with the old buffers may outlive this: keep them alive
            self._kept.append((self._staging, self._eager_ids, self._capture_ids, list(self._captured)))
            self._captured.clear()
        cap = max(rows, self._capacity, max(1, self.max_tokens) * self.num_heads)
        pin = not self.functional
        self._staging = torch.empty(cap, self.row_bytes, dtype=torch.uint8, pin_memory=pin)
        self._eager_ids = torch.empty(cap * 8, dtype=torch.uint8, pin_memory=pin)
        self._capture_ids = torch.empty(cap * 8, dtype=torch.uint8, pin_memory=pin) if pin else None
        self._capacity = cap
        mod = host_gather_module()
        if mod is None:
            if not self.functional:
                raise NotImplementedError("pinned_host_graph needs the native host gather module "
                                          "(ple_bench.backends.cuda.native.native_status() says why it is missing)")
            return
        launch = 0 if self.functional else function_address("cudaLaunchHostFunc")
        if not self.functional and not launch:
            raise NotImplementedError("pinned_host_graph needs torch's libcudart (cudaLaunchHostFunc)")
        self._native = new_host_graph_gather(self._table_bytes(), self.shard.num_valid, self.gather_threads,
                                             self.grain, launch)
        if not self.functional and self._ids_free is None:
            self._ids_free = RawEvent()

    def _retire(self) -> None:
        if self._native is not None:
            self._host_s_base += self._live_host_s()
            self._native.retire()
        self._native = None
        self._eager_tasks.clear()
        self._ids_busy = False

    def prepare_prefetch(self) -> torch.Tensor:
        buffer = super().prepare_prefetch()
        self._ensure(self.prefetch_rows * self.num_heads)
        return buffer

    def set_max_tokens(self, max_tokens: int) -> None:
        super().set_max_tokens(max_tokens)
        if self._capacity and max_tokens * self.num_heads > self._capacity:
            self._ensure(max_tokens * self.num_heads)

    # ----------------------------------------------------------- the host node
    def _enqueue(self, ids: torch.Tensor, stream: int | None) -> int:
        """The host function gathering the rows of ``ids`` into staging, enqueued on
        ``stream`` (run now on a CPU); returns the row count."""
        flat = ids.reshape(-1)
        if not flat.is_contiguous():
            flat = flat.contiguous()
        n = flat.numel()
        self._ensure(n)
        ids32 = flat.dtype == torch.int32
        nbytes = n * flat.element_size()
        capturing = stream is not None and torch.cuda.is_current_stream_capturing()
        if capturing:
            if flat.is_cuda:  # a device->host memcpy node, then the host node reads the copy
                memcpy_raw(self._capture_ids.data_ptr(), flat.data_ptr(), nbytes, MEMCPY_D2H, stream)
                src = self._capture_ids.data_ptr()
            elif flat.is_pinned():
                src = flat.data_ptr()
            else:
                raise RuntimeError("pinned_host_graph: a captured host node reads its ids when the graph "
                                   "runs: give a static pinned host tensor (or device ids)")
            task = self._native.task(src, n, ids32, self._staging.data_ptr())
            if task < 0:
                raise native_error(self._native)
            self._captured.append((task, flat))  # alive as long as the graph may read it
        else:
            if self._ids_busy:  # the last eager host function may still read the ids buffer
                self._ids_free.synchronize()
                self._ids_busy = False
            dst = self._eager_ids[:nbytes]
            if flat.is_cuda:
                memcpy_raw(dst.data_ptr(), flat.data_ptr(), nbytes, MEMCPY_D2H, stream)
            else:
                dst.copy_(flat.view(torch.uint8))
            key = (n, ids32)
            if self._native is None:  # functional mode without the module
                self._python_rows(flat, n)
                return n
            task = self._eager_tasks.get(key)
            if task is None:
                task = self._native.task(self._eager_ids.data_ptr(), n, ids32, self._staging.data_ptr())
                if task < 0:
                    raise native_error(self._native)
                self._eager_tasks[key] = task
        if stream is None:
            if not self._native.run(task):
                raise native_error(self._native)
            self.check_deferred_errors()  # it ran synchronously: report a bad id now
            return n
        with annotate("host_node_enqueue", color="green"):
            if not self._native.launch(task, stream):
                raise native_error(self._native)
        if not capturing:
            self._ids_free.record(stream)
            self._ids_busy = True
        return n

    def _python_rows(self, flat: torch.Tensor, n: int) -> None:
        """Functional mode without the native module: the same rows, by ``index_select``."""
        table = self._table_bytes()[: self.shard.num_valid]
        torch.index_select(table, 0, flat.to(torch.int64), out=self._staging[:n])

    def _copy_out(self, target: torch.Tensor, n: int, stream: int | None) -> None:
        """Staging's ``n`` rows into ``target`` (contiguous, ``n * row_bytes`` bytes) on ``stream``."""
        if stream is None:
            target.view(torch.uint8).view(n, -1).copy_(self._staging[:n])
            return
        with annotate("copy_issue", color="green"):
            memcpy_raw(target.data_ptr(), self._staging.data_ptr(), n * self.row_bytes, MEMCPY_H2D, stream)

    def check_deferred_errors(self) -> None:
        """Raise what the host nodes recorded since the last check (call after a sync of the
        streams they ran on): ``IndexError`` for an id past the table, ``RuntimeError`` for a
        host node of a retired task that ran (a graph replayed after the buffers changed)."""
        nat = self._native
        if nat is None:
            return
        for task in range(nat.tasks()):
            pos, bad_id = nat.bad(task)
            if pos >= 0:
                nat.clear(task)
                raise IndexError(f"index {bad_id} (position {pos}) is out of range for a table of "
                                 f"{self.shard.num_valid} rows (pinned_host_graph host node)")

    @property
    def host_thread_s(self) -> float:
        """CPU time of the threads that ran this path's host nodes (the CUDA driver's callback
        thread, or the caller's in functional mode; the OpenMP team's other threads are not
        counted, as the CPU gather counts its calling thread only), retired tasks included."""
        return self._host_s_base + self._live_host_s()

    @host_thread_s.setter
    def host_thread_s(self, value: float) -> None:  # the base constructor zeroes it
        self._host_s_base = float(value) - self._live_host_s()

    def _live_host_s(self) -> float:
        nat = getattr(self, "_native", None)
        if nat is None:
            return 0.0
        return sum(nat.timing(t)[5] for t in range(nat.tasks())) / 1e9

    def host_node_timing(self) -> list[dict[str, float]]:
        """Per task: ``runs`` and the wall time of the host node's gather (``last_us``, ``mean_us``),
        its last start/end on the host's monotonic clock (``last_start_ns``, ``last_end_ns``) and
        the CPU time of the thread that ran it (``cpu_s``, every run together)."""
        nat = self._native
        out = []
        if nat is None:
            return out
        for task in range(nat.tasks()):
            runs, stale, start, end, total, cpu = nat.timing(task)
            out.append({"task": task, "runs": runs, "stale_runs": stale, "last_start_ns": start,
                        "last_end_ns": end, "last_us": (end - start) / 1e3,
                        "mean_us": total / 1e3 / runs if runs else None, "cpu_s": cpu / 1e9})
        return out

    # ----------------------------------------------------------- lookup
    def local_lookup(self, ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The rows of ``ids`` into ``out`` on the current stream: a host function, then one
        host->device copy (both captured when the stream is capturing)."""
        out = self._lookup_output(ids, out)
        stream = None if self.functional else current_stream_handle(self.device.index)
        with annotate("lookup", color="green"):
            n = self._enqueue(ids, stream)
            target = out if out.is_contiguous() else torch.empty_like(out)
            self._copy_out(target, n, stream)
            if target is not out:
                out.copy_(target)
        return out

    # ----------------------------------------------------------- prefetch
    def start_prefetch(self, ids: torch.Tensor, dp_token_counts: Sequence[int] | None = None) -> None:
        """Fork the side stream from the main stream and enqueue the host node there."""
        self._check_ids(ids)
        self.slot_size(ids.shape[0], dp_token_counts)
        buffer = self.prepare_prefetch()
        if ids.shape[0] > buffer.shape[0]:
            raise ValueError(f"pinned PLE prefetch buffer holds {buffer.shape[0]} rows, "
                             f"but the batch needs {ids.shape[0]}")
        with annotate("prefetch_start", color="yellow"):
            if self.functional:  # synchronous: the host node runs at finalize
                self._host_pending = (ids.shape[0], None, ids)
                return
            main = torch.cuda.current_stream(self.device)
            self._stream.wait_stream(main)  # fork: after the main stream's work so far
            n = self._enqueue(ids, self._stream.cuda_stream)
            self._host_pending = (ids.shape[0], n, ids if ids.is_cuda else None)

    def finalize(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """Enqueue the copy staging -> ``out`` on the side stream and join it on the main stream."""
        pending, self._host_pending = self._host_pending, None
        if pending is None:
            raise RuntimeError("pinned PLE finalize requires a prior start_prefetch")
        tokens, n, ids = pending
        shape = (tokens, self.num_heads * self.embedding_dim)
        with annotate("prefetch_finalize", color="yellow"):
            if self.functional:
                n = self._enqueue(ids, None)
            direct = (out is not None and tuple(out.shape) == shape and out.dtype == self.storage_dtype
                      and out.is_contiguous() and out.device == self.device)
            target = out if direct else self._buffer[:tokens]
            side = None if self.functional else self._stream.cuda_stream
            self._copy_out(target, n, side)
            if side is not None:
                main = torch.cuda.current_stream(self.device)
                with annotate("join", color="yellow"):
                    main.wait_stream(self._stream)
                if ids is not None:
                    ids.record_stream(self._stream)  # device ids read by the side stream's D2H copy
            if direct:
                return out
            rows = target.reshape(shape)
            if out is None:
                return rows.clone()
            if tuple(out.shape) != shape or out.dtype != rows.dtype or out.device != rows.device:
                raise ValueError(f"output must be {shape} {rows.dtype} on {rows.device}, "
                                 f"got {tuple(out.shape)} {out.dtype} on {out.device}")
            out.copy_(rows)
            return out

    def stats(self) -> dict:
        """``gather_impl``: ``host_node`` (the native host function) or ``python`` (functional
        mode without the native module)."""
        out = dict(super().stats())
        out["gather_impl"] = "host_node" if self._native is not None else (
            "python" if self._staging is not None else "none")
        return out

    def close(self) -> None:
        if not self.functional and self._native is not None:
            torch.cuda.synchronize(self.device)  # no host node still runs
        self._retire()
        self._captured.clear()
        self._kept.clear()
        self._staging = None
        self._eager_ids = None
        self._capture_ids = None
        self._host_pending = None
        if self._ids_free is not None:
            self._ids_free.close()
            self._ids_free = None
        super().close()
