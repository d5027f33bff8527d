"""Backend 2: the shard in pinned host memory, read by the GPU through a UVA
view, with an asynchronous prefetch on a side stream.

The side stream takes a priority (``stream_priority``) and may be limited to a
number of SMs (``sm_limit`` > 0: a green-context stream, see :mod:`.green`;
``sm_limit_granted`` / ``green_via`` say what the driver gave and how).
Subclasses whose gather uses no SMs refuse ``sm_limit`` (``sm_limit_refusal``).

The table's host memory is allocated as ``host_alloc`` says (see
:mod:`.host_alloc`): ``"torch"`` (torch's caching allocator, power-of-two
blocks; the default), ``"exact"`` or ``"exact_huge"`` (exactly the table's bytes
pinned with ``cudaHostRegister``, freed exactly on :meth:`close`); every
subclass (CPU gather, copy engines, hot cache) reads the table either way.
``host_allocation`` records what it took.

On a machine without a GPU the same code runs in *functional mode*: the table is
ordinary host memory (pinning needs CUDA), the Triton kernel runs under the
interpreter, and the prefetch is synchronous.  ``functional`` says which."""

from __future__ import annotations

import threading
from typing import Sequence

import torch

from ..annotate import annotate
from .base import PLEEmbedding, check_out
from .cuda.green import GreenContextUnavailable, GreenHandle, shared_green_stream
from .cuda.host_alloc import HandedTable, HostAllocation, allocate_pinned, check_mode
from .cuda.uva import cuda_view_of_pinned, uva_available


class PinnedUVAEmbedding(PLEEmbedding):
    name = "pinned_uva"
    supports_prefetch = True
    table_in_host_memory = True
    takes_table = True
    default_kernel = "triton_reference"
    side_stream_settings = frozenset({"stream_priority", "sm_limit"})
    #: why this path refuses ``sm_limit`` ("" = it accepts it): set by subclasses whose
    #: side-stream work is not done by SMs
    sm_limit_refusal: str = ""

    def __init__(
        self, num_embeddings: int, embedding_dim: int, *, stream_priority: int = 0,
        sm_limit: int = 0, host_alloc: str = "torch", table: HandedTable | None = None, **kwargs
    ) -> None:
        # read by allocate_table, which the base constructor calls
        self.host_alloc = check_mode(host_alloc)
        self._host_allocation: HostAllocation | None = None
        self._handed = table  # a filled table another backend gave up (hand_over_table): used as is
        if isinstance(sm_limit, bool) or not isinstance(sm_limit, int) or sm_limit < 0:
            raise ValueError(f"sm_limit must be a non-negative integer (0 = no limit), got {sm_limit!r}")
        if sm_limit and self.sm_limit_refusal:
            raise NotImplementedError(f"sm_limit={sm_limit}: {self.sm_limit_refusal}")
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            ok, why = uva_available(device)
            if not ok:
                raise RuntimeError(f"Engram CPU offload requires UVA support: {why}")
        super().__init__(num_embeddings, embedding_dim, **kwargs)
        self._uva = cuda_view_of_pinned(self.weight, self.device) if not self.functional else self.weight
        self._stream: torch.cuda.Stream | None = None
        self._buffer: torch.Tensor | None = None
        self._alloc_lock = threading.Lock()
        self._inflight_ids: torch.Tensor | None = None
        self._buffer_free: torch.cuda.Event | None = None  # main stream done reading the buffer
        self.prefetch_rows = self.max_tokens * self.topology.replicas
        # priority of the side stream (lower = higher priority); read when it is created
        self.stream_priority = int(stream_priority)
        # SMs the side stream may use (0 = all); read when it is created
        self.sm_limit = int(sm_limit)
        self._green: GreenHandle | None = None

    def allocate_table(self, rows: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
        handed, self._handed = self._handed, None
        if handed is not None:
            if (tuple(handed.weight.shape) != (rows, dim) or handed.weight.dtype != dtype
                    or handed.allocation.mode != self.host_alloc):
                raise ValueError(f"table=: a {tuple(handed.weight.shape)} {handed.weight.dtype} table allocated "
                                 f"{handed.allocation.mode}, this backend needs ({rows}, {dim}) {dtype} "
                                 f"allocated {self.host_alloc}")
            self._host_allocation = handed.allocation
            return handed.weight
        table, self._host_allocation = allocate_pinned(rows, dim, dtype, self.host_alloc, self.device)
        return table

    def hand_over_table(self) -> HandedTable | None:
        """The filled table and its allocation, for another pinned path to read (``table=``);
        this backend lets go of both (its close frees nothing of them)."""
        if self.weight is None or self._host_allocation is None:
            return None
        handed = HandedTable(self.weight, self._host_allocation)
        self._host_allocation = None
        return handed

    @property
    def host_allocation(self) -> HostAllocation | None:
        return self._host_allocation

    def table_for_kernel(self) -> torch.Tensor:
        return self._uva

    @property
    def prefetch_stream(self) -> torch.cuda.Stream | None:
        return self._stream

    @property
    def prefetch_buffer(self) -> torch.Tensor | None:
        return self._buffer

    @property
    def sm_limit_granted(self) -> int | None:
        """SMs the driver gave the side stream's green context (None: no limit,
        not created yet, or not known)."""
        return self._green.granted_sms if self._green is not None else None

    @property
    def green_via(self) -> str | None:
        """How the green context was made ("torch" / "cuda.bindings"), None without one."""
        return self._green.via if self._green is not None else None

    def _new_side_stream(self) -> torch.cuda.Stream:
        if self.sm_limit:
            # shared per (device, SMs, priority) and kept for the process: tensors that were
            # record_stream-ed on it (the caller's ids) may outlive this backend
            stream, self._green = shared_green_stream(self.device, self.sm_limit, self.stream_priority)
            return stream
        return torch.cuda.Stream(device=self.device, priority=self.stream_priority)

    def close(self) -> None:
        if self._stream is not None and self._inflight_ids is not None:
            self._stream.synchronize()  # a prefetch never finalized: let it finish reading
        self._green = None  # the shared green context lives on (see green.shared_green_stream)
        self._stream = None
        self._uva = None  # type: ignore[assignment]
        self._buffer = None
        self._inflight_ids = None
        self._buffer_free = None
        super().close()
        if self._host_allocation is not None:
            self._host_allocation.close()  # exact: unregistered and unmapped now

    def set_max_tokens(self, max_tokens: int) -> None:
        """As :meth:`PLEEmbedding.set_max_tokens`; a prefetch buffer of another size
        is dropped (the next prefetch allocates one of the new size), the side stream kept."""
        super().set_max_tokens(max_tokens)
        rows = self.max_tokens * self.topology.replicas
        if rows != self.prefetch_rows:
            if self._stream is not None:
                self._stream.synchronize()  # nothing may still write the old buffer
            self.prefetch_rows = rows
            self._buffer = None
            self._buffer_free = None

    # ----------------------------------------------------------- prefetch
    def prepare_prefetch(self) -> torch.Tensor:
        """Allocate the persistent prefetch buffer and side stream (eagerly:
        refused during CUDA-graph capture)."""
        buffer = self._buffer
        if buffer is not None:
            return buffer
        with self._alloc_lock:
            if self._buffer is not None:
                return self._buffer
            if self.prefetch_rows <= 0:
                raise ValueError("prefetch needs max_tokens > 0 (the buffer's size per DP rank)")
            if self.functional:
                if self.sm_limit:
                    raise GreenContextUnavailable(
                        f"sm_limit={self.sm_limit} needs CUDA (green contexts); functional mode has no streams"
                    )
            else:
                if torch.cuda.is_current_stream_capturing():
                    raise RuntimeError(
                        "pinned PLE prefetch buffer must be allocated eagerly, before cudagraph capture"
                    )
                if self._stream is None:
                    self._stream = self._new_side_stream()
            self._buffer = torch.empty(
                self.prefetch_rows, self.num_heads, self.embedding_dim,
                dtype=self.storage_dtype, device=self.device,
            )
            return self._buffer

    def _prefetch_target(self, ids: torch.Tensor, dp_token_counts: Sequence[int] | None):
        """The prefetch buffer, the DP-gathered ids, the slot size and the local
        token count; refuses a batch larger than the buffer.  Host ids stay on the
        host here when no DP gather is needed (the caller decides where they go)."""
        buffer = self.prepare_prefetch()
        local = ids.shape[0]
        slot = self.slot_size(local, dp_token_counts)
        if self.topology.replicas > 1:
            ids = self.device_ids(ids)  # the DP gather (NCCL) needs device tensors
        gathered = self.gather_ids(ids, slot)
        if gathered.shape[0] > buffer.shape[0]:
            raise ValueError(
                f"pinned PLE prefetch buffer holds {buffer.shape[0]} rows, "
                f"but the batch needs {gathered.shape[0]}"
            )
        return buffer, gathered, slot, local

    def _side_stream_start(self, ids_from_host: bool) -> None:
        """Order the side stream before a prefetch: after the main stream when the
        ids come from it (device ids), else only after the previous step's
        consumer has read the prefetch buffer (host ids need nothing else)."""
        main = torch.cuda.current_stream(self.device)
        if ids_from_host and self._buffer_free is not None and not torch.cuda.is_current_stream_capturing():
            self._stream.wait_event(self._buffer_free)
        else:  # device ids, the first prefetch, or inside a graph capture (a fork from the main stream)
            self._stream.wait_stream(main)

    def start_prefetch(
        self, ids: torch.Tensor, dp_token_counts: Sequence[int] | None = None
    ) -> None:
        """Gather ids over DP and launch their lookup on the side stream (host ids
        are copied to the device there, not on the main stream)."""
        self._check_ids(ids)
        with annotate("prefetch_start", color="yellow"):
            buffer, gathered, slot, local = self._prefetch_target(ids, dp_token_counts)
            active = buffer[: gathered.shape[0]]
            if self._stream is not None:
                from_host = gathered.device.type == "cpu"
                self._side_stream_start(from_host)
                with torch.cuda.stream(self._stream):
                    dev_ids = self.device_ids(gathered)  # on the side stream
                    if not from_host:
                        dev_ids.record_stream(self._stream)
                    self._inflight_ids = dev_ids  # alive until finalize joins the stream
                    self.local_lookup(dev_ids, out=active)
            else:
                self.local_lookup(gathered, out=active)
            self._pending = (gathered.shape[0], slot, local)

    def finalize(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """Join the side stream, reduce over ETP, select this DP rank's rows."""
        if self._pending is None or self._buffer is None:
            raise RuntimeError("pinned PLE finalize requires a prior start_prefetch")
        with annotate("prefetch_finalize", color="yellow"):
            n, slot, local = self._pending
            self._pending = None
            main = torch.cuda.current_stream(self.device) if self._stream is not None else None
            if main is not None:
                main.wait_stream(self._stream)
            self._inflight_ids = None
            rows = self._select(self.reduce_rows(self._buffer[:n]), slot, local)
            rows = rows.reshape(local, self.num_heads * self.embedding_dim)
            if out is None:
                rows = rows.clone()
            else:
                check_out(out, rows)
                out.copy_(rows)
            if main is not None and not torch.cuda.is_current_stream_capturing():
                if self._buffer_free is None:  # one event, re-recorded: the buffer is free once main read it
                    self._buffer_free = torch.cuda.Event()
                self._buffer_free.record(main)
            return rows if out is None else out
