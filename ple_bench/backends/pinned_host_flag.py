"""``pinned_host_flag``: the host gather started by the host right after it launches the step's
one CUDA graph, by a persistent thread team; the graph waits for the rows on a flag.

:mod:`.pinned_host_graph` makes the host gather a host node of the step's graph, so the gather starts
when the driver's callback thread runs it: 24-33 us after the replay's launch on the lent H200
hosts, with an OpenMP team woken for each node.  A server knows the step's ids on the host when
the step starts (its scheduler sampled them), so the host can start the gather itself as soon as
the launch call returns, on threads that are already awake:

    host:   launch(graph); post(ids) -> the team gathers piece 0 | piece 1 | ... into pinned
            staging; each piece, once in, gets the post's number in its pinned flag word
    graph:  main:  fork ---------------- compute (matmuls) ---------------- join -- consumer
            side:        poll(flag 0) -> copy 0 -> poll(flag 1) -> copy 1 ... --'

``post_ids`` (the decode step calls it right after each replay of the step's full graph with
host ids: a backend that declares ``posts_ids``) hands the ids to a persistent team of
``gather_threads`` threads (the native ``PostedGather``: backends/cuda/native/host_gather.cpp) and
returns at once.  In the graph, a one-program Triton kernel per piece polls that piece's flag
word (host memory, read through UVA) until it is set, zeroes it, and a ``cudaMemcpyAsync`` node
copies the piece; with ``chunks`` > 1 the copy of a piece overlaps the gather of the next.  No
SMs gather: the poll kernels occupy one SM's warp each while they wait.  The rows of the team
are handed out by one counter (dynamic scheduling), and a post is done when its last row is.

Eager calls (a lookup, a breakable step's breaks, the warm-ups before a capture) post their own
ids, then enqueue the polls and copies.  A replay not followed by a post polls for
:data:`MAX_POLLS` reads (about a second), gives up, copies stale rows (the step's byte check
catches them) and :meth:`check_deferred_errors` raises.  A post waits for the copies of the
previous one (an event recorded after them), so a replay's copies never read rows of a later post.

Needs host ids (``ids_on = "host"``): with device ids the rows' ids are not on the host when the
step starts (``NotImplementedError``: skipped).  One rank owns the whole table, as for
:mod:`.pinned_host_graph`.  On a CPU (functional mode) the team gathers and the caller waits for it on
the host, then copies staging into the output.
"""

from __future__ import annotations

import contextlib
import ctypes

import torch

from ..annotate import annotate
from .cuda.cudart import MEMCPY_H2D, RawEvent, current_stream_handle, memcpy_raw
from .host_common import default_gather_threads
from .pinned_host_graph import DEFAULT_GRAIN, PinnedHostGraphEmbedding
from .cuda.native import host_gather_module, native_error
from .cuda.uva import cuda_view_of_pinned

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
            # flags: [0] the post's number, [1] timed-out polls, [2 + piece] 0 until the piece's
            # rows are in staging (then the post's number); one program of scalar loads, which
            # zeroes the word it saw set, so that the next replay waits for the next post
            seen = tl.load(flags_ptr + 2 + piece, volatile=True)
            polls = 0
            while (seen == 0) & (polls < max_polls):
                seen = tl.load(flags_ptr + 2 + piece, volatile=True)
                polls += 1
            if seen == 0:
                tl.store(flags_ptr + 1, tl.load(flags_ptr + 1, volatile=True) + 1)
            else:
                tl.store(flags_ptr + 2 + piece, 0)

        _poll_kernel = wait_flag
    return _poll_kernel


class PinnedHostFlagEmbedding(PinnedHostGraphEmbedding):
    """Host gather started at ``post_ids`` by a persistent team; the graph polls a flag per
    piece and copies it (see the module doc)."""

    name = "pinned_host_flag"

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
        # half the cores: the team spins between posts, and the thread that launches the graph,
        # the driver's threads and torch's own intra-op team need cores beside it (with 14-15 of 16
        # cores spinning on the H200 host, a descheduled thread held a post up by ~2 ms)
        gather_threads = gather_threads or max(1, default_gather_threads() // 2)
        super().__init__(num_embeddings, embedding_dim, gather_threads=gather_threads, grain=grain, **kwargs)
        self.chunks = chunks
        self.spin_us = spin_us
        self.pin_threads = pin_threads
        self._flags: torch.Tensor | None = None  # pinned int64 [2 + chunks]
        self._flags_dev: torch.Tensor | None = None  # its UVA view (the poll kernel's argument)
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
        if self._native is None:
            mod = host_gather_module()
            if mod is None:
                raise NotImplementedError("pinned_host_flag needs the native host gather module "
                                          "(ple_bench.backends.cuda.native.native_status() says why it is missing)")
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

    # ----------------------------------------------------------- the post
    def post_ids(self, ids: torch.Tensor, launched: bool = True) -> None:
        """Start gathering the rows of host ``ids`` now; returns at once.  The decode step calls it
        right after it launched the step's one graph (``launched``: that graph's polls and copies
        consume this post); an eager call posts its own ids (``launched=False``) before it enqueues
        the polls and copies.  Waits first for the copies of the previous post (and the team for
        its rows); the ids are copied, the caller may reuse its tensor."""
        if ids.is_cuda:
            raise NotImplementedError("pinned_host_flag gathers when the ids are known on the host "
                                      "(ids_on = host); device ids reach the host only inside the step")
        flat = ids.reshape(-1)
        n = flat.numel()
        self._ensure(n)
        with annotate("post_ids", color="green"):
            if self._ids_busy:  # the copies (and polls) of the last post may still run
                self._ids_free.synchronize()
                self._ids_busy = False
            if not flat.is_contiguous():
                flat = flat.contiguous()
            # one memmove, not torch's copy: 64 KiB or more would wake torch's intra-op team
            ctypes.memmove(self._eager_ids.data_ptr(), flat.data_ptr(), n * flat.element_size())
            g = self._native.post(self._eager_ids.data_ptr(), n, flat.dtype == torch.int32,
                                  self._staging.data_ptr(), self._flags.data_ptr(), self.chunks)
            if g < 0:
                raise native_error(self._native)
            if launched and not self.functional:  # the graph just launched polls and copies for this post
                self._ids_free.record(current_stream_handle(self.device.index))
                self._ids_busy = True

    def _enqueue(self, ids: torch.Tensor, stream: int | None) -> int:
        """Post ``ids`` (eagerly); nothing during a capture (a replay's post comes from the decode
        step, right after the launch). Returns the row count."""
        if ids.is_cuda:
            raise NotImplementedError("pinned_host_flag needs host ids (ids_on = host): the host gathers "
                                      "them as the step's graph is launched")
        n = ids.numel()
        capturing = stream is not None and torch.cuda.is_current_stream_capturing()
        if capturing:
            self._ensure(n)
            self._captured.append((n, ids))
            return n
        self.post_ids(ids, launched=False)
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
