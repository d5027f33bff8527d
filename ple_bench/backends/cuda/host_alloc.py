"""How a pinned table's host memory is allocated (the ``host_alloc`` axis), what it
really takes, and whether it fits.

Modes (:data:`ple_bench.spec.case.HOST_ALLOC_MODES`):

* ``torch``: ``torch.empty(..., pin_memory=True)``, torch's caching host
  allocator.  It rounds every block up to a power of two (a 47.7 GiB table pins
  64 GiB) and keeps freed blocks for reuse (:func:`release_cached_pinned_blocks`
  gives them back).
* ``exact``: an anonymous mapping of the table's bytes rounded up to the page
  size, pinned with ``cudaHostRegister`` (portable | mapped) and freed exactly
  (``cudaHostUnregister`` + unmap) when the backend closes.  Pages are whatever
  the system's transparent-huge-page policy gives (no advice).
* ``exact_huge``: as ``exact`` on a 2 MiB-aligned span advised
  ``MADV_HUGEPAGE`` (2 MiB transparent huge pages where the kernel grants them),
  the size rounded up to 2 MiB.

Without a GPU (functional mode) nothing can be pinned: both modes allocate
ordinary host memory through the same code (``exact`` still maps exactly) and
:attr:`HostAllocation.note` says so; ``pinned_bytes`` is then 0.  The runtime
that registers memory is injectable (:func:`use_runtime`) so that the exact
path's register / unregister calls and its failures can be tested on a CPU.

Where a mode cannot be had (no mapping, registration refused, no
``MADV_HUGEPAGE``) :class:`HostAllocUnavailable` is raised (a
``NotImplementedError``: the engine records the case as skipped with the
message)."""

from __future__ import annotations

import collections
import contextlib
import gc
import mmap
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from ...spec.case import HOST_ALLOC_MODES

GiB = 1 << 30
PAGE_BYTES = mmap.PAGESIZE
HUGE_PAGE_BYTES = 2 << 20
#: cudaHostRegisterPortable | cudaHostRegisterMapped
REGISTER_FLAGS = 0x01 | 0x02
MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)
THP_POLICY_FILE = "/sys/kernel/mm/transparent_hugepage/enabled"
#: headroom kept free on the host besides a pinned table: max(this, HEADROOM_SHARE x available)
HEADROOM_BYTES = 4 * GiB
HEADROOM_SHARE = 0.05
#: functional mode (no pinning): a table may take at most this share of the host's memory
FUNCTIONAL_SHARE = 0.5


class HostAllocUnavailable(NotImplementedError):
    """This host-allocation mode cannot be had here; the message says why."""


# ------------------------------------------------------------------ arithmetic
def _round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def next_power_of_two(nbytes: int) -> int:
    return 1 << max(0, (nbytes - 1).bit_length())


def check_mode(mode: str) -> str:
    if mode not in HOST_ALLOC_MODES:
        raise ValueError(f"host_alloc must be one of {', '.join(HOST_ALLOC_MODES)}, got {mode!r}")
    return mode


def host_table_bytes(nbytes: int, mode: str, *, pinned: bool = True) -> int:
    """Host bytes a table of ``nbytes`` really takes in ``mode``: torch's pinned
    allocator rounds to a power of two (an unpinned torch tensor takes ``nbytes``);
    ``exact`` rounds up to the page size, ``exact_huge`` to 2 MiB."""
    check_mode(mode)
    nbytes = max(1, int(nbytes))
    if mode == "torch":
        return next_power_of_two(nbytes) if pinned else nbytes
    if mode == "exact_huge":
        return _round_up(nbytes, HUGE_PAGE_BYTES)
    return _round_up(nbytes, PAGE_BYTES)


def mode_rule(mode: str, pinned: bool = True) -> str:
    """How ``mode`` sizes a table, in words (for skip reasons and notes)."""
    if mode == "torch":
        return "torch's caching allocator: a power-of-two block" if pinned else "torch: unpinned, exact bytes"
    if mode == "exact_huge":
        return "exact: the bytes rounded up to 2 MiB"
    return f"exact: the bytes rounded up to {PAGE_BYTES} B pages"


def headroom_bytes(available: int) -> int:
    return max(HEADROOM_BYTES, int(HEADROOM_SHARE * available))


def host_fit(shard_bytes: int, ranks: int, mode: str, *, pinned: bool, available: int) -> str | None:
    """None when ``ranks`` shards of ``shard_bytes`` fit in ``available`` bytes of host
    memory in ``mode``; otherwise the reason, with the real numbers.

    Pinned (a GPU): each shard takes :func:`host_table_bytes`, and a headroom of
    :func:`headroom_bytes` stays free.  Functional mode: at most
    :data:`FUNCTIONAL_SHARE` of ``available``."""
    per_rank = host_table_bytes(shard_bytes, mode, pinned=pinned)
    need = per_rank * ranks
    if pinned:
        limit = available - headroom_bytes(available)
        rule = f"{headroom_bytes(available) / GiB:.1f} GiB kept free"
    else:
        limit = int(available * FUNCTIONAL_SHARE)
        rule = f"functional mode uses at most {FUNCTIONAL_SHARE:.0%} of it"
    if need <= limit:
        return None
    ranks_txt = f"{ranks} ranks x {per_rank / GiB:.2f} GiB" if ranks > 1 else f"{shard_bytes / GiB:.2f} GiB table"
    return (f"host_alloc={mode}: the table needs {need / GiB:.1f} GiB of host memory "
            f"({ranks_txt}; {mode_rule(mode, pinned)}), {available / GiB:.1f} GiB available ({rule})")


# ------------------------------------------------------------------ the host's memory
def mem_available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (None where there is none)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def thp_policy() -> str | None:
    """The transparent-huge-page policy, e.g. "madvise" (the bracketed word), or None."""
    try:
        text = open(THP_POLICY_FILE).read()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else text.strip()


def _torch_host_stats() -> dict[str, Any]:
    try:
        return dict(torch.cuda.host_memory_stats()) if torch.cuda.is_available() else {}
    except Exception:  # noqa: BLE001 - stats are informative only
        return {}


#: pinned torch-mode table blocks given back to torch's cache by :meth:`HostAllocation.close`
#: and not taken since (block bytes -> count); emptied by :func:`release_cached_pinned_blocks`
_CACHED_TABLE_BLOCKS: collections.Counter = collections.Counter()


def cached_table_block(nbytes: int) -> bool:
    """Whether a pinned ``torch`` table of ``nbytes`` would be served from torch's cache, so
    that it takes no new host memory: a table of the same power-of-two block size was closed
    (the executor frees its tables, then collects garbage, before the next table's memory
    check) and torch still holds at least that many pinned bytes (its statistics; nothing was
    given back to the system since).  torch serves a request from a free block of its
    power-of-two size class, after retiring the completed events of blocks freed with pending
    stream uses (a table filled by non-blocking copies is one: its block counts as active until
    then), so a 32 GiB table's 64 GiB block serves the 47.7 GiB table.  False where the
    statistics are not known."""
    block = host_table_bytes(nbytes, "torch")
    if _CACHED_TABLE_BLOCKS.get(block, 0) <= 0:
        return False
    held = _torch_host_stats().get("allocated_bytes.current")
    return held is not None and int(held) >= block


def release_cached_pinned_blocks() -> int:
    """Give torch's cached (freed, unused) pinned blocks back to the system; the bytes
    released as far as torch's host statistics tell (0 when unknown)."""
    gc.collect()
    _CACHED_TABLE_BLOCKS.clear()
    fn = getattr(torch._C, "_host_emptyCache", None)
    if fn is None or not torch.cuda.is_available():
        return 0
    before = _torch_host_stats().get("allocated_bytes.current", 0)
    fn()
    after = _torch_host_stats().get("allocated_bytes.current", 0)
    return max(0, int(before) - int(after))


# ------------------------------------------------------------------ registration
class CudartRuntime:
    """``cudaHostRegister`` / ``cudaHostUnregister`` through torch's cudart bindings."""

    def register(self, ptr: int, nbytes: int, flags: int) -> int:
        return _code(torch.cuda.cudart().cudaHostRegister(ptr, nbytes, flags))

    def unregister(self, ptr: int) -> int:
        return _code(torch.cuda.cudart().cudaHostUnregister(ptr))


def _code(ret: Any) -> int:
    if isinstance(ret, tuple):  # cuda-bindings style (err,) tuples
        ret = ret[0]
    return int(getattr(ret, "value", ret))


_RUNTIME_OVERRIDE: Any = None


@contextlib.contextmanager
def use_runtime(runtime: Any) -> Iterator[Any]:
    """Register through ``runtime`` (an object with ``register(ptr, nbytes, flags) -> code``
    and ``unregister(ptr) -> code``; 0 = success) inside the block, also without a GPU:
    how tests check the exact path."""
    global _RUNTIME_OVERRIDE
    previous, _RUNTIME_OVERRIDE = _RUNTIME_OVERRIDE, runtime
    try:
        yield runtime
    finally:
        _RUNTIME_OVERRIDE = previous


# ------------------------------------------------------------------ allocation
@dataclass
class HostAllocation:
    """One table's host allocation: what it took and how to free it exactly."""

    mode: str
    nbytes: int  # the table's bytes
    host_bytes: int  # bytes the allocation reserves (block / mapping)
    pinned_bytes: int  # bytes page-locked for the GPU (0: nothing pinned)
    alloc_s: float = 0.0  # seconds to allocate (and pin)
    note: str = ""
    from_cache: bool | None = None  # torch mode: the block came from torch's cache (no new pinning)
    freed: bool = False
    _mapping: mmap.mmap | None = field(default=None, repr=False)
    _registered_ptr: int | None = field(default=None, repr=False)
    _runtime: Any = field(default=None, repr=False)
    _device: torch.device | None = field(default=None, repr=False)

    def close(self) -> None:
        """Free the allocation: ``exact`` unregisters the pinned range and unmaps it
        (once no tensor views it any more: a view still alive keeps the mapping until
        it is dropped).  ``torch``: the block goes back to torch's cache."""
        if self.freed:
            return
        self.freed = True
        if self.mode == "torch" and self.pinned_bytes:
            _CACHED_TABLE_BLOCKS[self.host_bytes] += 1  # the block goes back to torch's cache
        if self._registered_ptr is not None:
            if self._device is not None and self._device.type == "cuda":
                torch.cuda.synchronize(self._device)  # no kernel may still read the range
            code = self._runtime.unregister(self._registered_ptr)
            self._registered_ptr = None
            if code != 0:
                self.note += f"; cudaHostUnregister returned {code}"
        if self._mapping is not None:
            mapping, self._mapping = self._mapping, None
            gc.collect()
            try:
                mapping.close()
            except BufferError:
                self.note += "; the mapping is unmapped when the last tensor viewing it is dropped"


@dataclass
class HandedTable:
    """A filled table one backend gave up for another to read (``hand_over_table`` /
    ``table=``): the tensor and its allocation, which the taker frees on its close."""

    weight: torch.Tensor
    allocation: HostAllocation


def allocate_pinned(rows: int, dim: int, dtype: torch.dtype, mode: str,
                    device: torch.device | str | None) -> tuple[torch.Tensor, HostAllocation]:
    """A ``rows x dim`` host tensor of ``dtype`` for a table read from ``device``,
    allocated in ``mode``, and the :class:`HostAllocation` that records it.  Pinned
    when ``device`` is CUDA; ordinary host memory otherwise (functional mode)."""
    check_mode(mode)
    device = torch.device(device) if device is not None else torch.device("cpu")
    pinned = device.type == "cuda"
    elem = torch.empty((), dtype=dtype).element_size()
    nbytes = rows * dim * elem
    if mode == "torch":
        return _allocate_torch(rows, dim, dtype, nbytes, pinned)
    return _allocate_exact(rows, dim, dtype, nbytes, mode, device, pinned)


def _allocate_torch(rows: int, dim: int, dtype: torch.dtype, nbytes: int,
                    pinned: bool) -> tuple[torch.Tensor, HostAllocation]:
    before = _torch_host_stats().get("num_host_alloc") if pinned else None
    t0 = time.perf_counter()
    table = torch.empty(rows, dim, dtype=dtype, device="cpu", pin_memory=pinned)
    alloc_s = time.perf_counter() - t0
    host = host_table_bytes(nbytes, "torch", pinned=pinned)
    alloc = HostAllocation("torch", nbytes, host, host if pinned else 0, alloc_s)
    if pinned:
        after = _torch_host_stats().get("num_host_alloc")
        if before is not None and after is not None:
            alloc.from_cache = after == before
        if alloc.from_cache and _CACHED_TABLE_BLOCKS.get(host, 0) > 0:
            _CACHED_TABLE_BLOCKS[host] -= 1  # this table took a closed table's block
        alloc.note = ("torch.empty(pin_memory=True): a power-of-two block"
                      + (" served from torch's cache (pinned earlier)" if alloc.from_cache else ""))
    else:
        alloc.note = "functional mode: torch.empty in ordinary host memory (no pinning without CUDA)"
    return table, alloc


def prefault(region: torch.Tensor) -> None:
    """Touch one byte of every page of ``region`` (uint8, a fresh anonymous mapping) with torch's
    intra-op threads, so the kernel faults and zeroes the pages in parallel; cudaHostRegister then
    pins pages that are there (it faulted them one by one: 15-30 s for 47.7 GiB on the H200 hosts).
    The pages are the same ones the register would have faulted."""
    if region.numel():
        region[::PAGE_BYTES].fill_(0)


def _allocate_exact(rows: int, dim: int, dtype: torch.dtype, nbytes: int, mode: str,
                    device: torch.device, pinned: bool) -> tuple[torch.Tensor, HostAllocation]:
    huge = mode == "exact_huge"
    if huge and MADV_HUGEPAGE is None:
        raise HostAllocUnavailable("host_alloc=exact_huge: this Python/kernel has no MADV_HUGEPAGE")
    runtime = _RUNTIME_OVERRIDE if _RUNTIME_OVERRIDE is not None else (CudartRuntime() if pinned else None)
    length = host_table_bytes(nbytes, mode)
    span = length + (HUGE_PAGE_BYTES if huge else 0)  # room to start on a 2 MiB boundary
    t0 = time.perf_counter()
    try:
        mapping = mmap.mmap(-1, span, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                            prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, ValueError, OverflowError) as exc:
        raise HostAllocUnavailable(f"host_alloc={mode}: cannot map {span / GiB:.2f} GiB of anonymous memory: "
                                   f"{exc}") from exc
    # torch.frombuffer keeps a reference to the object it is given but releases its buffer
    # export at once: given the mapping itself, mmap.close() would unmap memory that tensors
    # still view.  Given a memoryview, the export lives as long as the tensor's storage, so
    # close() refuses (BufferError) while any view of the table is alive.
    whole = torch.frombuffer(memoryview(mapping), dtype=torch.uint8)
    base = whole.data_ptr()
    offset = (-base) % HUGE_PAGE_BYTES if huge else 0
    if huge:
        mapping.madvise(MADV_HUGEPAGE, offset, length)
    ptr = base + offset
    alloc = HostAllocation(mode, nbytes, length, 0, _mapping=mapping, _device=device)
    pages = "2 MiB transparent huge pages advised" if huge else f"THP policy {thp_policy() or 'unknown'}"
    if runtime is not None:
        prefault(whole[offset: offset + length])
        code = runtime.register(ptr, length, REGISTER_FLAGS)
        if code != 0:
            del whole
            alloc.close()
            raise HostAllocUnavailable(
                f"host_alloc={mode}: cudaHostRegister of {length / GiB:.2f} GiB failed (cudaError {code}); "
                "exact pinning cannot be had here")
        alloc._registered_ptr, alloc._runtime = ptr, runtime
        alloc.pinned_bytes = length
    table = whole[offset : offset + nbytes].view(dtype).view(rows, dim)
    del whole
    alloc.alloc_s = time.perf_counter() - t0
    if pinned and not table.is_pinned():
        del table
        alloc.close()
        raise HostAllocUnavailable(f"host_alloc={mode}: the registered range does not read as pinned memory")
    if pinned:
        alloc.note = f"cudaHostRegister over an anonymous mapping of {length} B ({pages})"
    elif runtime is not None:
        alloc.note = (f"functional mode: an anonymous mapping of {length} B ({pages}), registered through "
                      f"{type(runtime).__name__} (ordinary host memory, not pinned)")
    else:
        alloc.note = (f"functional mode: an anonymous mapping of {length} B ({pages}) in ordinary host memory "
                      "(no pinning without CUDA)")
    return table, alloc


def allocation_fields(alloc: HostAllocation | None) -> dict[str, Any]:
    """The record fields of one allocation (see :mod:`ple_bench.results`)."""
    if alloc is None:
        return {}
    return {"pinned_bytes": alloc.pinned_bytes, "host_table_bytes": alloc.host_bytes,
            "table_alloc_s": alloc.alloc_s, "host_alloc_note": alloc.note,
            "host_alloc_from_cache": alloc.from_cache}
