"""Alternative lookup paths over a pinned host table, as backends.

* ``pinned_cpu_gather`` (:class:`PinnedCPUGatherEmbedding`): the host's cores
  gather the rows (``index_select`` on the host table, split over a thread pool)
  into a pinned staging buffer, then one asynchronous host->device copy on the
  side stream.  No GPU thread touches host memory row by row.
* ``pinned_hot_cache`` (:class:`PinnedHotCacheEmbedding`): a cache of hot rows
  in GPU memory in front of the pinned table; hits are read from device memory,
  misses through the UVA view, in one kernel (``triton_tuned`` with a cache).

Both keep ``pinned_uva``'s interface, prefetch buffer, side stream, ETP reduce
and DP selection (they subclass :class:`PinnedUVAEmbedding`), and run in CPU
functional mode too.  ``sm_limit`` (a green-context side stream) applies to the
hot cache's kernel; the CPU gather, which runs no kernel, refuses it.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Sequence

import torch

from ..annotate import annotate
from .formats import int_view
from .pinned import PinnedUVAEmbedding
from .registry import register_backend

# Below this many bytes a gather runs in one call (thread hand-off costs more).
PARALLEL_GATHER_MIN_BYTES = 1 << 20


def _default_threads() -> int:
    return max(1, min(8, os.cpu_count() or 1))


@register_backend("pinned_cpu_gather")
class PinnedCPUGatherEmbedding(PinnedUVAEmbedding):
    """Host gather + one H2D copy.

    Prefetch: ``start_prefetch`` enqueues, on the side stream, a copy of the
    (gathered) ids into a pinned host buffer and an event, then hands the rest
    to a background thread and returns at once -- neither the host nor the main
    stream waits.  The thread waits for the ids (the one device->host sync of
    this path: the GPU must have produced the ids, so the gather cannot start
    before the ids' producer has run), gathers on the host, and enqueues the
    host->device copy on the side stream.  ``finalize`` joins the thread, then
    the main stream waits for the side stream.  Ids already on the host skip the
    device->host copy.

    The synchronous ``lookup`` copies the ids to the host (a blocking sync),
    gathers, and copies the rows back on the current stream.

    Host work cannot be captured in a CUDA graph: this path runs eagerly only
    (its ``start_prefetch`` / ``finalize`` can be eager breaks of a graph).
    ``gather_threads`` (default ``min(8, cores)``) splits gathers of 1 MiB and
    more over a thread pool (``index_select`` releases the GIL).
    """

    supports_prefetch = True
    default_kernel = "torch_masked"  # not used by this path's lookups
    sm_limit_refusal = ("pinned_cpu_gather gathers on the host's cores and copies with the copy "
                        "engines; no SMs run its lookup, so an SM limit does not apply")

    def __init__(self, num_embeddings: int, embedding_dim: int, *, gather_threads: int = 0,
                 **kwargs) -> None:
        super().__init__(num_embeddings, embedding_dim, **kwargs)
        if isinstance(gather_threads, bool) or not isinstance(gather_threads, int) or gather_threads < 0:
            raise ValueError(f"gather_threads must be a non-negative integer, got {gather_threads!r}")
        self.gather_threads = gather_threads or _default_threads()
        self._gather_pool: ThreadPoolExecutor | None = None
        self._prefetch_pool: ThreadPoolExecutor | None = None
        self._future: Future | None = None
        self._staging: torch.Tensor | None = None  # pinned [rows, dim] int view
        self._host_ids: torch.Tensor | None = None  # pinned int64
        self._copy_done: torch.cuda.Event | None = None  # last H2D copy out of the staging buffer
        self._staging_lock = threading.Lock()
        self._inflight_ref: torch.Tensor | None = None

    # ----------------------------------------------------------- host side
    def _host_buffer(self, name: str, rows: int, cols: int | None, dtype: torch.dtype) -> torch.Tensor:
        buf = getattr(self, name)
        shape = (rows,) if cols is None else (rows, cols)
        if buf is None or buf.shape[0] < rows:
            buf = torch.empty(shape, dtype=dtype, pin_memory=not self.functional)
            setattr(self, name, buf)
        return buf[:rows]

    def _gather_chunk(self, ids: torch.Tensor, dest: torch.Tensor) -> None:
        with self.host_thread_time():
            self._gather_rows(ids, dest)

    def _gather_rows(self, ids: torch.Tensor, dest: torch.Tensor) -> None:
        table = int_view(self.weight)
        start, end = self.shard.vocab_start, self.shard.vocab_end
        owned = (ids >= start) & (ids < end)
        local = torch.where(owned, ids - start, torch.zeros_like(ids))
        torch.index_select(table, 0, local, out=dest)
        dest.masked_fill_(~owned.unsqueeze(1), 0)

    def host_gather(self, host_ids: torch.Tensor, dest: torch.Tensor) -> None:
        """Rows of ``host_ids`` (CPU int64, flat) into ``dest`` (CPU ``[n, dim]``
        integer view), zero rows for ids outside the shard; split over
        ``gather_threads`` threads when large."""
        n = host_ids.numel()
        threads = self.gather_threads
        if threads <= 1 or n * self.row_bytes < PARALLEL_GATHER_MIN_BYTES or n < 2 * threads:
            self._gather_chunk(host_ids, dest)
            return
        if self._gather_pool is None:
            self._gather_pool = ThreadPoolExecutor(threads, thread_name_prefix="ple_gather")
        step = -(-n // threads)
        futures = [
            self._gather_pool.submit(self._gather_chunk, host_ids[i : i + step], dest[i : i + step])
            for i in range(0, n, step)
        ]
        for f in futures:
            f.result()

    def _wait_staging_free(self) -> None:
        if self._copy_done is not None:
            self._copy_done.synchronize()
            self._copy_done = None

    # ----------------------------------------------------------- lookup
    def _local_lookup(self, ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        out = self._lookup_output(ids, out)
        flat = ids.reshape(-1).to(torch.int64)
        dest = int_view(out).view(-1, self.embedding_dim)
        with annotate("lookup", color="green"):
            host_ids = flat.cpu()  # blocking device->host copy when the ids are on the GPU
            if dest.device.type == "cpu":
                self.host_gather(host_ids, dest)
                return out
            with self._staging_lock:
                self._wait_staging_free()
                staging = self._host_buffer("_staging", flat.numel(), self.embedding_dim, dest.dtype)
                self.host_gather(host_ids, staging)
                dest.copy_(staging, non_blocking=True)
                self._copy_done = torch.cuda.Event()
                self._copy_done.record(torch.cuda.current_stream(self.device))
        return out

    # ----------------------------------------------------------- prefetch
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
                host_ids = self._host_buffer("_host_ids", n, None, torch.int64)
                with torch.cuda.stream(stream):
                    host_ids.copy_(flat, non_blocking=True)
                    ids_ready = torch.cuda.Event()
                    ids_ready.record(stream)
                flat.record_stream(stream)
                self._inflight_ref = flat
            if self._prefetch_pool is None:
                self._prefetch_pool = ThreadPoolExecutor(1, thread_name_prefix="ple_prefetch")
            self._future = self._prefetch_pool.submit(self._prefetch_work, host_ids, ids_ready, dest)
            self._pending = (gathered.shape[0], slot, local)

    def _prefetch_work(self, host_ids: torch.Tensor, ids_ready, dest: torch.Tensor) -> None:
        with self.host_thread_time():  # the worker's waits and copies count too
            self._prefetch_rows(host_ids, ids_ready, dest)

    def _prefetch_rows(self, host_ids: torch.Tensor, ids_ready, dest: torch.Tensor) -> None:
        if dest.device.type == "cpu":
            self.host_gather(host_ids, dest)
            return
        with torch.cuda.device(self.device):
            if ids_ready is not None:
                ids_ready.synchronize()
            with self._staging_lock:
                self._wait_staging_free()
                staging = self._host_buffer("_staging", host_ids.numel(), self.embedding_dim, dest.dtype)
                self.host_gather(host_ids, staging)
                with torch.cuda.stream(self._stream):
                    dest.copy_(staging, non_blocking=True)
                    done = torch.cuda.Event()
                    done.record(self._stream)
                self._copy_done = done

    def _join(self) -> None:
        future, self._future = self._future, None
        if future is not None:
            try:
                future.result()
            finally:
                self._inflight_ref = None

    def finalize(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """Wait for the host gather, then as ``pinned_uva``: join the side
        stream, reduce over ETP, select this DP rank's rows."""
        if self._future is None:
            raise RuntimeError("pinned PLE finalize requires a prior start_prefetch")
        self._join()
        return super().finalize(out)

    def close(self) -> None:
        try:
            self._join()
        except Exception:
            pass
        for pool in (self._gather_pool, self._prefetch_pool):
            if pool is not None:
                pool.shutdown(wait=True)
        self._gather_pool = self._prefetch_pool = None
        self._staging = self._host_ids = None
        self._copy_done = None
        super().close()


@register_backend("pinned_hot_cache")
class PinnedHotCacheEmbedding(PinnedUVAEmbedding):
    """A cache of ``cache_rows`` hot rows of this shard in GPU memory.

    Which rows: :meth:`warm_cache` picks the most frequent owned rows of an id
    sample (the benchmark knows the id distribution), filling any remaining
    capacity with the lowest rows; until it is called the cache holds the
    shard's first ``cache_rows`` rows.  The cache is refreshed from the table by
    ``load_full_table`` / ``fill_synthetic`` (call :meth:`refresh_cache` after
    writing ``weight`` directly).

    Lookup: ``searchsorted`` of the ids in the sorted cached row ids gives each
    id its cache row or -1; then one pass reads hits from the cache and misses
    through the UVA view (``triton_tuned`` with a cache; any other kernel looks
    up the misses and the hits are merged with ``torch.where``).  No host sync.

    Hit rate: hits / ids this rank owns (unowned ids are not this rank's
    lookups).  Counters stay on the device; reading ``last_hit_rate`` or
    ``stats()`` syncs (read them after ``finalize``).  The device counters also
    advance in CUDA-graph replays; ``stats()["lookups"]`` counts eager calls only.
    """

    supports_prefetch = True
    default_kernel = "triton_tuned"

    def __init__(self, num_embeddings: int, embedding_dim: int, *, cache_rows: int = 0,
                 **kwargs) -> None:
        if isinstance(cache_rows, bool) or not isinstance(cache_rows, int) or cache_rows < 0:
            raise ValueError(f"cache_rows must be a non-negative integer, got {cache_rows!r}")
        super().__init__(num_embeddings, embedding_dim, **kwargs)
        self.cache_rows = cache_rows
        dev = self.device
        self._cached_ids = torch.empty(0, dtype=torch.int64, device=dev)  # sorted local rows
        self._cache = torch.empty(0, embedding_dim, dtype=self.storage_dtype, device=dev)
        self._chosen: torch.Tensor | None = None  # CPU copy of the cached local rows
        self._hits = torch.zeros((), dtype=torch.int64, device=dev)
        self._owned = torch.zeros((), dtype=torch.int64, device=dev)
        self._last_hits = torch.zeros((), dtype=torch.int64, device=dev)
        self._last_owned = torch.zeros((), dtype=torch.int64, device=dev)
        self._calls = 0

    # ----------------------------------------------------------- cache content
    def _fallback_rows(self, count: int, exclude: torch.Tensor | None = None) -> torch.Tensor:
        limit = self.shard.num_valid
        if exclude is None or exclude.numel() == 0:
            return torch.arange(min(count, limit), dtype=torch.int64)
        candidates = torch.arange(min(limit, count + exclude.numel()), dtype=torch.int64)
        candidates = candidates[~torch.isin(candidates, exclude)]
        return candidates[:count]

    def warm_cache(self, ids_sample: torch.Tensor | None = None) -> torch.Tensor:
        """Choose the cached rows: the ``cache_rows`` most frequent rows of this
        shard in ``ids_sample`` (global ids, any shape; ties: lower id first),
        then the lowest rows not yet chosen.  Loads them and returns the chosen
        global ids (sorted)."""
        cap = min(self.cache_rows, self.shard.num_valid)
        start, end = self.shard.vocab_start, self.shard.vocab_end
        chosen = torch.empty(0, dtype=torch.int64)
        if ids_sample is not None and cap > 0:
            flat = ids_sample.reshape(-1).to(device="cpu", dtype=torch.int64)
            flat = flat[(flat >= start) & (flat < end)] - start
            if flat.numel():
                rows, counts = torch.unique(flat, return_counts=True)  # rows ascending
                order = torch.sort(counts, descending=True, stable=True).indices
                chosen = rows[order[:cap]]
        if chosen.numel() < cap:
            chosen = torch.cat((chosen, self._fallback_rows(cap - chosen.numel(), chosen)))
        self._chosen = torch.sort(chosen).values
        self.refresh_cache()
        return self._chosen + start

    def refresh_cache(self) -> None:
        """(Re)load the chosen rows from the table into the device cache."""
        if self._chosen is None:
            self._chosen = self._fallback_rows(min(self.cache_rows, self.shard.num_valid))
        chosen = self._chosen
        rows = int_view(self.weight).index_select(0, chosen)
        cache = torch.empty(chosen.numel(), self.embedding_dim, dtype=self.storage_dtype, device=self.device)
        int_view(cache).copy_(rows)
        self._cache = cache
        self._cached_ids = chosen.to(self.device)

    @property
    def cached_ids(self) -> torch.Tensor:
        """Global ids of the cached rows (sorted)."""
        return self._cached_ids + self.shard.vocab_start

    def load_full_table(self, full: torch.Tensor, scale: float | None = None) -> None:
        super().load_full_table(full, scale)
        self.refresh_cache()

    def fill_synthetic(self, seed: int, scale: float | None = None) -> None:
        super().fill_synthetic(seed, scale)
        self.refresh_cache()

    # ----------------------------------------------------------- lookup
    def _local_lookup(self, ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        from .fast_kernels import triton_tuned_lookup, tuned_lookup

        out = self._lookup_output(ids, out)
        flat = ids.reshape(-1).to(torch.int64)
        dest = int_view(out).view(-1, self.embedding_dim)
        table = int_view(self.table_for_kernel())
        start, end = self.shard.vocab_start, self.shard.vocab_end
        with annotate("lookup", color="green"):
            owned = (flat >= start) & (flat < end)
            cached = self._cached_ids
            if cached.numel() == 0:
                hit = torch.zeros_like(owned)
                self.kernel(table, flat, dest, start, end)
            else:
                local = flat - start
                pos = torch.searchsorted(cached, local).clamp_(max=cached.numel() - 1)
                hit = cached[pos] == local  # implies owned: cached rows are in [0, num_valid)
                slots = torch.where(hit, pos, torch.full_like(pos, -1))
                cache = int_view(self._cache)
                if self.kernel is triton_tuned_lookup:
                    tuned_lookup(table, flat, dest, start, end, cache=cache, slots=slots)
                else:
                    misses = torch.where(hit, torch.full_like(flat, -1), flat)
                    self.kernel(table, misses, dest, start, end)
                    hot = cache.index_select(0, slots.clamp(min=0))
                    dest.copy_(torch.where(hit.unsqueeze(1), hot, dest))
            self._last_hits = hit.sum()
            self._last_owned = owned.sum()
            self._hits += self._last_hits
            self._owned += self._last_owned
            self._calls += 1
        return out

    # ----------------------------------------------------------- statistics
    @property
    def last_hit_rate(self) -> float:
        """Hits / owned ids of the last lookup (0.0 before any; syncs)."""
        owned = int(self._last_owned)
        return int(self._last_hits) / owned if owned else 0.0

    def stats(self) -> dict:
        hits, owned = int(self._hits), int(self._owned)
        return {
            "cache_rows": self.cache_rows,
            "cached_rows": int(self._cached_ids.numel()),
            "cache_bytes": int(self._cache.numel() * self._cache.element_size()),
            "lookups": self._calls,
            "ids_owned": owned,
            "hits": hits,
            "hit_rate": hits / owned if owned else 0.0,
            "last_hit_rate": self.last_hit_rate,
        }

    def reset_stats(self) -> None:
        for t in (self._hits, self._owned, self._last_hits, self._last_owned):
            t.zero_()
        self._calls = 0

    def close(self) -> None:
        self._cache = None  # type: ignore[assignment]
        self._cached_ids = None  # type: ignore[assignment]
        super().close()
