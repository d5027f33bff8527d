"""A lookup path whose row copies are done by the GPU's copy engines.

``pinned_copy_engine`` (:class:`PinnedCopyEngineEmbedding`): every row this
rank owns is copied host->device by its own asynchronous memcpy of
``row_bytes`` bytes, from the pinned table straight into the output.  No GPU
thread reads the table and no host core gathers rows: the host only builds the
list of (source, destination) addresses; the copy engines move the bytes.
Ids this rank does not own get zero rows: one memset of the output on the
output's stream, before the copies.

How the copies are issued (``copy_mechanism`` says which one a backend uses):

* ``memcpy_batch``: all copies in one ``cudaMemcpyBatchAsync`` call (CUDA >= 12.8,
  through the CUDA Python bindings ``cuda.bindings.runtime``, package
  ``cuda-bindings``), source accessed in stream order, with the "prefer overlap
  with compute" hint unless ``prefer_overlap=False`` (the batch call refuses the
  legacy default stream: a batch asked there runs on a stream of this backend's,
  joined both ways);
* ``memcpy_loop``: one ``cudaMemcpyAsync`` per row through the same bindings
  (older CUDA, or a batch call the driver refuses);
* ``torch_row_copies``: one ``dest[i].copy_(row, non_blocking=True)`` per row
  through torch, the last resort when the bindings are missing (slow: the
  labelled fallback, not a measurement of the copy engines);
* ``cpu_functional``: no GPU -- the same semantics with host copies
  (``index_select``), so the path runs in CI.

On a GPU the choice is made once, at construction: the first mechanism of
that list which is available *and* copies two probe rows correctly wins
(``mechanism_notes`` says why the others were passed over).  A mechanism can
also be forced (``copy_mechanism="memcpy_loop"``, or ``extra.copy_mechanism``
in a suite).

The ids must be on the host to build the addresses.  ``start_prefetch``
copies them device->host on the side stream, records an event and hands the
rest to a worker thread, so neither the caller nor the main stream waits; the
worker waits for the event, builds the address list and issues the memset and
the copies on the side stream.  ``finalize`` joins the worker, then (as
``pinned_uva``) the main stream waits for the side stream.  The worker's CPU
time is counted in ``host_thread_s``.  The synchronous ``lookup`` copies the
ids to the host with a blocking sync and issues the copies on the current
stream.  Host work cannot be captured in a CUDA graph: eager only.  No SM runs
the lookup, so ``sm_limit`` (a green-context side stream) is refused.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Sequence

import torch

from ..annotate import annotate
from .formats import int_view
from .pinned import PinnedUVAEmbedding
from .registry import register_backend

MECHANISMS = ("memcpy_batch", "memcpy_loop", "torch_row_copies", "cpu_functional")
# cudaMemcpyBatchAsync appeared in CUDA 12.8 (runtime and driver both).
BATCH_MIN_VERSION = 12080
# Copies per cudaMemcpyBatchAsync call (larger batches are split).
BATCH_CHUNK = 1 << 16


# ----------------------------------------------------------------- bindings
def load_runtime() -> Any | None:
    """``cuda.bindings.runtime``, or None when the package is not installed."""
    try:
        from cuda.bindings import runtime  # type: ignore[import-not-found]
    except ImportError:
        return None
    return runtime


def _ok(rt: Any, result: Any) -> bool:
    err = result[0] if isinstance(result, tuple) else result
    return err == rt.cudaError_t.cudaSuccess


def _check(rt: Any, result: Any, what: str) -> None:
    # 12.8/12.9 bindings return (err, failIdx) for the batch call, 13.x (err,)
    if not _ok(rt, result):
        err = result[0] if isinstance(result, tuple) else result
        extra = f" (failed copy {result[1]})" if isinstance(result, tuple) and len(result) > 1 else ""
        raise RuntimeError(f"{what} failed: {err}{extra}")


def _version(rt: Any, fn: str) -> int | None:
    try:
        result = getattr(rt, fn)()
    except Exception:  # noqa: BLE001 - a missing or failing query means "unknown"
        return None
    if not _ok(rt, result) or len(result) < 2:
        return None
    return int(result[1])


def bindings_info(rt: Any | None = None) -> dict[str, Any]:
    """What the copy mechanisms depend on: bindings version, CUDA runtime and
    driver versions (e.g. 12080), whether ``cudaMemcpyBatchAsync`` exists."""
    rt = load_runtime() if rt is None else rt
    if rt is None:
        return {"bindings": None, "runtime_version": None, "driver_version": None,
                "has_memcpy_batch": False}
    try:
        import cuda.bindings as cb  # type: ignore[import-not-found]

        version = getattr(cb, "__version__", "unknown")
    except ImportError:
        version = "unknown"
    return {
        "bindings": version,
        "runtime_version": _version(rt, "cudaRuntimeGetVersion"),
        "driver_version": _version(rt, "cudaDriverGetVersion"),
        "has_memcpy_batch": hasattr(rt, "cudaMemcpyBatchAsync"),
    }


def candidate_mechanisms(rt: Any | None) -> tuple[list[str], list[str]]:
    """The mechanisms worth trying on a GPU, best first, and why the others are not."""
    notes: list[str] = []
    if rt is None:
        notes.append("cuda.bindings not installed (pip install cuda-bindings): no memcpy_batch / memcpy_loop")
        return ["torch_row_copies"], notes
    info = bindings_info(rt)
    out = []
    versions = [info["runtime_version"], info["driver_version"]]
    if not info["has_memcpy_batch"]:
        notes.append(f"cuda.bindings {info['bindings']} has no cudaMemcpyBatchAsync")
    elif any(v is None or v < BATCH_MIN_VERSION for v in versions):
        notes.append(f"cudaMemcpyBatchAsync needs CUDA >= 12.8 (runtime {versions[0]}, driver {versions[1]})")
    else:
        out.append("memcpy_batch")
    out += ["memcpy_loop", "torch_row_copies"]
    return out, notes


def batch_attributes(rt: Any, prefer_overlap: bool = True) -> Any:
    """One ``cudaMemcpyAttributes`` for every copy of a batch: source read in
    stream order (the table is written only between lookups), and the driver's
    hint to overlap the copies with compute."""
    attrs = rt.cudaMemcpyAttributes()
    attrs.srcAccessOrder = rt.cudaMemcpySrcAccessOrder.cudaMemcpySrcAccessOrderStream
    flags = getattr(rt, "cudaMemcpyFlags", None)
    if prefer_overlap and flags is not None and hasattr(flags, "cudaMemcpyFlagPreferOverlapWithCompute"):
        attrs.flags = flags.cudaMemcpyFlagPreferOverlapWithCompute
    return attrs


def memcpy_batch(rt: Any, dsts: list[int], srcs: list[int], nbytes: int, stream_handle: int,
                 attrs: Any) -> None:
    """``cudaMemcpyBatchAsync`` of ``nbytes`` from each ``srcs[i]`` to ``dsts[i]``
    (in chunks of :data:`BATCH_CHUNK`)."""
    stream = rt.cudaStream_t(stream_handle)
    for i in range(0, len(dsts), BATCH_CHUNK):
        d, s = dsts[i : i + BATCH_CHUNK], srcs[i : i + BATCH_CHUNK]
        result = rt.cudaMemcpyBatchAsync(d, s, [nbytes] * len(d), len(d), [attrs], [0], 1, stream)
        _check(rt, result, "cudaMemcpyBatchAsync")


def memcpy_loop(rt: Any, dsts: list[int], srcs: list[int], nbytes: int, stream_handle: int) -> None:
    """One ``cudaMemcpyAsync`` (host->device) per copy."""
    stream = rt.cudaStream_t(stream_handle)
    kind = rt.cudaMemcpyKind.cudaMemcpyHostToDevice
    copy = rt.cudaMemcpyAsync
    for d, s in zip(dsts, srcs):
        result = copy(d, s, nbytes, kind, stream)
        if not _ok(rt, result):
            _check(rt, result, "cudaMemcpyAsync")


def copy_plan(host_ids: torch.Tensor, vocab_start: int, vocab_end: int):
    """``(positions, local_rows)``: the output rows that get a copy (ids this
    rank owns) and the shard row each one reads; both CPU int64."""
    owned = (host_ids >= vocab_start) & (host_ids < vocab_end)
    positions = owned.nonzero().reshape(-1)
    return positions, host_ids.index_select(0, positions) - vocab_start


def copy_addresses(positions: torch.Tensor, local_rows: torch.Tensor, row_bytes: int,
                   table_ptr: int, dest_ptr: int) -> tuple[list[int], list[int]]:
    """Destination and source byte addresses of the row copies."""
    dsts = (positions * row_bytes + dest_ptr).tolist()
    srcs = (local_rows * row_bytes + table_ptr).tolist()
    return dsts, srcs


# ----------------------------------------------------------------- backend
@register_backend("pinned_copy_engine")
class PinnedCopyEngineEmbedding(PinnedUVAEmbedding):
    """Pinned table; one asynchronous host->device memcpy per owned row
    (see the module docstring).  ``copy_mechanism``: ``"auto"`` (default) or one
    of :data:`MECHANISMS`; ``prefer_overlap``: the batch call's overlap hint."""

    supports_prefetch = True
    default_kernel = "torch_masked"  # not used by this path's lookups
    sm_limit_refusal = ("pinned_copy_engine moves rows with the copy engines (one memcpy per row); "
                        "no SMs run its lookup, so an SM limit does not apply")

    def __init__(self, num_embeddings: int, embedding_dim: int, *, copy_mechanism: str = "auto",
                 prefer_overlap: bool = True, **kwargs) -> None:
        if copy_mechanism != "auto" and copy_mechanism not in MECHANISMS:
            raise ValueError(f"copy_mechanism must be 'auto' or one of {MECHANISMS}, got {copy_mechanism!r}")
        super().__init__(num_embeddings, embedding_dim, **kwargs)
        self.prefer_overlap = bool(prefer_overlap)
        self.mechanism_notes: list[str] = []
        self._rt = load_runtime()
        self._attrs = None
        self._prefetch_pool: ThreadPoolExecutor | None = None
        self._future: Future | None = None
        self._host_ids: torch.Tensor | None = None  # pinned int64
        self._inflight_ref: torch.Tensor | None = None
        self._issue_lock = threading.Lock()
        self._detour: torch.cuda.Stream | None = None  # for batches asked on the legacy default stream
        self.last_copies = 0  # row copies issued by the last lookup (owned ids)
        self.copy_mechanism = self._choose_mechanism(copy_mechanism)

    # ----------------------------------------------------------- mechanism
    def _choose_mechanism(self, requested: str) -> str:
        if requested == "cpu_functional" and not self.functional:
            raise ValueError("copy_mechanism='cpu_functional' is for machines without a GPU")
        if requested != "auto":
            if requested in ("memcpy_batch", "memcpy_loop") and self._rt is None:
                raise RuntimeError(f"copy_mechanism={requested!r} needs cuda.bindings (pip install cuda-bindings)")
            if requested == "memcpy_batch" and not hasattr(self._rt, "cudaMemcpyBatchAsync"):
                raise RuntimeError("copy_mechanism='memcpy_batch': these cuda.bindings lack cudaMemcpyBatchAsync")
            return requested
        if self.functional:
            return "cpu_functional"
        candidates, self.mechanism_notes = candidate_mechanisms(self._rt)
        for name in candidates:
            ok, why = self._probe(name)
            if ok:
                return name
            self.mechanism_notes.append(f"{name} failed its probe copy: {why}")
        raise RuntimeError(f"pinned_copy_engine: no copy mechanism works: {self.mechanism_notes}")

    def _probe(self, name: str) -> tuple[bool, str]:
        """Copy the shard's first and last rows with ``name``; compare the bytes."""
        start, end = self.shard.vocab_start, self.shard.vocab_end
        if end <= start:
            return True, ""  # an empty shard: this rank never copies a row
        ids = torch.tensor([end - 1, start], dtype=torch.int64)
        dest = torch.empty(2, self.embedding_dim, dtype=int_view(self.weight).dtype, device=self.device)
        dest.fill_(-3)
        try:
            stream = torch.cuda.current_stream(self.device)
            self._issue(ids, dest, stream, mechanism=name)
            stream.synchronize()
        except Exception as exc:  # noqa: BLE001 - any failure means "try the next one"
            return False, f"{type(exc).__name__}: {exc}"
        want = int_view(self.weight).index_select(0, ids - start)
        if not torch.equal(dest.cpu(), want):
            return False, "copied bytes differ from the table"
        return True, ""

    # ----------------------------------------------------------- copies
    def _issue(self, host_ids: torch.Tensor, dest: torch.Tensor, stream, mechanism: str | None = None) -> None:
        """Rows of ``host_ids`` (CPU int64, flat) into ``dest`` (``[n, dim]``
        integer view, device or host): memset when some ids are not owned, then
        one copy per owned row, all on ``stream`` (None on the host)."""
        mechanism = mechanism or self.copy_mechanism
        if not dest.is_contiguous():
            raise ValueError("pinned_copy_engine writes into a contiguous output")
        if mechanism == "memcpy_batch" and stream is not None and stream.cuda_stream == 0:
            # cudaMemcpyBatchAsync refuses the legacy default stream: detour through our own
            detour = self._detour_stream()
            detour.wait_stream(stream)
            self._issue(host_ids, dest, detour, mechanism)
            stream.wait_stream(detour)  # later work (and frees) on ``stream`` follow the copies
            return
        start, end = self.shard.vocab_start, self.shard.vocab_end
        positions, local = copy_plan(host_ids, start, end)
        table = int_view(self.weight)
        on_stream = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        with on_stream:
            if positions.numel() < host_ids.numel():
                dest.zero_()  # the one memset: rows of ids this rank does not own
            self.last_copies = positions.numel()
            if positions.numel() == 0:
                return
            if mechanism == "cpu_functional":
                dest.index_copy_(0, positions, table.index_select(0, local))
            elif mechanism == "torch_row_copies":
                for p, r in zip(positions.tolist(), local.tolist()):
                    dest[p].copy_(table[r], non_blocking=True)
            else:
                dsts, srcs = copy_addresses(positions, local, self.row_bytes, table.data_ptr(), dest.data_ptr())
                handle = stream.cuda_stream if stream is not None else 0
                if dest.device.type == "cuda":  # this thread's device, for the bindings' runtime
                    _check(self._rt, self._rt.cudaSetDevice(dest.device.index), "cudaSetDevice")
                if mechanism == "memcpy_batch":
                    if self._attrs is None:
                        self._attrs = batch_attributes(self._rt, self.prefer_overlap)
                    memcpy_batch(self._rt, dsts, srcs, self.row_bytes, handle, self._attrs)
                elif mechanism == "memcpy_loop":
                    memcpy_loop(self._rt, dsts, srcs, self.row_bytes, handle)
                else:
                    raise ValueError(f"unknown copy mechanism {mechanism!r}")

    def _detour_stream(self) -> torch.cuda.Stream:
        if self._detour is None:
            self._detour = torch.cuda.Stream(device=self.device)
        return self._detour

    def issue_copies(self, host_ids: torch.Tensor, dest: torch.Tensor, stream=None) -> None:
        """Public hook for measurements: the copies alone, ids already on the host
        (``stream`` defaults to the current stream of a device ``dest``)."""
        if stream is None and dest.device.type == "cuda":
            stream = torch.cuda.current_stream(dest.device)
        with self._issue_lock, self.host_thread_time():
            self._issue(host_ids.reshape(-1).to(torch.int64), dest, stream)

    # ----------------------------------------------------------- lookup
    def _local_lookup(self, ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        out = self._lookup_output(ids, out)
        flat = ids.reshape(-1).to(torch.int64)
        dest = int_view(out).view(-1, self.embedding_dim)
        with annotate("lookup", color="green"):
            host_ids = flat.cpu()  # blocking device->host copy when the ids are on the GPU
            stream = torch.cuda.current_stream(self.device) if dest.device.type == "cuda" else None
            with self._issue_lock, self.host_thread_time():
                self._issue(host_ids, dest, stream)
        return out

    # ----------------------------------------------------------- prefetch
    def _pinned_ids(self, n: int) -> torch.Tensor:
        buf = self._host_ids
        if buf is None or buf.shape[0] < n:
            buf = torch.empty(n, dtype=torch.int64, pin_memory=not self.functional)
            self._host_ids = buf
        return buf[:n]

    def start_prefetch(
        self, ids: torch.Tensor, dp_token_counts: Sequence[int] | None = None
    ) -> None:
        self._check_ids(ids)
        with annotate("prefetch_start", color="yellow"):
            self._join()  # a prefetch never finalized: finish it, drop its result
            buffer, gathered, slot, local = self._prefetch_target(ids, dp_token_counts)
            flat = gathered.reshape(-1).to(torch.int64)
            n = flat.numel()
            dest = int_view(buffer).view(-1, self.embedding_dim)[:n]
            ids_ready = None
            if flat.device.type == "cpu":
                host_ids = flat
            else:
                stream = self._stream
                stream.wait_stream(torch.cuda.current_stream(self.device))
                host_ids = self._pinned_ids(n)
                with torch.cuda.stream(stream):
                    host_ids.copy_(flat, non_blocking=True)
                    ids_ready = torch.cuda.Event()
                    ids_ready.record(stream)
                flat.record_stream(stream)
                self._inflight_ref = flat
            if self._prefetch_pool is None:
                self._prefetch_pool = ThreadPoolExecutor(1, thread_name_prefix="ple_copy_engine")
            self._future = self._prefetch_pool.submit(self._prefetch_work, host_ids, ids_ready, dest)
            self._pending = (gathered.shape[0], slot, local)

    def _prefetch_work(self, host_ids: torch.Tensor, ids_ready, dest: torch.Tensor) -> None:
        with self.host_thread_time():  # the worker's wait, address list and issue
            if dest.device.type == "cpu":
                with self._issue_lock:
                    self._issue(host_ids, dest, None)
                return
            with torch.cuda.device(self.device):
                if ids_ready is not None:
                    ids_ready.synchronize()
                with self._issue_lock:
                    self._issue(host_ids, dest, self._stream)

    def _join(self) -> None:
        future, self._future = self._future, None
        if future is not None:
            try:
                future.result()
            finally:
                self._inflight_ref = None

    def finalize(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """Wait for the worker to have issued the copies, then as ``pinned_uva``:
        join the side stream, reduce over ETP, select this DP rank's rows."""
        if self._future is None:
            raise RuntimeError("pinned PLE finalize requires a prior start_prefetch")
        self._join()
        return super().finalize(out)

    def close(self) -> None:
        try:
            self._join()
        except Exception:  # noqa: BLE001 - closing: the error was the caller's to see
            pass
        if self._prefetch_pool is not None:
            self._prefetch_pool.shutdown(wait=True)
        self._prefetch_pool = None
        self._host_ids = None
        self._attrs = None
        super().close()
