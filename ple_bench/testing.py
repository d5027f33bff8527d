"""The backend contract test: run it on your own backend before you benchmark it.

::

    from ple_bench.testing import check_backend
    report = check_backend(MyEmbedding)                # or "package.module:Class", or a registered name
    report = check_backend(MyEmbedding, cache_rows=64)  # extra constructor keywords

:func:`check_backend` builds the backend in CPU functional mode (``device="cpu"``,
one rank), fills it with non-zero data and checks what the engine relies on
(:mod:`ple_bench.backends.base` declares it):

* the capabilities (:data:`~ple_bench.backends.base.CAPABILITIES`) are declared
  with the right types; ``side_stream_settings`` names only known settings;
  ``default_kernel`` is a registered kernel; the settings and reports
  (``grid_cap``, ``stats()``, ``host_thread_s``, ``prefetch_buffer``, ...) have
  the declared types;
* the table holds what ``fill_synthetic`` and ``load_full_table`` put there, and
  ``lookup`` returns exactly ``weight[ids]`` (compared byte for byte: -0.0 and NaN
  payloads count) for random ids, int64 and int32, a table edge and repeats
  included;
* ``local_lookup(ids, out=...)`` writes every byte of a poisoned ``out`` and returns
  it; ``slot_size``, ``gather_ids`` and ``reduce_rows`` are the identity on one rank;
* ``start_prefetch`` / ``finalize`` give the same rows as ``lookup`` (the engine calls
  them on every backend when a case prefetches), into a poisoned ``out=`` too, with
  the ``prefetch_buffer`` poisoned between calls; ``finalize`` without a
  ``start_prefetch`` raises ``RuntimeError``;
* after ``set_max_tokens`` a larger batch is right; ``warm_cache`` (when
  ``warms_cache``) keeps the rows right;
* ids of a bad shape or dtype raise ``ValueError`` (``lookup`` and ``start_prefetch``);
* ``close()`` may be called twice.

Any failure raises :class:`ContractError` (an ``AssertionError``) naming the
backend and the check; on success it returns the list of checks that ran."""

from __future__ import annotations

from typing import Any, Callable

import torch

from .backends import get_backend, get_kernel, synthetic_rows
from .backends.base import CAPABILITIES, SIDE_STREAM_SETTINGS, PLEEmbedding
from .backends.formats import DTYPES, int_view

__all__ = ["ContractError", "check_backend"]

POISON = 0x7F  # e4m3 NaN, fp16 NaN, a huge fp32/bf16: never a valid row of these tables


class ContractError(AssertionError):
    """A backend broke the contract (the message says which backend and which check)."""


def _poisoned(shape, dtype: torch.dtype) -> torch.Tensor:
    out = torch.empty(shape, dtype=dtype)
    out.view(torch.uint8).fill_(POISON)
    return out


def _random_table(rows: int, dim: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Non-zero random values of ``dtype``, about 1 in 16 of them -0.0 (a float sum loses its sign)."""
    gen = torch.Generator().manual_seed(seed)
    neg_zero = torch.randint(0, 16, (rows, dim), generator=gen) == 0
    if dtype == torch.float8_e4m3fn:
        raw = torch.randint(1, 256, (rows, dim), generator=gen, dtype=torch.int32)
        raw = torch.where((raw & 0x7F) == 0x7F, raw ^ 0x01, raw)  # no NaN bytes
        raw[neg_zero] = 0x80
        return raw.to(torch.uint8).view(dtype)
    table = (torch.randn(rows, dim, generator=gen) * 3.0 + 0.5).to(dtype)
    table[table == 0] = 1.0
    table[neg_zero] = -0.0
    return table


def _random_ids(tokens: int, heads: int, vocab: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (tokens, heads), generator=gen)
    ids.view(-1)[0] = 0
    ids.view(-1)[-1] = vocab - 1
    if ids.numel() > 4:
        ids.view(-1)[2] = ids.view(-1)[1]  # a repeat
    return ids.to(dtype)


class _Checker:
    def __init__(self, label: str) -> None:
        self.label = label
        self.ran: list[str] = []

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            raise ContractError(f"{self.label}: {what}")

    def done(self, name: str) -> None:
        self.ran.append(name)

    def same_bytes(self, got: torch.Tensor, want: torch.Tensor, what: str) -> None:
        self.check(isinstance(got, torch.Tensor), f"{what}: returned {type(got).__name__}, not a tensor")
        self.check(tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)}, expected "
                                                          f"{tuple(want.shape)}")
        self.check(got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}")
        a = got.detach().to("cpu").contiguous().view(torch.uint8)
        b = want.detach().to("cpu").contiguous().view(torch.uint8)
        bad = int((a != b).sum())
        self.check(bad == 0, f"{what}: {bad} of {b.numel()} bytes differ from weight[ids]")

    def raises(self, exc: type[BaseException], fn: Callable[[], Any], what: str) -> None:
        try:
            fn()
        except exc:
            return
        except Exception as other:  # noqa: BLE001 - the wrong exception is the finding
            raise ContractError(f"{self.label}: {what}: raised {type(other).__name__}: {other}, "
                                f"expected {exc.__name__}") from other
        raise ContractError(f"{self.label}: {what}: did not raise {exc.__name__}")


def _resolve(cls: type | str) -> type:
    if isinstance(cls, str):
        return get_backend(cls)
    return cls


def check_backend(cls: type | str, *, dtypes: tuple[str, ...] = ("bf16", "fp8"), vocab_size: int = 1000,
                  dim: int = 24, num_heads: int = 3, num_tokens: int = 8, seed: int = 0,
                  **kwargs: Any) -> list[str]:
    """Check backend ``cls`` (a class, a registered name or ``package.module:Class``)
    against the contract; ``kwargs`` go to its constructor.  Returns the checks that
    ran; raises :class:`ContractError` at the first one that fails."""
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown:  # the caller's mistake, not the backend's
        raise ValueError(f"dtypes: unknown {unknown}; allowed: {sorted(DTYPES)}")
    cls = _resolve(cls)
    c = _Checker(getattr(cls, "__qualname__", repr(cls)))
    c.check(isinstance(cls, type) and issubclass(cls, PLEEmbedding),
            "is not a subclass of ple_bench.backends.PLEEmbedding")
    _check_capabilities(c, cls)
    for dtype in dtypes:
        _check_instance(c, cls, dtype, vocab_size, dim, num_heads, num_tokens, seed, kwargs)
    return c.ran


def _check_capabilities(c: _Checker, cls: type) -> None:
    for name, kind in CAPABILITIES.items():
        value = getattr(cls, name, None)
        ok = isinstance(value, kind) and (kind is not bool or type(value) is bool)
        c.check(ok, f"capability {name} is {value!r}, must be declared as {getattr(kind, '__name__', kind)}")
    unknown = set(cls.side_stream_settings) - set(SIDE_STREAM_SETTINGS)
    c.check(not unknown, f"side_stream_settings names unknown settings {sorted(unknown)}; "
                         f"known: {SIDE_STREAM_SETTINGS}")
    for name in ("default_kernel", "cpu_kernel"):
        if name == "cpu_kernel" and not cls.cpu_kernel:
            continue
        try:
            get_kernel(getattr(cls, name))
        except ValueError as exc:
            raise ContractError(f"{c.label}: {name}: {exc}") from exc
    c.done("capabilities")


def _check_instance(c: _Checker, cls: type, dtype: str, vocab: int, dim: int, heads: int, tokens: int,
                    seed: int, kwargs: dict) -> None:
    label = c.label
    c.label = f"{label} [{dtype}]"
    b = cls(vocab, dim, dtype=dtype, num_heads=heads, max_tokens=tokens, device="cpu", **kwargs)
    try:
        _check_reports(c, b)
        quantized = b.format.quantized
        b.fill_synthetic(seed, scale=0.5 if quantized else None)
        b.check_loaded()
        want = synthetic_rows(torch.arange(vocab), dim, seed, b.storage_dtype)
        c.check(bool((want.view(torch.uint8) != 0).any()), "the synthetic table is all zero bytes")
        c.same_bytes(b.weight[:vocab], want, "weight after fill_synthetic")
        c.raises(RuntimeError, lambda: b.finalize(), "finalize() without start_prefetch")
        _check_lookups(c, b, vocab, tokens, seed, "fill_synthetic")
        b.load_full_table(_random_table(vocab, dim, b.storage_dtype, seed + 1))
        _check_lookups(c, b, vocab, tokens, seed + 2, "load_full_table")
        _check_bad_ids(c, b, tokens)
        b.set_max_tokens(2 * tokens)
        _check_one(c, b, _random_ids(2 * tokens, heads, vocab, seed + 3, torch.int64),
                   "after set_max_tokens(2 x tokens)")
        if cls.warms_cache:
            b.warm_cache(_random_ids(16 * tokens, heads, vocab, seed + 4, torch.int64))
            _check_one(c, b, _random_ids(tokens, heads, vocab, seed + 5, torch.int64), "after warm_cache")
        b.reset_stats()
        c.check(isinstance(b.stats(), dict), "stats() after reset_stats() is not a dict")
    finally:
        b.close()
    try:
        b.close()
    except Exception as exc:  # noqa: BLE001
        raise ContractError(f"{c.label}: a second close() raised {type(exc).__name__}: {exc}") from exc
    c.done(f"{dtype}: fill, lookup, local_lookup, prefetch, bad ids, set_max_tokens, close")
    c.label = label


def _check_reports(c: _Checker, b: PLEEmbedding) -> None:
    c.check(isinstance(b.supports_grid_cap, bool), "supports_grid_cap is not a bool")
    c.check(isinstance(b.reads_sorted, bool), "reads_sorted is not a bool")
    c.check(b.grid_cap is None, f"grid_cap is {b.grid_cap!r} before any is set (expected None)")
    c.check(isinstance(b.stats(), dict), "stats() is not a dict")
    c.check(isinstance(b.host_thread_s, float), "host_thread_s is not a float")
    c.check(b.prefetch_buffer is None or isinstance(b.prefetch_buffer, torch.Tensor),
            "prefetch_buffer is neither None nor a tensor")
    c.check(b.prefetch_stream is None, "prefetch_stream exists in functional mode (no streams on a CPU)")
    c.check(b.sm_limit_granted is None or isinstance(b.sm_limit_granted, int), "sm_limit_granted type")
    c.check(b.green_via is None or isinstance(b.green_via, str), "green_via type")
    for name in type(b).side_stream_settings:
        value = getattr(b, name)
        c.check(isinstance(value, int) and not isinstance(value, bool), f"setting {name} is {value!r}, not an int")
    c.check(b.functional, "device='cpu' did not give functional mode")
    b.set_kernel(b.kernel_name)  # the engine swaps kernels on a filled table


def _reference(b: PLEEmbedding, ids: torch.Tensor) -> torch.Tensor:
    """``weight[ids]`` as raw bytes: [tokens, heads * dim] of the storage dtype."""
    flat = ids.reshape(-1).long()
    rows = int_view(b.weight).index_select(0, flat).view(b.storage_dtype)
    return rows.reshape(ids.shape[0], ids.shape[1] * b.embedding_dim)


def _check_lookups(c: _Checker, b: PLEEmbedding, vocab: int, tokens: int, seed: int, how: str) -> None:
    for i, dt in enumerate((torch.int64, torch.int32)):
        ids = _random_ids(tokens, b.num_heads, vocab, seed + 10 * i, dt)
        _check_one(c, b, ids, f"{how}, {dt} ids")
    # finalize with nothing started: after a completed pair, and on its own
    c.raises(RuntimeError, lambda: b.finalize(), "finalize() after a finalize, without start_prefetch")


def _check_one(c: _Checker, b: PLEEmbedding, ids: torch.Tensor, what: str) -> None:
    want = _reference(b, ids)
    n = ids.shape[0]
    c.same_bytes(b.lookup(ids), want, f"lookup ({what})")
    c.check(b.slot_size(n, None) == n, f"slot_size({n}, None) on one rank is not {n} ({what})")
    c.same_bytes(b.gather_ids(ids, n), ids, f"gather_ids on one rank ({what})")
    out = _poisoned((n, b.num_heads, b.embedding_dim), b.storage_dtype)
    got = b.local_lookup(ids, out=out)
    c.check(got is out, f"local_lookup(ids, out=out) did not return out ({what})")
    c.same_bytes(out.reshape(n, -1), want, f"local_lookup into a poisoned out ({what})")
    c.same_bytes(b.reduce_rows(out).reshape(n, -1), want, f"reduce_rows on one rank ({what})")
    # prefetch: the engine calls start_prefetch / finalize on any backend when a case prefetches
    for into in (False, True):
        if b.prefetch_buffer is not None:
            b.prefetch_buffer.view(torch.uint8).fill_(POISON)
        b.start_prefetch(ids)
        if into:
            dest = _poisoned((n, b.num_heads * b.embedding_dim), b.storage_dtype)
            rows = b.finalize(out=dest)
            c.check(rows is dest, f"finalize(out=out) did not return out ({what})")
        else:
            rows = b.finalize()
        c.same_bytes(rows, want, f"start_prefetch + finalize({'out=poisoned' if into else ''}) ({what})")


def _check_bad_ids(c: _Checker, b: PLEEmbedding, tokens: int) -> None:
    heads = b.num_heads
    bad = {
        "1-D ids": torch.zeros(tokens, dtype=torch.int64),
        f"ids with {heads + 1} columns for {heads} heads": torch.zeros(tokens, heads + 1, dtype=torch.int64),
        "float ids": torch.zeros(tokens, heads, dtype=torch.float32),
    }
    for what, ids in bad.items():
        c.raises(ValueError, lambda ids=ids: b.lookup(ids), f"lookup of {what}")
        c.raises(ValueError, lambda ids=ids: b.start_prefetch(ids), f"start_prefetch of {what}")
    c.raises(RuntimeError, lambda: b.finalize(), "finalize() after a refused start_prefetch")
