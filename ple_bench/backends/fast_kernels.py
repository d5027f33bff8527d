"""Alternative lookup kernels a user might pick instead of the reference one.

Registered names (all follow the :mod:`kernels` contract: integer views of the
table and output, zero rows for ids outside ``[vocab_start, vocab_end)``):

* ``torch_uva``     -- plain ``torch.index_select`` on the table as given (on the
  UVA view for ``pinned_uva``): no custom kernel.  Same code as
  ``torch_masked``, registered under its own name so records say which path ran.
* ``triton_tuned``  -- several rows per program, rows moved as the widest
  integer word that divides the row (int64 where it can: 128-bit vector loads),
  a grid-stride loop over row blocks, and a tiny tuner over
  ``(rows per program, num_warps, programs per SM)`` cached per table / row
  width / id-count bucket.  Grid-capped (``max_programs=``): a backend's
  ``grid_cap`` setting caps it per instance (the engine's ``grid_frac`` axis);
  :func:`set_max_programs` sets a process-wide default for calls without one.
* ``dedup:<inner>`` -- look up each distinct id once with ``<inner>`` and scatter
  the rows back; sync-free (no ``torch.unique``), so it works on the prefetch
  side stream and under CUDA-graph capture.  ``dedup_triton`` =
  ``dedup:triton_tuned``, ``dedup_torch`` = ``dedup:torch_masked``.
  ``dedup:`` names exist for every kernel registered when this module is
  imported; :func:`make_dedup_kernel` wraps any other kernel.

:func:`tuned_lookup` also serves the hot-row cache backend: given a device
``cache`` and per-id ``slots`` it reads hits from the cache and misses from the
table in one pass.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Callable

import torch

from .kernels import (
    LookupKernel,
    get_kernel,
    grid_capped,
    kernel_names,
    register_kernel,
    sorted_reads,
    takes_grid_cap,
    torch_masked_lookup,
)

# ----------------------------------------------------------------- torch_uva


@register_kernel("torch_uva")
def torch_uva_lookup(table, flat_ids, out, vocab_start, vocab_end):
    """``index_select`` straight on the (UVA) table, then zero the rows this
    rank does not own.  The second pass touches only ``out`` in device memory,
    which is small next to the reads over PCIe."""
    torch_masked_lookup(table, flat_ids, out, vocab_start, vocab_end)


# ----------------------------------------------------------------- triton_tuned

_INT_BY_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

# Tuning knobs, read once.
AUTOTUNE = os.environ.get("PLE_BENCH_AUTOTUNE", "1") != "0"
TUNE_MIN_IDS = 1024  # smaller calls use the default config (tuning would cost more than it saves)
MAX_BLOCK_WORDS = 256
MAX_TILE_WORDS = 8192
MAX_WORDS_PER_THREAD = 64  # keeps a tile in registers


@dataclass(frozen=True)
class TunedConfig:
    """One launch shape of the tuned kernel.

    ``rows``: rows per program per loop iteration; ``num_warps``; and
    ``programs_per_sm``: when set, the grid is capped at that many programs per
    SM and each program loops over row blocks (None: one program per block)."""

    rows: int = 4
    num_warps: int = 4
    programs_per_sm: int | None = None

    def __str__(self) -> str:
        grid = "full" if self.programs_per_sm is None else f"{self.programs_per_sm}/SM"
        return f"rows={self.rows} warps={self.num_warps} grid={grid}"


INTERPRETER_CONFIG = TunedConfig(rows=4, num_warps=1, programs_per_sm=None)

_max_programs: int | None = None
_tuned: dict[tuple, TunedConfig] = {}
_tune_lock = threading.Lock()
_built: dict[bool, object] = {}
_sm_count: dict[int, int] = {}


def set_max_programs(n: int | None) -> None:
    """Cap the tuned kernel's grid at ``n`` programs for every later launch
    (None: no cap).  Each program loops over row blocks, so any cap is correct;
    a cap of ``grid_frac * SMs`` keeps the lookup on about that share of the
    SMs (the scheduler spreads programs over SMs first), leaving the rest to
    the main stream.  See :func:`max_programs_for_grid_frac`."""
    global _max_programs
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"max programs must be a positive integer or None, got {n!r}")
    _max_programs = n


def get_max_programs() -> int | None:
    return _max_programs


def max_programs_for_grid_frac(frac: float, device: torch.device | str | int | None = None) -> int | None:
    """Programs for a ``grid_frac`` (share of the SMs); None for ``frac >= 1``."""
    if not 0 < frac:
        raise ValueError(f"grid_frac must be positive, got {frac}")
    if frac >= 1:
        return None
    return max(1, round(frac * sm_count(device)))


def sm_count(device: torch.device | str | int | None = None) -> int:
    if not torch.cuda.is_available():
        return 1
    index = torch.device("cuda", torch.cuda.current_device()).index if device is None else (
        device if isinstance(device, int) else (torch.device(device).index or 0)
    )
    if index not in _sm_count:
        _sm_count[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _sm_count[index]


def default_config(words: int) -> TunedConfig:
    """The launch shape used untuned (small batches, graph capture, tuning off):
    4 rows per program, about two words per thread."""
    tile = 4 * block_words(words)
    return TunedConfig(rows=4, num_warps=max(1, min(4, tile // 64)), programs_per_sm=None)


def _build(interpret: bool):
    if interpret in _built:
        return _built[interpret]
    import triton.language as tl  # (see kernels.triton_jit)

    def ple_lookup_rows_per_program(
        table_ptr, ids_ptr, out_ptr, slots_ptr, cache_ptr, n, vocab_start, vocab_end,
        WORDS: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr, HAS_CACHE: tl.constexpr,
    ):
        # Grid-stride over blocks of ROWS ids; each row is WORDS integer words.
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        num_blocks = (n + ROWS - 1) // ROWS  # not tl.cdiv: a jit function fails under the lazy interpreter
        for blk in range(pid, num_blocks, nprog):
            r = blk * ROWS + tl.arange(0, ROWS).to(tl.int64)
            in_batch = r < n
            gid = tl.load(ids_ptr + r, mask=in_batch, other=-1)
            owned = (gid >= vocab_start) & (gid < vocab_end)
            local = tl.where(owned, gid - vocab_start, 0)
            if HAS_CACHE:
                slot = tl.load(slots_ptr + r, mask=in_batch, other=-1)
                hit = slot >= 0
                miss = owned & (slot < 0)
                slot = tl.where(hit, slot, 0)
            else:
                miss = owned
            for c0 in tl.static_range(0, WORDS, BLOCK_D):
                cols = c0 + tl.arange(0, BLOCK_D)
                in_row = cols < WORDS
                vals = tl.load(
                    table_ptr + local[:, None] * WORDS + cols[None, :],
                    mask=miss[:, None] & in_row[None, :], other=0,
                )
                if HAS_CACHE:
                    hot = tl.load(
                        cache_ptr + slot[:, None] * WORDS + cols[None, :],
                        mask=hit[:, None] & in_row[None, :], other=0,
                    )
                    vals = tl.where(hit[:, None], hot, vals)
                tl.store(out_ptr + r[:, None] * WORDS + cols[None, :], vals,
                         mask=in_batch[:, None] & in_row[None, :])

    kernel = _jit(ple_lookup_rows_per_program, interpret)
    _built[interpret] = kernel
    return kernel


def _jit(fn, interpret: bool):
    """:func:`kernels.triton_jit`, plus: no specialisation on the id count and
    shard bounds (arguments 5-7), which would only multiply compiles."""
    import triton  # decorated lazily: TRITON_INTERPRET is read at decoration

    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
    try:
        return triton.jit(fn, do_not_specialize=[5, 6, 7])
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old


def _widest_word(row_bytes: int, *tensors: torch.Tensor) -> torch.dtype:
    for width in (8, 4, 2, 1):
        if row_bytes % width == 0 and all(t.data_ptr() % width == 0 for t in tensors):
            return _INT_BY_WIDTH[width]
    return torch.int8


def _as_words(t: torch.Tensor, word: torch.dtype) -> torch.Tensor:
    if t.dtype == word:
        return t
    if t.dtype.is_floating_point:
        t = t.view(_INT_BY_WIDTH[t.element_size()])
    return t.view(word)


def block_words(words: int) -> int:
    """Column chunk: the widest power of two (<= MAX_BLOCK_WORDS) that wastes at
    most a quarter of the lanes on the row's tail (so 20 words -> 8, 32 -> 32, 320 -> 128)."""
    best = 1
    b = 1
    while b <= MAX_BLOCK_WORDS:
        chunks = -(-words // b)
        if (chunks * b - words) * 4 <= chunks * b:
            best = b
        if b >= words:
            break
        b *= 2
    return best


def candidate_configs(words: int) -> list[TunedConfig]:
    """What the tuner tries for a row of ``words`` words."""
    bd = block_words(words)
    out = []
    for rows in (1, 2, 4, 8, 16):
        tile = rows * bd
        if tile > MAX_TILE_WORDS:
            continue
        for warps in (1, 2, 4, 8):
            if warps > 1 and warps * 32 > tile:
                continue  # more threads than words in the tile
            if tile > warps * 32 * MAX_WORDS_PER_THREAD:
                continue  # would spill registers
            for per_sm in (None, 8):
                out.append(TunedConfig(rows, warps, per_sm))
    return out


def tuned_lookup(
    table: torch.Tensor,
    flat_ids: torch.Tensor,
    out: torch.Tensor,
    vocab_start: int,
    vocab_end: int,
    *,
    cache: torch.Tensor | None = None,
    slots: torch.Tensor | None = None,
    config: TunedConfig | None = None,
    max_programs: int | None = None,
    tune: bool | None = None,
) -> TunedConfig | None:
    """The tuned kernel.  ``cache``/``slots``: hot rows in device memory and,
    per id, its cache row or -1 (hits are read from the cache, misses from the
    table).  ``config`` forces a launch shape (no tuning); ``max_programs``
    overrides :func:`set_max_programs` for this call.  Returns the config used."""
    n = flat_ids.numel()
    if n == 0:
        return None
    if table.dim() != 2 or table.stride(1) != 1 or table.stride(0) != table.shape[1]:
        raise ValueError("tuned lookup needs a contiguous [rows, dim] table")
    if out.dim() != 2 or out.shape[1] != table.shape[1] or not out.is_contiguous():
        raise ValueError("tuned lookup needs a contiguous [n, dim] output with the table's dim")
    if out.shape[0] != n or out.element_size() != table.element_size():
        raise ValueError("output must have one row per id and the table's element width")
    has_cache = cache is not None and cache.shape[0] > 0
    if has_cache and (slots is None or slots.numel() != n):
        raise ValueError("a cache needs slots: one int64 per id (cache row or -1)")
    flat_ids = flat_ids.contiguous()
    row_bytes = table.shape[1] * table.element_size()
    views = [table, out] + ([cache] if has_cache else [])
    word = _widest_word(row_bytes, *views)
    words = row_bytes // _INT_BY_WIDTH_SIZE[word]
    t = _as_words(table, word)
    o = _as_words(out, word)
    c = _as_words(cache, word) if has_cache else t
    s = slots.contiguous() if has_cache else flat_ids
    interpret = table.device.type == "cpu"
    kernel = _build(interpret)
    cap = max_programs if max_programs is not None else _max_programs

    def launch(cfg: TunedConfig) -> None:
        programs = -(-n // cfg.rows)
        if cfg.programs_per_sm is not None and not interpret:
            programs = min(programs, cfg.programs_per_sm * sm_count(table.device))
        if cap is not None:
            programs = min(programs, cap)
        kernel[(programs,)](
            t, flat_ids, o, s, c, n, vocab_start, vocab_end,
            WORDS=words, ROWS=cfg.rows, BLOCK_D=block_words(words), HAS_CACHE=has_cache,
            num_warps=cfg.num_warps,
        )

    if config is None:
        if interpret:
            config = INTERPRETER_CONFIG
        else:
            key = (table.device.index, table.data_ptr(), word, words,
                   _bucket(n), cap, has_cache)
            config = _tuned.get(key)
            if config is None:
                want = AUTOTUNE if tune is None else tune
                if want and n >= TUNE_MIN_IDS and not torch.cuda.is_current_stream_capturing():
                    config = _tune(key, words, launch)
                else:
                    config = default_config(words)
    launch(config)
    return config


_INT_BY_WIDTH_SIZE = {v: k for k, v in _INT_BY_WIDTH.items()}


def _bucket(n: int) -> int:
    """Id counts tuned together: powers of two (1024, 2048, ...)."""
    return 1 << max(0, (n - 1).bit_length())


def _tune(key: tuple, words: int, launch: Callable[[TunedConfig], None]) -> TunedConfig:
    """Time every candidate on the caller's data (current stream, CUDA events;
    blocks the host once per key) and keep the fastest."""
    with _tune_lock:
        if key in _tuned:
            return _tuned[key]
        stream = torch.cuda.current_stream()
        times: dict[TunedConfig, float] = {}
        for cfg in candidate_configs(words):
            launch(cfg)  # compile + warm
            samples = []
            for _ in range(5):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record(stream)
                launch(cfg)
                end.record(stream)
                end.synchronize()
                samples.append(start.elapsed_time(end))
            times[cfg] = sorted(samples)[len(samples) // 2]
        best = min(times, key=times.__getitem__)
        _tuned[key] = best
        return best


@register_kernel("triton_tuned")
@grid_capped
def triton_tuned_lookup(table, flat_ids, out, vocab_start, vocab_end, *, max_programs=None):
    """Several rows per program, widest-word loads, tuned launch shape."""
    tuned_lookup(table, flat_ids, out, vocab_start, vocab_end, max_programs=max_programs)


def make_tuned_kernel(*, max_programs: int | None = None, config: TunedConfig | None = None) -> LookupKernel:
    """A ``triton_tuned`` kernel with its grid cap and/or launch shape bound
    (pass it as a backend's ``kernel=``)."""

    def kernel(table, flat_ids, out, vocab_start, vocab_end):
        tuned_lookup(table, flat_ids, out, vocab_start, vocab_end,
                     max_programs=max_programs, config=config)

    kernel.__name__ = "triton_tuned_bound"
    return kernel


# ----------------------------------------------------------------- dedup


def dedup_plan(flat_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(unique, inverse)`` without a host sync: ``unique`` has ``n`` entries,
    the distinct ids sorted first and ``-1`` after them (an id no rank owns, so
    a kernel writes a zero row and reads nothing); ``unique[inverse] == ids``."""
    n = flat_ids.numel()
    ids = flat_ids.reshape(-1).to(torch.int64)
    sorted_ids, order = torch.sort(ids)
    first = torch.ones(n, dtype=torch.bool, device=ids.device)
    if n > 1:
        torch.ne(sorted_ids[1:], sorted_ids[:-1], out=first[1:])
    group = torch.cumsum(first, 0) - 1
    unique = torch.full((n,), -1, dtype=torch.int64, device=ids.device)
    unique.scatter_(0, group, sorted_ids)  # every writer of a slot writes the same id
    inverse = torch.empty_like(group)
    inverse.scatter_(0, order, group)
    return unique, inverse


def make_dedup_kernel(inner: str | LookupKernel) -> LookupKernel:
    """Wrap ``inner``: each distinct id is looked up once, rows scattered back."""
    inner_fn = get_kernel(inner)

    def dedup_lookup(table, flat_ids, out, vocab_start, vocab_end, **options):
        # options: the inner kernel's (max_programs when it is grid-capped)
        n = flat_ids.numel()
        if n == 0:
            return
        unique, inverse = dedup_plan(flat_ids)
        rows = torch.empty_like(out)
        inner_fn(table, unique, rows, vocab_start, vocab_end, **options)
        torch.index_select(rows, 0, inverse, out=out)

    dedup_lookup.__name__ = f"dedup_{getattr(inner_fn, '__name__', 'kernel')}"
    # the inner kernel reads the distinct ids in ascending order (dedup_plan sorts them)
    sorted_reads(dedup_lookup)
    return grid_capped(dedup_lookup) if takes_grid_cap(inner_fn) else dedup_lookup


def _register_dedup_variants() -> None:
    for name in [k for k in kernel_names() if not k.startswith("dedup")]:
        register_kernel(f"dedup:{name}")(make_dedup_kernel(name))
    register_kernel("dedup_triton")(get_kernel("dedup:triton_tuned"))
    register_kernel("dedup_torch")(get_kernel("dedup:torch_masked"))


_register_dedup_variants()
