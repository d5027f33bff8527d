"""Alternative lookup paths over a pinned host table, as backends.

* ``pinned_cpu_gather`` (:class:`PinnedCPUGatherEmbedding`): the host's cores
  gather the rows (one ``index_select`` on the host table with torch's intra-op
  threads) into a pinned staging buffer, then one asynchronous host->device
  copy on the side stream.  No GPU thread touches host memory row by row.
* ``pinned_hot_cache`` (:class:`PinnedHotCacheEmbedding`): a cache of hot rows
  in GPU memory in front of the pinned table; hits are read from device memory,
  misses through the UVA view, in one kernel (``triton_tuned`` with a cache).

Both keep ``pinned_uva``'s interface, prefetch buffer, side stream, ETP reduce
and DP selection (they subclass :class:`PinnedUVAEmbedding`), and run in CPU
functional mode too.  ``sm_limit`` (a green-context side stream) applies to the
hot cache's kernel; the CPU gather, which runs no kernel, refuses it.
"""

from __future__ import annotations

import contextlib

import torch

from ..annotate import annotate
from .cudart import copy_h2d_async
from .formats import int_view
from .host_prefetch import HostPathEmbedding, StagingBuffer
from .pinned import PinnedUVAEmbedding
from .registry import register_backend

#: most host threads a gather uses by default (beyond this a decode-size gather gains nothing)
MAX_DEFAULT_GATHER_THREADS = 16


def default_gather_threads() -> int:
    """The cores torch sees (its intra-op thread count), at most 16."""
    return max(1, min(MAX_DEFAULT_GATHER_THREADS, torch.get_num_threads()))


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


@register_backend("pinned_cpu_gather")
class PinnedCPUGatherEmbedding(HostPathEmbedding):
    """Host gather + one H2D copy.

    The gather is one ``torch.index_select`` of the rows into a pinned staging
    buffer (reused: a new gather waits only for the last copy out of it), with
    torch's own intra-op threads -- ``gather_threads`` of them (default: the
    cores torch sees, at most 16) -- and nothing around it: one level of
    parallelism.  Then one asynchronous host->device copy of the staging buffer
    into the output, on the side stream when prefetching.  Ids this rank does
    not own (ETP > 1) get zero rows.  See :mod:`.host_prefetch` for where the
    ids come from and what the prefetch waits for.
    """

    thread_name = "ple_cpu_gather"
    sm_limit_refusal = ("pinned_cpu_gather gathers on the host's cores and copies with the copy "
                        "engines; no SMs run its lookup, so an SM limit does not apply")

    def __init__(self, num_embeddings: int, embedding_dim: int, *, gather_threads: int = 0,
                 **kwargs) -> None:
        super().__init__(num_embeddings, embedding_dim, **kwargs)
        if isinstance(gather_threads, bool) or not isinstance(gather_threads, int) or gather_threads < 0:
            raise ValueError(f"gather_threads must be a non-negative integer, got {gather_threads!r}")
        self.gather_threads = gather_threads or default_gather_threads()
        self._staging = StagingBuffer(pinned=not self.functional)

    def host_thread_initializer(self):
        n = self.gather_threads
        return lambda: torch.set_num_threads(n)

    # ----------------------------------------------------------- host side
    def host_gather(self, host_ids: torch.Tensor, dest: torch.Tensor) -> None:
        """Rows of ``host_ids`` (CPU int64, flat, global) into ``dest`` (CPU
        ``[n, dim]``), zero rows for ids outside the shard; counted as host work."""
        with self.host_thread_time(), torch_threads(self.gather_threads):
            table = byte_rows(self.weight)
            out = byte_rows(dest)
            start, end = self.shard.vocab_start, self.shard.vocab_end
            if start == 0 and end == self.num_embeddings:  # the whole table: every id is this rank's
                torch.index_select(table, 0, host_ids, out=out)
                return
            owned = (host_ids >= start) & (host_ids < end)
            local = torch.where(owned, host_ids - start, torch.zeros_like(host_ids))
            torch.index_select(table, 0, local, out=out)
            out.masked_fill_(~owned.unsqueeze(1), 0)

    def host_rows(self, host_ids: torch.Tensor, dest: torch.Tensor, stream) -> None:
        if dest.device.type == "cpu":
            self.host_gather(host_ids, dest)
            return
        with self._staging.lock:
            staging = self._staging.take(host_ids.numel(), dest.shape[1], dest.dtype)
            self.host_gather(host_ids, staging)
            copy_h2d_async(dest, staging, stream)
            self._staging.copied_on(stream)

    def close(self) -> None:
        super().close()
        self._staging.release()


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
    warms_cache = True

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
    def local_lookup(self, ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        from .fast_kernels import triton_tuned_lookup, tuned_lookup

        out = self._lookup_output(ids, out)
        flat = self.device_ids(ids).reshape(-1).to(torch.int64)
        dest = int_view(out).view(-1, self.embedding_dim)
        table = int_view(self.table_for_kernel())
        start, end = self.shard.vocab_start, self.shard.vocab_end
        with annotate("lookup", color="green"):
            owned = (flat >= start) & (flat < end)
            cached = self._cached_ids
            if cached.numel() == 0:
                hit = torch.zeros_like(owned)
                self.run_kernel(table, flat, dest, start, end)
            else:
                local = flat - start
                pos = torch.searchsorted(cached, local).clamp_(max=cached.numel() - 1)
                hit = cached[pos] == local  # implies owned: cached rows are in [0, num_valid)
                slots = torch.where(hit, pos, torch.full_like(pos, -1))
                cache = int_view(self._cache)
                if self.kernel is triton_tuned_lookup:
                    tuned_lookup(table, flat, dest, start, end, cache=cache, slots=slots,
                                 max_programs=self.grid_cap)
                else:
                    misses = torch.where(hit, torch.full_like(flat, -1), flat)
                    self.run_kernel(table, misses, dest, start, end)
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
