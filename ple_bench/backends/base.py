"""The interface every PLE embedding backend implements, and the behaviour the
two reference backends share: vocab-parallel shard geometry, the DP id gather,
the byte-exact ETP reduce and the DP slot selection.

Call sequence of one decode step::

    backend.start_prefetch(ids, dp_token_counts)   # at layer entry (may launch work)
    ... model compute ...
    rows = backend.finalize()                      # [tokens, heads * dim], storage dtype
    acts = backend.dequantize(rows, torch.bfloat16)

or, synchronously, ``rows = backend.lookup(ids, dp_token_counts)``.

``ids`` is ``[tokens, heads]`` int64 of *global* row ids (each head's ids already
offset into its own range), on the GPU (produced by an earlier kernel) or in
(pinned) host memory (known to the host when the step starts, as a server's
scheduler knows them).  A path that reads ids on the host
(:attr:`PLEEmbedding.reads_ids_on_host`) copies device ids to the host itself
(a blocking device->host copy); every other path copies host ids to the device
as part of its own work (on the side stream when prefetching).  ``dp_token_counts`` is the token count of every DP
rank (a list of DP ints); it is needed only when ETP spans DP (``ETP / TP > 1``),
and stands in for vLLM's forward context.

The contract
------------
Everything the engine (``run/``: the executor, the step, the loop) reads or calls on a
backend is declared here, with a default, so a plug-in author knows what to
implement and a renamed attribute fails loudly instead of silently changing a
result.  :func:`ple_bench.testing.check_backend` checks a backend against it.

*Capabilities* (class attributes, :data:`CAPABILITIES` gives their types):
``supports_prefetch``, ``table_in_host_memory``, ``blocks_host``,
``reads_ids_on_host``, ``gathers_on_host`` (the host's cores gather the rows: the host-gather
ceiling binds the path), ``takes_table`` (its constructor takes ``table=``, a filled table another
backend gave up with :meth:`PLEEmbedding.hand_over_table`), ``host_work_capturable`` (the path's
host work is enqueued as stream work -- host functions and copies -- so a CUDA graph captures it
whole: the engine allows ``graph = "full"`` for it), ``posts_ids`` (the path starts its host work
when the step's one graph has been launched: the step calls :meth:`PLEEmbedding.post_ids` with its
host ids right after the launch), ``default_kernel`` (the lookup kernel when a case names none),
``cpu_kernel`` (the same in functional mode on a CPU, where it differs: "" = ``default_kernel``),
``warms_cache`` (:meth:`PLEEmbedding.warm_cache` wants a sample of past traffic before it is
measured), ``side_stream_settings`` (which of :data:`SIDE_STREAM_SETTINGS` the prefetch side
stream honours) and
``sm_limit_refusal`` (why ``sm_limit`` does not apply, "" if it does).
Per instance: :attr:`PLEEmbedding.supports_grid_cap` (the lookup kernel takes a
grid cap, see :attr:`PLEEmbedding.grid_cap`) and :attr:`PLEEmbedding.reads_sorted` (the lookup
kernel reads the table's rows in ascending id order: its random-row ceiling is gathered in
sorted order too).

*Settings* (instance attributes with defaults): ``stream_priority``,
``sm_limit`` (set through :meth:`PLEEmbedding.set_side_stream_setting`),
``grid_cap`` (most programs the lookup kernel launches; None: no cap) and the
kernel (:meth:`PLEEmbedding.set_kernel`; :meth:`PLEEmbedding.kernel_for` says which kernel a
case runs on a device: the one rule for a fresh backend and a reused table).

*Operations*: ``lookup``, ``start_prefetch``/``finalize``, ``prepare_prefetch``,
``dequantize``, ``fill_synthetic``/``load_full_table``, ``set_scale``, ``set_max_tokens``,
``hand_over_table``, ``close``; the pieces of a lookup that the engine times on their own:
``slot_size``, ``gather_ids``, ``local_lookup``, ``reduce_rows``; and what a
path reports about itself: ``stats``/``reset_stats`` (e.g. a ``hit_rate``),
``host_thread_s``, ``prefetch_buffer``, ``prefetch_stream``,
``sm_limit_granted``, ``green_via``, ``host_allocation``; ``check_deferred_errors``
(after a sync: raise what the path's asynchronous host work recorded, e.g. an id past the
table met by a graph's host node).

A subclass customises the lookup by overriding the public operations
(``local_lookup`` above all); the names they had before the contract
(``_local_lookup``, ``_slot``, ``_gather_ids``, ``_reduce``) are refused with a
``TypeError`` so an old override cannot be skipped silently.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import torch

from ..annotate import annotate
from ..env import resolve_device
from ..parallel import Groups
from .formats import StorageFormat, int_view
from .kernels import get_kernel, kernel_reads_sorted, takes_grid_cap
from .synthetic import fill_synthetic
import torch.distributed as dist


@dataclass(frozen=True)
class ShardSpec:
    """This rank's rows ``[vocab_start, vocab_end)`` of the padded vocabulary."""

    num_embeddings: int
    padded_vocab: int
    rows_per_rank: int
    vocab_start: int
    vocab_end: int

    @property
    def num_valid(self) -> int:
        return self.vocab_end - self.vocab_start

    @staticmethod
    def compute(num_embeddings: int, padding_size: int, etp: int, etp_rank: int) -> "ShardSpec":
        padded = math.ceil(num_embeddings / padding_size) * padding_size
        per_rank = math.ceil(padded / etp)
        start = etp_rank * per_rank
        end = max(start, min(start + per_rank, num_embeddings))
        return ShardSpec(num_embeddings, padded, per_rank, start, end)


#: settings of the prefetch side stream a backend may honour (``side_stream_settings``)
SIDE_STREAM_SETTINGS: tuple[str, ...] = ("stream_priority", "sm_limit")

#: the declared capabilities (class attributes) and their types
CAPABILITIES: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "supports_prefetch": bool,
    "table_in_host_memory": bool,
    "blocks_host": bool,
    "reads_ids_on_host": bool,
    "gathers_on_host": bool,
    "host_work_capturable": bool,
    "posts_ids": bool,
    "warms_cache": bool,
    "takes_table": bool,
    "default_kernel": str,
    "cpu_kernel": str,
    "side_stream_settings": frozenset,
    "sm_limit_refusal": str,
}

#: the private names the public operations had before the contract declared them
RENAMED: dict[str, str] = {
    "_local_lookup": "local_lookup",
    "_slot": "slot_size",
    "_gather_ids": "gather_ids",
    "_reduce": "reduce_rows",
}


def _positive_int(name: str, value: int, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        kind = "a non-negative" if allow_zero else "a positive"
        raise ValueError(f"{name} must be {kind} integer, got {value!r}")
    return value


class PLEEmbedding(ABC):
    """ETP-sharded PLE table.  Subclasses choose where the table lives."""

    name: ClassVar[str] = "abstract"
    supports_prefetch: ClassVar[bool] = False
    #: the table lives in host memory (pinned where there is a GPU): the engine checks the
    #: host's memory for it and accepts the ``host_alloc`` axis only for such backends
    table_in_host_memory: ClassVar[bool] = False
    default_kernel: ClassVar[str] = "torch_masked"
    #: the default kernel in functional mode on a CPU ("": default_kernel there too)
    cpu_kernel: ClassVar[str] = ""
    #: the path's calls occupy or block the calling host thread for their work (a host
    #: gather, issuing row copies, joining a host thread): the engine times them as
    #: synchronized calls on the host clock, never behind a launch-hiding spin
    blocks_host: ClassVar[bool] = False
    #: the path reads the ids on the host (host gather, copy addresses); others read them on the device
    reads_ids_on_host: ClassVar[bool] = False
    #: the host's cores gather the rows (into staging, then one copy): the host-gather ceiling
    #: binds the path; a path that reads the ids on the host without gathering (copy engines)
    #: is held against the host->device copy ceiling instead
    gathers_on_host: ClassVar[bool] = False
    #: the path's host work runs as stream work (a host function enqueued with
    #: ``cudaLaunchHostFunc``, then a copy), which a CUDA graph captures: a full graph of the
    #: step is possible even where the path reads the ids on the host
    host_work_capturable: ClassVar[bool] = False
    #: the path starts its host work on the step's host ids once the step's one CUDA graph is
    #: launched (its graph waits for the rows on the device): after each replay of a full graph
    #: with host ids, the decode step calls :meth:`post_ids`; eager calls post their own ids
    posts_ids: ClassVar[bool] = False
    #: :meth:`warm_cache` fills a cache from a sample of past traffic: the engine calls it
    #: (with an independent sample of the case's id distribution) before checking and timing
    warms_cache: ClassVar[bool] = False
    #: the constructor takes ``table=``: a filled table of the same rows, dim, dtype, shard and
    #: host allocation that another backend gave up (:meth:`hand_over_table`), used as it is
    #: (the engine shares one pinned and filled table across the paths that read it)
    takes_table: ClassVar[bool] = False
    #: which of :data:`SIDE_STREAM_SETTINGS` the prefetch side stream honours
    side_stream_settings: ClassVar[frozenset] = frozenset()
    #: why this path refuses ``sm_limit`` ("" = it does not refuse it)
    sm_limit_refusal: ClassVar[str] = ""

    #: settings (per instance; these are the defaults)
    stream_priority: int = 0  # priority of the prefetch side stream (lower = higher)
    sm_limit: int = 0  # SMs the prefetch side stream may use (0 = all)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for old, new in RENAMED.items():
            if old in cls.__dict__:
                raise TypeError(f"{cls.__qualname__} defines {old}, which the backend contract calls "
                                f"{new} (ple_bench/backends/base.py): rename it")

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        dtype: str | torch.dtype = "bf16",
        num_heads: int = 1,
        max_tokens: int = 0,
        padding_size: int = 64,
        groups: Groups | None = None,
        device: torch.device | str | None = None,
        kernel: str | None = None,
    ) -> None:
        self.num_embeddings = _positive_int("num_embeddings", num_embeddings)
        self.embedding_dim = _positive_int("embedding_dim", embedding_dim)
        self.num_heads = _positive_int("num_heads", num_heads)
        self.max_tokens = _positive_int("max_tokens", max_tokens, allow_zero=True)
        _positive_int("padding_size", padding_size)
        self.groups = groups if groups is not None else Groups.single()
        self.topology = self.groups.topology
        self.coords = self.groups.coords
        self.format = StorageFormat.for_dtype(dtype)
        self.storage_dtype = self.format.storage_dtype
        self.device = self._resolve_device(device)
        self._grid_programs: int | None = None
        self.set_kernel(self.kernel_for(self.device, kernel))
        self.shard = ShardSpec.compute(
            num_embeddings, padding_size, self.topology.etp, self.coords.etp_rank
        )
        self.weight = self.allocate_table(self.shard.rows_per_rank, embedding_dim, self.storage_dtype)
        self.scale = self.format.new_scale(self.device)
        self._pending: tuple | None = None
        # CPU time spent by the path's own host threads (gathers, waits); 0 for GPU-only paths
        self.host_thread_s = 0.0
        self._host_time_lock = threading.Lock()
        self._host_time_depth = threading.local()

    @contextlib.contextmanager
    def host_thread_time(self):
        """Count the CPU time of this thread inside the block into ``host_thread_s``
        (the outermost block of each thread only, so nested blocks count once)."""
        depth = getattr(self._host_time_depth, "n", 0)
        self._host_time_depth.n = depth + 1
        t0 = time.thread_time()
        try:
            yield
        finally:
            self._host_time_depth.n = depth
            if depth == 0:
                spent = time.thread_time() - t0
                with self._host_time_lock:
                    self.host_thread_s += spent

    # ----------------------------------------------------------- settings
    @classmethod
    def kernel_for(cls, device: torch.device | str, kernel: str | None = None):
        """The lookup kernel this path runs on ``device`` when a case names ``kernel``: the
        named one, else :attr:`cpu_kernel` on a CPU (where set), else :attr:`default_kernel`.
        The one rule: a fresh backend and a reused table (the engine swapping kernels) both
        read it, so a case's kernel does not depend on the cases that ran before it."""
        if kernel:
            return kernel
        if torch.device(device).type == "cpu" and cls.cpu_kernel:
            return cls.cpu_kernel
        return cls.default_kernel

    def set_kernel(self, kernel) -> None:
        """Look up with ``kernel`` (a registered name or a callable) from now on;
        the filled table is kept.  A grid cap is dropped if the new kernel takes none."""
        self.kernel_name = kernel
        self.kernel = get_kernel(kernel)
        if not self.supports_grid_cap:
            self._grid_programs = None

    @property
    def supports_grid_cap(self) -> bool:
        """The lookup kernel takes a grid cap (``max_programs``): :attr:`grid_cap` applies."""
        return takes_grid_cap(self.kernel)

    @property
    def reads_sorted(self) -> bool:
        """The lookup kernel reads the table's rows in ascending id order (it was declared
        :func:`~ple_bench.backends.kernels.sorted_reads`, as the ``dedup`` kernels are): the
        engine holds it against a random-row ceiling gathered in that order."""
        return kernel_reads_sorted(self.kernel)

    @property
    def grid_cap(self) -> int | None:
        """Most programs the lookup kernel launches (None: no cap; the kernel's own
        default, see ``fast_kernels.set_max_programs``).  Any cap is correct: each
        program loops over row blocks; a cap of ``grid_frac x SMs`` keeps the lookup
        on about that share of the SMs."""
        return self._grid_programs

    @grid_cap.setter
    def grid_cap(self, n: int | None) -> None:
        if n is not None:
            _positive_int("grid_cap", n)
            if not self.supports_grid_cap:
                raise ValueError(f"grid_cap: kernel {self.kernel_name} takes no grid cap "
                                 "(it launches one program per id)")
        self._grid_programs = n

    def kernel_options(self) -> dict[str, Any]:
        """Keyword arguments for the lookup kernel: ``max_programs`` when a grid cap is set."""
        return {} if self._grid_programs is None else {"max_programs": self._grid_programs}

    def run_kernel(self, table: torch.Tensor, flat_ids: torch.Tensor, out: torch.Tensor,
                   vocab_start: int, vocab_end: int) -> None:
        """Call the lookup kernel (the :mod:`.kernels` contract) with this backend's settings."""
        self.kernel(table, flat_ids, out, vocab_start, vocab_end, **self.kernel_options())

    def set_side_stream_setting(self, name: str, value: int) -> None:
        """Set a prefetch side-stream setting (one of ``side_stream_settings``) before
        the side stream exists.  ``NotImplementedError`` when this backend has no such
        setting; ``ValueError`` when its side stream already exists with another value."""
        if name not in SIDE_STREAM_SETTINGS or name not in type(self).side_stream_settings:
            raise NotImplementedError(f"{type(self).__name__} has no {name} setting")
        current = getattr(self, name)
        if current == value:
            return
        if self.prefetch_stream is not None:
            raise ValueError(
                f"the backend's side stream already exists with {name} {current}, "
                f"the case asks for {value}"
            )
        setattr(self, name, value)

    @property
    def prefetch_stream(self) -> torch.cuda.Stream | None:
        """The prefetch side stream, once made (None: none, or not yet)."""
        return None

    @property
    def prefetch_buffer(self) -> torch.Tensor | None:
        """The persistent buffer the prefetch writes into (None: none, or not yet).
        The engine poisons it before its correctness check of a repeated lookup."""
        return None

    @property
    def sm_limit_granted(self) -> int | None:
        """SMs the driver gave the side stream's green context (None: no limit or not known)."""
        return None

    @property
    def green_via(self) -> str | None:
        """How the side stream's green context was made (None: without one)."""
        return None

    def prepare_prefetch(self) -> Any:
        """Allocate what a prefetch needs (buffers, side stream) now, eagerly: the
        engine calls it before a CUDA-graph capture, where allocation is refused.
        Nothing to do by default."""
        return None

    def warm_cache(self, ids_sample: torch.Tensor | None = None) -> Any:
        """Fill a cache from ``ids_sample`` (global ids of past traffic); called
        by the engine when ``warms_cache`` is declared.  Nothing to do by default."""
        return None

    def post_ids(self, ids: torch.Tensor) -> None:
        """The step's host ids, posted right after the step's graph was launched (called by the
        decode step when ``posts_ids`` is declared): a path starts its host work on them now, and
        must not read the tensor after the call returns.  Nothing to do by default."""
        return None

    def check_deferred_errors(self) -> None:
        """Raise what the path's asynchronous work recorded since the last call (the engine
        calls it after a sync, e.g. after a graph replay); nothing by default."""
        return None

    def stats(self) -> dict[str, Any]:
        """What the path counts about itself since :meth:`reset_stats` (e.g. ``hit_rate``,
        recorded as ``cache_hit_rate``); {} by default."""
        return {}

    def reset_stats(self) -> None:
        """Zero the counters behind :meth:`stats`."""

    # ----------------------------------------------------------- storage
    def _resolve_device(self, device: torch.device | str | None) -> torch.device:
        if device is None:
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return resolve_device(device)

    @abstractmethod
    def allocate_table(self, rows: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
        """Allocate this rank's shard (``rows x dim`` of ``dtype``)."""

    def table_for_kernel(self) -> torch.Tensor:
        """The tensor the lookup kernel reads (device memory or a UVA view)."""
        return self.weight

    @property
    def host_allocation(self):
        """How the table's host memory was allocated: a
        :class:`~ple_bench.backends.cuda.host_alloc.HostAllocation` (bytes pinned, seconds),
        or None for a table that is not in host memory."""
        return None

    @property
    def functional(self) -> bool:
        """True when running on a machine without a GPU (host timer, no streams)."""
        return self.device.type != "cuda"

    @property
    def row_bytes(self) -> int:
        return self.embedding_dim * self.weight.element_size()

    @property
    def table_bytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()

    def load_full_table(self, full: torch.Tensor, scale: float | None = None) -> None:
        """Copy this rank's rows out of a full ``[num_embeddings, dim]`` table."""
        if tuple(full.shape) != (self.num_embeddings, self.embedding_dim):
            raise ValueError(
                f"full table must be {(self.num_embeddings, self.embedding_dim)}, got {tuple(full.shape)}"
            )
        s = self.shard
        self.weight[: s.num_valid].copy_(full[s.vocab_start : s.vocab_end].to(self.storage_dtype))
        if s.num_valid < s.rows_per_rank:
            int_view(self.weight[s.num_valid :]).fill_(-1)  # padding is never read
        if scale is not None:
            self.set_scale(scale)

    def fill_synthetic(self, seed: int, scale: float | None = None) -> None:
        """Fill the shard with :mod:`synthetic` rows (computed on the GPU when there is one)."""
        work = self.device if self.device.type == "cuda" else None
        fill_synthetic(self.weight, self.shard.vocab_start, seed, valid_rows=self.shard.num_valid,
                       work_device=work)
        if scale is not None:
            self.set_scale(scale)

    def set_scale(self, value: float) -> None:
        if self.scale is None:
            raise ValueError(f"a {self.format.name} table has no scale")
        self.scale.fill_(float(value))

    def check_loaded(self) -> None:
        self.format.check_loaded(self.scale)

    def dequantize(self, rows: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        return self.format.dequantize(rows, self.scale, out_dtype)

    def hand_over_table(self) -> Any:
        """Give up this backend's filled table for another backend (one that ``takes_table``,
        of the same rows, dim, dtype, shard and allocation) to take as ``table=``; this backend
        is unusable afterwards and its :meth:`close` frees nothing of the table.  None: the table
        cannot be handed over (the default)."""
        return None

    def set_max_tokens(self, max_tokens: int) -> None:
        """The most tokens per DP rank a call may bring from now on (a new case on
        the same filled table); backends with buffers sized by it resize them."""
        self.max_tokens = _positive_int("max_tokens", max_tokens, allow_zero=True)

    def close(self) -> None:
        """Drop the table and buffers so their memory can be reused."""
        self.weight = None  # type: ignore[assignment]
        self._pending = None

    # ----------------------------------------------------------- DP gather
    def _check_ids(self, ids: torch.Tensor) -> None:
        if ids.dim() != 2 or ids.shape[1] != self.num_heads:
            raise ValueError(
                f"ids must be [tokens, {self.num_heads}] (one column per head), got {tuple(ids.shape)}"
            )
        if ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"ids must be int64 or int32, got {ids.dtype}")

    def slot_size(self, local_tokens: int, dp_token_counts: Sequence[int] | None) -> int:
        """Slot size of this rank's ETP group (its largest local token count): the
        rows each DP rank contributes to the DP id gather.  ``ValueError`` on bad counts."""
        topo = self.topology
        if topo.replicas == 1:
            return local_tokens
        if dp_token_counts is None:
            raise ValueError(
                f"ETP={topo.etp} spans {topo.replicas} DP ranks: pass dp_token_counts "
                f"(the token count of each of the {topo.dp} DP ranks)"
            )
        counts = [int(c) for c in dp_token_counts]
        if len(counts) != topo.dp:
            raise ValueError(f"dp_token_counts has {len(counts)} entries, expected DP={topo.dp}")
        if counts[self.coords.dp_rank] != local_tokens:
            raise ValueError(
                f"dp_token_counts[{self.coords.dp_rank}]={counts[self.coords.dp_rank]} but this "
                f"rank has {local_tokens} tokens"
            )
        group = topo.group_dp_ranks(self.coords.etp_group_index)
        return max(counts[d] for d in group)

    def gather_ids(self, ids: torch.Tensor, slot: int) -> torch.Tensor:
        """The DP id gather: this rank's ids padded to ``slot`` rows, all-gathered over
        the DP ranks of its ETP group (``ids`` as they are when ETP does not span DP)."""
        if self.topology.replicas == 1:
            return ids

        if ids.shape[0] < slot:
            pad = ids.new_zeros(slot - ids.shape[0], ids.shape[1])
            ids = torch.cat((ids, pad), dim=0)
        parts = [torch.empty_like(ids) for _ in range(self.topology.replicas)]
        with annotate("gather_ids", color="purple"):
            dist.all_gather(parts, ids.contiguous(), group=self.groups.gather_group)
        return torch.cat(parts, dim=0)

    def _select(self, rows: torch.Tensor, slot: int, local_tokens: int) -> torch.Tensor:
        if self.topology.replicas == 1:
            return rows
        return rows.narrow(0, self.coords.slot * slot, local_tokens)

    # ----------------------------------------------------------- lookup
    def _lookup_output(self, ids: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        """``out`` checked against ``[n, heads, dim]`` of the storage dtype, or a new one."""
        shape = (ids.shape[0], self.num_heads, self.embedding_dim)
        if out is None:
            return torch.empty(shape, dtype=self.storage_dtype, device=self.device)
        if tuple(out.shape) != shape or out.dtype != self.storage_dtype:
            raise ValueError(f"lookup output must be {shape} of {self.storage_dtype}")
        return out

    def device_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids`` on this backend's device: host ids are copied on the current
        stream (asynchronously from pinned memory), device ids are returned as they are."""
        if ids.device == self.device:
            return ids
        return ids.to(self.device, non_blocking=ids.is_pinned())

    def local_lookup(self, ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows this rank owns for ``ids`` ([n, heads] -> [n, heads, dim], into ``out``
        when given); zeros elsewhere.  No DP gather, no ETP reduce."""
        out = self._lookup_output(ids, out)
        flat = self.device_ids(ids).reshape(-1)
        if flat.dtype != torch.int64:
            flat = flat.long()
        with annotate("lookup", color="green"):
            self.run_kernel(
                int_view(self.table_for_kernel()),
                flat,
                int_view(out).view(-1, self.embedding_dim),
                self.shard.vocab_start,
                self.shard.vocab_end,
            )
        return out

    def reduce_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Sum ``rows`` over the ETP group in place as raw integers: byte-exact (one
        owner per row); ``rows`` as they are without an ETP group."""
        if self.groups.etp_group is None:
            return rows

        with annotate("reduce_rows", color="purple"):
            dist.all_reduce(_reduce_view(rows), group=self.groups.etp_group)
        return rows

    def lookup(
        self, ids: torch.Tensor, dp_token_counts: Sequence[int] | None = None
    ) -> torch.Tensor:
        """Synchronous lookup: gather, look up, reduce, select -> ``[tokens, heads*dim]``."""
        self._check_ids(ids)
        local = ids.shape[0]
        slot = self.slot_size(local, dp_token_counts)
        if self.topology.replicas > 1:
            ids = self.device_ids(ids)  # the DP gather (NCCL) needs device tensors
        rows = self.local_lookup(self.gather_ids(ids, slot))
        rows = self._select(self.reduce_rows(rows), slot, local)
        return rows.reshape(local, self.num_heads * self.embedding_dim)

    @classmethod
    def lookup_mechanism(cls) -> str:
        """How the path moves its rows, from its declared capabilities (record field
        ``lookup_mechanism``): ``host_gather`` (the host's cores gather), ``host_copy`` (copy
        engines, ids read on the host) or ``kernel`` (its lookup kernel reads the table)."""
        if cls.gathers_on_host:
            return "host_gather"
        return "host_copy" if cls.reads_ids_on_host else "kernel"

    def lookup_into(self, ids: torch.Tensor, out: torch.Tensor,
                    dp_token_counts: Sequence[int] | None = None) -> torch.Tensor:
        """:meth:`lookup` written into ``out`` (``[tokens, heads*dim]``, the storage dtype, on
        this device): straight into it, no copy, when ETP does not span DP and the backend keeps
        the general lookup (what a server's embedding writes: its consumer's input); otherwise
        :meth:`lookup`'s rows copied in."""
        self._check_ids(ids)
        n = ids.shape[0]
        shape = (n, self.num_heads * self.embedding_dim)
        if tuple(out.shape) != shape or out.dtype != self.storage_dtype or out.device != self.device:
            raise ValueError(f"output must be {shape} {self.storage_dtype} on {self.device}, "
                             f"got {tuple(out.shape)} {out.dtype} on {out.device}")
        if self.topology.replicas == 1 and type(self).lookup is PLEEmbedding.lookup and out.is_contiguous():
            self.slot_size(n, dp_token_counts)
            self.reduce_rows(self.local_lookup(ids, out.view(n, self.num_heads, self.embedding_dim)))
            return out
        out.copy_(self.lookup(ids, dp_token_counts))
        return out

    # ----------------------------------------------------------- prefetch
    def start_prefetch(
        self, ids: torch.Tensor, dp_token_counts: Sequence[int] | None = None
    ) -> None:
        """Start the lookup of ``ids``.  Resident tables do nothing here: the
        lookup happens in :meth:`finalize`."""
        self._check_ids(ids)
        self.slot_size(ids.shape[0], dp_token_counts)  # refuse bad counts here, not at finalize
        self._pending = (ids, dp_token_counts)

    def finalize(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """Finish the lookup begun by :meth:`start_prefetch` -> ``[tokens, heads*dim]``."""
        if self._pending is None:
            raise RuntimeError(f"{self.name}: finalize requires a prior start_prefetch")
        ids, counts = self._pending
        self._pending = None
        if out is None:
            return self.lookup(ids, counts)
        return self.lookup_into(ids, out, counts)


def _reduce_view(rows: torch.Tensor) -> torch.Tensor:
    """The integer view of ``rows`` that the ETP all-reduce sums.

    Neither NCCL nor gloo reduces int16, so 2-byte rows (bf16, fp16) are summed
    as int32 words (int8 if the byte count is odd).  Still byte-exact: all but
    one rank contribute zero bytes for every row, so the integer sum only
    concatenates disjoint bit patterns."""
    view = int_view(rows)
    if view.element_size() == 2:
        flat = view.reshape(-1)
        view = flat.view(torch.int32) if flat.numel() % 2 == 0 else flat.view(torch.int8)
    return view


def check_out(out: torch.Tensor, rows: torch.Tensor) -> None:
    if out.shape != rows.shape or out.dtype != rows.dtype or out.device != rows.device:
        raise ValueError(
            f"output must be {tuple(rows.shape)} {rows.dtype} on {rows.device}, "
            f"got {tuple(out.shape)} {out.dtype} on {out.device}"
        )
