"""``pinned_hot_cache`` (:class:`PinnedHotCacheEmbedding`): a cache of hot rows in GPU memory in
front of the pinned table; hits are read from device memory, misses through the UVA view, in one
kernel (``triton_tuned`` with a cache).

It subclasses :class:`~.pinned_uva.PinnedUVAEmbedding` (interface, prefetch buffer, side stream,
ETP reduce, DP selection) and runs in CPU functional mode too; ``sm_limit`` (a green-context side
stream) applies to its kernel.
"""

from __future__ import annotations

import torch

from ..annotate import annotate
from .fast_kernels import triton_tuned_lookup, tuned_lookup
from .formats import int_view
from .pinned_uva import PinnedUVAEmbedding


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

    name = "pinned_hot_cache"

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
