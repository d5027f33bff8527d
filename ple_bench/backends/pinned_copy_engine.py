"""A lookup path whose row copies are done by the GPU's copy engines.

``pinned_copy_engine`` (:class:`PinnedCopyEngineEmbedding`): every row this
rank owns is copied host->device by its own asynchronous memcpy of
``row_bytes`` bytes, from the pinned table straight into the output.  No GPU
thread reads the table and no host core gathers rows: the host only builds the
list of (source, destination) addresses; the copy engines move the bytes.
Ids this rank does not own get zero rows: one memset of the output on the
output's stream, before the copies.

How the copies are issued (``copy_mechanism`` says which one a backend uses):

* ``memcpy_batch_raw``: all copies in one ``cudaMemcpyBatchAsync`` call of the
  CUDA runtime this process has loaded (torch's ``libcudart``, CUDA >= 13: the
  eight-argument form), called through ctypes with the address arrays as int64
  tensors built by tensor arithmetic -- no per-row Python, a few nanoseconds of
  host time per row;
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

The ids must be on the host to build the addresses: host ids are used as
they are, device ids are copied to the host first; the prefetch runs on the
host thread of :class:`~.host_common.HostPathEmbedding` (see there for what
each waits for).  Issuing the copies is the host work counted in
``host_thread_s``.  Host work cannot be captured in a CUDA graph: eager (or
eager breaks) only.  No SM runs the lookup, so ``sm_limit`` (a green-context
side stream) is refused.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from typing import Any

import torch

from ..annotate import annotate
from .cuda.cudart import loaded_libcudart
from .formats import int_view
from .host_common import HostPathEmbedding

MECHANISMS = ("memcpy_batch_raw", "memcpy_batch", "memcpy_loop", "torch_row_copies", "cpu_functional")
# cudaMemcpyBatchAsync appeared in CUDA 12.8 (runtime and driver both).
BATCH_MIN_VERSION = 12080
# Copies per cudaMemcpyBatchAsync call (larger batches are split).
BATCH_CHUNK = 1 << 16


# ------------------------------------------------------- raw runtime call
class _MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class MemcpyAttributes(ctypes.Structure):
    """``struct cudaMemcpyAttributes`` (CUDA >= 12.8)."""

    _fields_ = [("srcAccessOrder", ctypes.c_int), ("srcLocHint", _MemLocation),
                ("dstLocHint", _MemLocation), ("flags", ctypes.c_uint)]


#: cudaMemcpySrcAccessOrderStream and cudaMemcpyFlagPreferOverlapWithCompute
SRC_ACCESS_ORDER_STREAM = 1
FLAG_PREFER_OVERLAP = 1
RAW_MIN_VERSION = 13000


def load_raw_batch() -> tuple[Any | None, str]:
    """``(fn, note)``: ctypes ``cudaMemcpyBatchAsync(dsts, srcs, sizes, count, attrs,
    attrsIdxs, numAttrs, stream)`` of the loaded libcudart when it is CUDA >= 13
    (whose batch call has these eight arguments), else ``(None, why)``."""
    if os.environ.get("PLE_BENCH_RAW_BATCH") == "0":
        return None, "disabled by PLE_BENCH_RAW_BATCH=0"
    path = loaded_libcudart()
    if path is None:
        return None, "no libcudart loaded in this process"
    try:
        lib = ctypes.CDLL(path)
        version = ctypes.c_int(0)
        lib.cudaRuntimeGetVersion(ctypes.byref(version))
        fn = lib.cudaMemcpyBatchAsync
    except (OSError, AttributeError) as exc:
        return None, f"{path}: {exc}"
    if version.value < RAW_MIN_VERSION:
        return None, f"{path} is CUDA {version.value}; the raw batch call needs >= {RAW_MIN_VERSION}"
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn, ""


def memcpy_batch_raw(fn: Any, dsts: torch.Tensor, srcs: torch.Tensor, sizes: torch.Tensor,
                     stream_handle: int, attrs: MemcpyAttributes) -> None:
    """One raw batch call per :data:`BATCH_CHUNK` copies; ``dsts``/``srcs``/``sizes``
    are contiguous CPU int64 tensors of addresses and byte counts."""
    idx = ctypes.c_size_t(0)
    for i in range(0, dsts.numel(), BATCH_CHUNK):
        n = min(BATCH_CHUNK, dsts.numel() - i)
        err = fn(dsts.data_ptr() + 8 * i, srcs.data_ptr() + 8 * i, sizes.data_ptr() + 8 * i, n,
                 ctypes.addressof(attrs), ctypes.addressof(idx), 1, stream_handle)
        if err != 0:
            raise RuntimeError(f"cudaMemcpyBatchAsync (raw) failed: cudaError {err}")


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


def candidate_mechanisms(rt: Any | None, raw_note: str | None = None) -> tuple[list[str], list[str]]:
    """The mechanisms worth trying on a GPU, best first, and why the others are not.
    ``raw_note``: "" when the raw batch call is available, else why not (None: not asked)."""
    notes: list[str] = []
    if raw_note == "":
        head, tail = candidate_mechanisms(rt, None)
        return ["memcpy_batch_raw"] + head, tail
    if raw_note is not None:
        notes.append(f"memcpy_batch_raw: {raw_note}")
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
class PinnedCopyEngineEmbedding(HostPathEmbedding):
    """Pinned table; one asynchronous host->device memcpy per owned row
    (see the module docstring).  ``copy_mechanism``: ``"auto"`` (default) or one
    of :data:`MECHANISMS`; ``prefer_overlap``: the batch call's overlap hint."""

    name = "pinned_copy_engine"

    thread_name = "ple_copy_engine"
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
        self._raw_fn = None
        self._raw_attrs: MemcpyAttributes | None = None
        self._sizes: torch.Tensor | None = None  # row_bytes per copy (int64), for the raw batch
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
            if requested == "memcpy_batch_raw":
                self._raw_fn, why = load_raw_batch()
                if self._raw_fn is None:
                    raise RuntimeError(f"copy_mechanism='memcpy_batch_raw': {why}")
            return requested
        if self.functional:
            return "cpu_functional"
        self._raw_fn, raw_note = load_raw_batch()
        candidates, self.mechanism_notes = candidate_mechanisms(self._rt, raw_note)
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
        if mechanism in ("memcpy_batch", "memcpy_batch_raw") and stream is not None and stream.cuda_stream == 0:
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
            elif mechanism == "memcpy_batch_raw":
                self._issue_raw(positions, local, table, dest, stream)
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

    def _issue_raw(self, positions: torch.Tensor, local: torch.Tensor, table: torch.Tensor,
                   dest: torch.Tensor, stream) -> None:
        """The raw batch call: address arrays by tensor arithmetic (no per-row Python)."""
        row = self.row_bytes
        dsts = positions.mul(row).add_(dest.data_ptr())
        srcs = local.mul(row).add_(table.data_ptr())
        n = dsts.numel()
        if self._sizes is None or self._sizes.numel() < n:
            self._sizes = torch.full((max(n, 1024),), row, dtype=torch.int64)
        if self._raw_attrs is None:
            attrs = MemcpyAttributes()
            attrs.srcAccessOrder = SRC_ACCESS_ORDER_STREAM
            attrs.flags = FLAG_PREFER_OVERLAP if self.prefer_overlap else 0
            self._raw_attrs = attrs
        handle = stream.cuda_stream if stream is not None else 0
        memcpy_batch_raw(self._raw_fn, dsts, srcs, self._sizes, handle, self._raw_attrs)

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

    # ----------------------------------------------------------- host path
    def host_rows(self, host_ids: torch.Tensor, dest: torch.Tensor, stream) -> None:
        with self._issue_lock, self.host_thread_time():
            self._issue(host_ids, dest, stream)

    def close(self) -> None:
        super().close()
        self._attrs = None
        self._raw_attrs = None
        self._sizes = None
