"""``pinned_host_flag``: the host gather starts when the step's ids are known on the host,
before the step's graph is launched; the graph waits for the rows on a flag.

:mod:`.host_graph` makes the host gather a host node of the step's one CUDA graph, so the
gather starts when the driver's callback thread runs it: 24-33 us after the replay's launch
on the lent H200 hosts, on the step's critical path once the gather is long (8 192 rows at
512 tokens: docs/faster-than-hbm.md).  A server knows the step's ids on the host when the
step starts (its scheduler sampled them), so nothing forces the gather to wait for the graph:

    host:   post(ids) -> team gathers piece 0 | piece 1 | ... into pinned staging, then
            writes the post's number into each piece's pinned flag word
    graph:  main:  fork ---------------- compute (matmuls) ---------------- join -- consumer
            side:        wait(flag 0) -> copy 0 -> wait(flag 1) -> copy 1 ... --'

``post_ids`` (the decode step calls it when it writes the step's host ids, before it launches
the graph: a backend that declares ``posts_ids``) hands the ids to a persistent team of
``gather_threads`` threads (the native ``PostedGather``: backends/native/host_gather.cpp) and
returns at once.  In the graph, a one-thread Triton kernel per piece polls that piece's flag
word (host memory, read through UVA) until it holds the post's number, then a
``cudaMemcpyAsync`` node copies the piece; with ``chunks`` > 1 the copy of a piece overlaps
the gather of the next.  No SMs gather: the poll kernels occupy one SM's thread each for as
long as they wait.

Eager calls (a lookup without a post, the warm-ups before a capture) post their own ids first,
unless the tensor they get is the one posted and not yet consumed.  A replay that was not
preceded by a post finds the flags at the last post's number and copies the rows already in
staging (stale: the step's byte check catches that); a poll that finds nothing for
:data:`MAX_POLLS` polls (about a second) gives up, and :meth:`check_deferred_errors` raises.

Needs host ids (``ids_on = "host"``): with device ids the rows' ids are not on the host when
the step starts (``NotImplementedError``: skipped).  One rank owns the whole table, as for
:mod:`.host_graph`.  On a CPU (functional mode) the team gathers and the caller waits for it
on the host, then copies staging into the output.
"""

from __future__ import annotations

import contextlib

import torch

from ..annotate import annotate
from .cudart import MEMCPY_H2D, RawEvent, memcpy_raw
from .extra_paths import default_gather_threads
from .host_graph import DEFAULT_GRAIN, PinnedHostGraphEmbedding
from .native import host_gather_module, native_error
from .registry import register_backend
from .uva import cuda_view_of_pinned

#: polls of a flag word before the poll kernel gives up (each poll reads host memory: ~1 us)
MAX_POLLS = 1 << 20
#: how long the team's threads spin for the next post before they sleep
DEFAULT_SPIN_US = 2000
MAX_CHUNKS = 64

_poll_kernel = None


def _build_poll_kernel():
    """The poll kernel (compiled for the GPU on first use; never run in functional mode)."""
    global _poll_kernel
    if _poll_kernel is None:
        import triton  # noqa: PLC0415  (optional heavy dependency: only a GPU step uses it)
        import triton.language as tl  # noqa: PLC0415

        @triton.jit
        def wait_flag(flags_ptr, piece, max_polls):
            # flags: [0] the post's number, [1] timed-out polls, [2 + piece] the last post whose
            # piece is in staging; one program, one thread's worth of scalar loads
            target = tl.load(flags_ptr, volatile=True)
            seen = tl.load(flags_ptr + 2 + piece, volatile=True)
            polls = 0
            while (seen != target) & (polls < max_polls):
                seen = tl.load(flags_ptr + 2 + piece, volatile=True)
                polls += 1
            if seen != target:
                tl.store(flags_ptr + 1, tl.load(flags_ptr + 1, volatile=True) + 1)

        _poll_kernel = wait_flag
    return _poll_kernel


@register_backend("pinned_host_flag")
class PinnedHostFlagEmbedding(PinnedHostGraphEmbedding):
    """Host gather started at ``post_ids`` by a persistent team; the graph polls a flag per
    piece and copies it (see the module doc)."""

    posts_ids = True

    def __init__(self, num_embeddings: int, embedding_dim: int, *, chunks: int = 1,
                 spin_us: int = DEFAULT_SPIN_US, pin_threads: bool = False, gather_threads: int = 0,
                 grain: int = DEFAULT_GRAIN, **kwargs) -> None:
        if isinstance(chunks, bool) or not isinstance(chunks, int) or not 1 <= chunks <= MAX_CHUNKS:
            raise ValueError(f"chunks must be an integer in 1..{MAX_CHUNKS}, got {chunks!r}")
        if isinstance(spin_us, bool) or not isinstance(spin_us, int) or spin_us < 0:
            raise ValueError(f"spin_us must be a non-negative integer, got {spin_us!r}")
        if not isinstance(pin_threads, bool):
            raise ValueError(f"pin_threads must be true or false, got {pin_threads!r}")
        # the team leaves a core to the thread that launches the graph
        gather_threads = gather_threads or max(1, default_gather_threads() - 1)
        super().__init__(num_embeddings, embedding_dim, gather_threads=gather_threads, grain=grain, **kwargs)
        self.chunks = chunks
        self.spin_us = spin_us
        self.pin_threads = pin_threads
        self._flags: torch.Tensor | None = None  # pinned int64 [2 + chunks]
        self._flags_dev: torch.Tensor | None = None  # its UVA view (the poll kernel's argument)
        self._posted_ids: torch.Tensor | None = None  # the tensor the last post was for, until consumed
        self._posted_n = 0
        self._timeouts_seen = 0

    # ----------------------------------------------------------- buffers
    def _ensure(self, rows: int) -> None:
        """Staging, the ids buffer, the flags and the team for ``rows`` rows at least (eagerly)."""
        if rows <= self._capacity and self._staging is not None:
            return
        if not self.functional:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError("pinned_host_flag buffers must be allocated eagerly, before a graph capture")
            torch.cuda.synchronize(self.device)
        if self._native is not None:
            self._native.wait()
        if self._captured and self._staging is not None:  # a captured graph's copies still name them
            self._kept.append((self._staging, self._eager_ids, self._flags, self._flags_dev))
        self._captured.clear()
        cap = max(rows, self._capacity, max(1, self.max_tokens) * self.num_heads)
        pin = not self.functional
        self._staging = torch.empty(cap, self.row_bytes, dtype=torch.uint8, pin_memory=pin)
        self._eager_ids = torch.empty(cap * 8, dtype=torch.uint8, pin_memory=pin)
        self._capacity = cap
        if self._flags is None:
            self._flags = torch.zeros(2 + self.chunks, dtype=torch.int64, pin_memory=pin)
            self._flags_dev = None if self.functional else cuda_view_of_pinned(self._flags, self.device)
        self._posted_ids = None
        if self._native is None:
            mod = host_gather_module()
            if mod is None:
                raise NotImplementedError("pinned_host_flag needs the native host gather module "
                                          "(ple_bench.backends.native.native_status() says why it is missing)")
            self._native = mod.PostedGather(self._table_bytes(), self.shard.num_valid, self.gather_threads,
                                            self.grain, self.spin_us, self.pin_threads)
            if self._native.error()[0]:
                raise native_error(self._native)
        if not self.functional and self._ids_free is None:
            self._ids_free = RawEvent()

    def _retire(self) -> None:
        if self._native is not None:
            self._host_s_base += self._live_host_s()
            self._native.stop()
        self._native = None
        self._posted_ids = None

    # ----------------------------------------------------------- the post
    def post_ids(self, ids: torch.Tensor) -> None:
        """Start gathering the rows of host ``ids`` now (the step's ids, written before its graph
        is launched); returns at once.  Waits for the previous post's rows and for the last eager
        copy out of staging first.  The ids are copied: the caller may reuse its tensor."""
        if ids.is_cuda:
            raise NotImplementedError("pinned_host_flag gathers when the ids are known on the host "
                                      "(ids_on = host); device ids reach the host only inside the step")
        flat = ids.reshape(-1)
        n = flat.numel()
        self._ensure(n)
        with annotate("post_ids", color="green"):
            self._native.wait()
            if self._ids_busy:  # an eager copy out of staging may still run
                self._ids_free.synchronize()
                self._ids_busy = False
            nbytes = n * flat.element_size()
            self._eager_ids[:nbytes].copy_(flat.contiguous().view(torch.uint8))
            g = self._native.post(self._eager_ids.data_ptr(), n, flat.dtype == torch.int32,
                                  self._staging.data_ptr(), self._flags.data_ptr(), self.chunks)
            if g < 0:
                raise native_error(self._native)
        self._posted_ids = ids
        self._posted_n = n

    def _enqueue(self, ids: torch.Tensor, stream: int | None) -> int:
        """Post ``ids`` unless they are the ones posted and not yet consumed (eagerly); nothing
        during a capture (the replay's post comes from ``post_ids``). Returns the row count."""
        if ids.is_cuda:
            raise NotImplementedError("pinned_host_flag needs host ids (ids_on = host): it gathers "
                                      "before the step's graph is launched")
        n = ids.numel()
        capturing = stream is not None and torch.cuda.is_current_stream_capturing()
        if capturing:
            self._ensure(n)
            self._captured.append((n, ids))
            return n
        if self._posted_ids is not ids or self._posted_n != n:
            self.post_ids(ids)
        self._posted_ids = None
        return n

    def _side_context(self, stream: int):
        """The torch stream whose handle is ``stream`` made current (the poll kernel is launched
        by Triton on torch's current stream)."""
        if self._stream is not None and stream == self._stream.cuda_stream:
            return torch.cuda.stream(self._stream)
        return contextlib.nullcontext()

    def _copy_out(self, target: torch.Tensor, n: int, stream: int | None) -> None:
        """Per piece: poll its flag, then copy its rows from staging into ``target`` on ``stream``
        (on a CPU: wait for the team, then copy)."""
        if stream is None:
            if not self._native.wait():
                raise native_error(self._native)
            self.check_deferred_errors()
            target.view(torch.uint8).view(n, -1).copy_(self._staging[:n])
            return
        kernel = _build_poll_kernel()
        bounds = self._native.chunk_bounds(n, self.chunks)
        rb = self.row_bytes
        with annotate("copy_issue", color="green"), self._side_context(stream):
            for piece in range(self.chunks):
                lo, hi = bounds[piece], bounds[piece + 1]
                if hi == lo:
                    continue
                kernel[(1,)](self._flags_dev, piece, MAX_POLLS, num_warps=1)
                memcpy_raw(target.data_ptr() + lo * rb, self._staging.data_ptr() + lo * rb, (hi - lo) * rb,
                           MEMCPY_H2D, stream)
        if not torch.cuda.is_current_stream_capturing():
            self._ids_free.record(stream)
            self._ids_busy = True

    def check_deferred_errors(self) -> None:
        """Raise what the team or the poll kernels recorded since the last check (after a sync):
        ``IndexError`` for an id past the table, ``RuntimeError`` for a poll that timed out."""
        nat = self._native
        if nat is None:
            return
        pos, bad_id = nat.bad()
        if pos >= 0:
            nat.clear()
            raise IndexError(f"index {bad_id} (position {pos}) is out of range for a table of "
                             f"{self.shard.num_valid} rows (pinned_host_flag)")
        if self._flags is not None:
            timeouts = int(self._flags[1])
            if timeouts > self._timeouts_seen:
                self._timeouts_seen = timeouts
                raise RuntimeError(f"pinned_host_flag: {timeouts} poll(s) of a piece's flag timed out after "
                                   f"{MAX_POLLS} reads (a replay whose rows were never posted)")

    def _live_host_s(self) -> float:
        nat = getattr(self, "_native", None)
        if nat is None:
            return 0.0
        return nat.timing()[4] / 1e9

    def host_node_timing(self) -> list[dict[str, float]]:
        """The team's ``posts``, the last post's start and end on the host's monotonic clock
        (``last_start_ns``, ``last_end_ns``: post -> every row in), ``last_us``, ``mean_us``, and the
        team's CPU time in its jobs (``cpu_s``)."""
        nat = self._native
        if nat is None:
            return []
        posts, start, end, total, cpu = nat.timing()
        return [{"task": 0, "runs": posts, "stale_runs": 0, "last_start_ns": start, "last_end_ns": end,
                 "last_us": (end - start) / 1e3, "mean_us": total / 1e3 / posts if posts else None,
                 "cpu_s": cpu / 1e9}]

    def stats(self) -> dict:
        """``gather_impl``: ``posted_team`` (the native team); ``chunks``, ``gather_threads``."""
        out = dict(super().stats())
        out["gather_impl"] = "posted_team" if self._native is not None else "none"
        out["chunks"] = self.chunks
        out["gather_threads"] = self.gather_threads
        return out

    def close(self) -> None:
        super().close()
        self._flags = None
        self._flags_dev = None
