"""Id workloads: the global row ids a benchmark case looks up.

``make_ids(spec, num_tokens, num_heads, vocab_size, seed)`` returns a
``[num_tokens, num_heads]`` int64 tensor of *global* row ids.  The vocabulary is
split into ``num_heads`` contiguous head ranges of ``vocab_size // num_heads``
rows (the last head also takes the remainder); head ``h``'s ids always lie in
its own range, as the model's concatenated per-head sub-tables do.

Specs (see :func:`parse_ids_spec`):

* ``"uniform"`` -- every row of the head's range equally likely.
* ``"zipf:<a>"`` (``a > 0``) -- Zipf-distributed popularity ranks over the
  head's range (P(rank k) ~ k^-a), mapped to rows through an affine
  permutation of the range seeded by ``layout_seed`` (not by ``seed``: every id
  set of a workload has the same hot rows), so the hot rows are scattered across
  the table instead of sitting at its start.  Ranges of billions of rows are fine: nothing
  of the size of the range is ever materialised (the first ranks are sampled
  exactly, the tail by the inverse CDF of the continuous density).
* ``"ngram"`` / ``"ngram:<n1>,<n2>,..."`` -- Engram-style hashed n-grams of a
  seeded synthetic token stream (Zipf-like over a 128k-token vocabulary).  The
  heads are assigned round-robin to the orders (default ``2,3``); head ``h``
  hashes the n-gram ending at each position with its own multiplicative-XOR
  hash (seeded by ``layout_seed``: fixed across id sets), modulo its range.  Repeated token patterns give repeated ids, as in a
  real model.
* ``"text:<corpus>"`` / ``"text:<corpus>+lower"`` -- real traffic: Engram's hashed 2- and 3-grams
  of real text (corpus ``code``, ``docs`` or ``prose``) through DeepSeek's tokenizer, ``+lower``
  with Engram's tokenizer compression; decode steps of ``num_tokens`` streams, prefill chunks
  above 512 tokens (:mod:`ple_bench.traces`).  Without the tokenizer or the text:
  ``traces.TraceUnavailable``.

:func:`make_id_sets` gives a case's id sets (for text: successive steps of the same streams),
:func:`warmup_ids` the past traffic a hot-row cache learns on (never the measured ids).

Ids are generated on the CPU with numpy's PCG64 (same arguments -> same ids on
every machine), then moved to ``device``.  :func:`id_stats` summarises an id
tensor (unique fraction, share of the hottest 1% of rows) for reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .traces import CORPORA, ENGRAM_ORDERS, head_ranges, text_id_sets, text_warmup_ids

NGRAM_TOKEN_VOCAB = 128 * 1024  # synthetic tokenizer vocabulary of the n-gram stream
NGRAM_TOKEN_ZIPF_A = 1.0  # token frequencies of natural text are roughly Zipf(1)
DEFAULT_NGRAM_ORDERS = (2, 3)  # Engram uses 2-grams and 3-grams
MAX_NGRAM_ORDER = 8
_EXACT_ZIPF_RANKS = 4096  # ranks sampled from their exact probabilities; tail is continuous
_MAX_RANGE = 1 << 40  # row ranges above this would overflow the int64 mulmod below

# Stream tags keep the random streams of different purposes independent.
_TAG_UNIFORM, _TAG_ZIPF, _TAG_PERM, _TAG_STREAM, _TAG_HASH = range(1, 6)


@dataclass(frozen=True)
class IdsSpec:
    kind: str  # "uniform" | "zipf" | "ngram" | "text"
    zipf_a: float = 0.0
    orders: tuple[int, ...] = ()
    corpus: str = ""  # text: the corpus (traces.CORPORA)
    lower: bool = False  # text: Engram's tokenizer compression (normalised, lowercased vocabulary)

    @property
    def canonical(self) -> str:
        """One spelling per meaning (so equal workloads get equal case ids)."""
        if self.kind == "zipf":
            return f"zipf:{self.zipf_a:g}"
        if self.kind == "ngram":
            if self.orders == DEFAULT_NGRAM_ORDERS:
                return "ngram"
            return "ngram:" + ",".join(str(n) for n in self.orders)
        if self.kind == "text":
            return f"text:{self.corpus}" + ("+lower" if self.lower else "")
        return self.kind


IDS_HELP = ("'uniform', 'zipf:<a>' with a > 0 (e.g. zipf:1.1), 'ngram' or 'ngram:<orders>' (e.g. ngram:2,3), "
            "'text:<corpus>' or 'text:<corpus>+lower' (corpus code, docs or prose)")


def parse_ids_spec(spec: str) -> IdsSpec:
    """Parse and validate an ids spec; ``ValueError`` says what is allowed."""
    if not isinstance(spec, str):
        raise ValueError(f"ids spec must be a string, got {spec!r}; allowed: {IDS_HELP}")
    name, sep, arg = spec.strip().partition(":")
    name = name.strip().lower()
    if name == "uniform" and not sep:
        return IdsSpec("uniform")
    if name == "zipf":
        try:
            a = float(arg)
        except ValueError:
            a = float("nan")
        if not sep or not math.isfinite(a) or a <= 0:
            raise ValueError(f"bad ids spec {spec!r}: zipf needs an exponent a > 0, e.g. zipf:1.1")
        return IdsSpec("zipf", zipf_a=a)
    if name == "ngram":
        if not sep:
            return IdsSpec("ngram", orders=DEFAULT_NGRAM_ORDERS)
        try:
            orders = tuple(int(x) for x in arg.split(","))
        except ValueError:
            orders = ()
        if (
            not orders
            or any(not 1 <= n <= MAX_NGRAM_ORDER for n in orders)
            or len(set(orders)) != len(orders)
        ):
            raise ValueError(
                f"bad ids spec {spec!r}: ngram orders must be distinct integers in "
                f"1..{MAX_NGRAM_ORDER}, e.g. ngram:2,3"
            )
        return IdsSpec("ngram", orders=orders)
    if name == "text":
        corpus, plus, option = arg.strip().lower().partition("+")
        if not sep or corpus not in CORPORA or (plus and option != "lower"):
            raise ValueError(f"bad ids spec {spec!r}: text needs a corpus ({', '.join(CORPORA)}) and "
                             "optionally '+lower', e.g. text:code or text:prose+lower")
        return IdsSpec("text", corpus=corpus, lower=bool(plus))
    raise ValueError(f"unknown ids spec {spec!r}; allowed: {IDS_HELP}")


def check_ngram_heads(spec: IdsSpec | str, num_heads: int) -> None:
    """n-gram heads are assigned round-robin to the orders: they must divide evenly."""
    if isinstance(spec, str):
        spec = parse_ids_spec(spec)
    if spec.kind == "text":
        spec = IdsSpec("ngram", orders=ENGRAM_ORDERS)
    if spec.kind == "ngram" and num_heads % len(spec.orders):
        raise ValueError(
            f"ids {spec.canonical!r} has {len(spec.orders)} n-gram orders {list(spec.orders)}, "
            f"so num_heads must be a multiple of {len(spec.orders)}; got num_heads={num_heads}"
        )


def make_ids(
    spec: str,
    num_tokens: int,
    num_heads: int,
    vocab_size: int,
    seed: int = 0,
    device: torch.device | str = "cpu",
    layout_seed: int = 0,
) -> torch.Tensor:
    """Global row ids ``[num_tokens, num_heads]`` (int64) of workload ``spec``.

    ``seed`` draws the traffic (which ranks, which token stream); ``layout_seed``
    fixes what belongs to the table and the model rather than to one step: which
    rows are hot (the Zipf rank -> row permutation) and the n-gram hash functions.
    Id sets of different ``seed`` therefore share their hot rows and n-gram
    hashing, as consecutive decode steps of one model do."""
    parsed = parse_ids_spec(spec)
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    if parsed.kind == "text":
        return make_id_sets(spec, num_tokens, num_heads, vocab_size, 1, seed, device, layout_seed)[0]
    ranges = head_ranges(vocab_size, num_heads)
    if max(end - start for start, end in ranges) > _MAX_RANGE:
        raise ValueError(f"head ranges above {_MAX_RANGE} rows are not supported")
    out = np.empty((num_tokens, num_heads), dtype=np.int64)
    if parsed.kind == "uniform":
        for h, (start, end) in enumerate(ranges):
            rng = np.random.default_rng([seed, _TAG_UNIFORM, h])
            out[:, h] = rng.integers(start, end, size=num_tokens, dtype=np.int64)
    elif parsed.kind == "zipf":
        for h, (start, end) in enumerate(ranges):
            n = end - start
            rng = np.random.default_rng([seed, _TAG_ZIPF, h])
            ranks = zipf_ranks(rng, parsed.zipf_a, n, num_tokens)
            out[:, h] = start + _scatter(ranks, n, np.random.default_rng([layout_seed, _TAG_PERM, h]))
    else:
        check_ngram_heads(parsed, num_heads)
        max_order = max(parsed.orders)
        stream_rng = np.random.default_rng([seed, _TAG_STREAM])
        # max_order - 1 tokens of context before the first position: every
        # position has a full n-gram of every order.
        tokens = zipf_ranks(stream_rng, NGRAM_TOKEN_ZIPF_A, NGRAM_TOKEN_VOCAB, num_tokens + max_order - 1)
        out[:] = ngram_ids_from_tokens(tokens, num_heads, vocab_size, parsed.orders, layout_seed)[max_order - 1 :]
    return torch.from_numpy(out).to(device)


ID_SET_SEED_STRIDE = 7919  # id set k of a synthetic law: seed + k * stride
WARMUP_SEED_OFFSET = 104_729  # a synthetic warm-up sample: its own seed
WARMUP_MIN_TOKENS = 4096  # the warm-up sample: at least this many tokens,
WARMUP_BATCHES = 16  # and at least this many of the case's batches


def make_id_sets(
    spec: str,
    num_tokens: int,
    num_heads: int,
    vocab_size: int,
    n_sets: int,
    seed: int = 0,
    device: torch.device | str = "cpu",
    layout_seed: int = 0,
) -> list[torch.Tensor]:
    """A case's ``n_sets`` id sets: for a synthetic law independent draws (seed + k x
    ID_SET_SEED_STRIDE); for text successive decode steps / prefill chunks of the same
    streams (``seed`` places the streams)."""
    parsed = parse_ids_spec(spec)
    n_sets = max(1, n_sets)
    if parsed.kind != "text":
        return [make_ids(spec, num_tokens, num_heads, vocab_size, seed + ID_SET_SEED_STRIDE * k, device,
                         layout_seed) for k in range(n_sets)]
    check_ngram_heads(parsed, num_heads)
    sets = text_id_sets(parsed.corpus, parsed.lower, num_tokens, num_heads, vocab_size, n_sets, seed, layout_seed)
    return [torch.from_numpy(np.ascontiguousarray(s)).to(device) for s in sets]


def warmup_ids(
    spec: str,
    num_tokens: int,
    num_heads: int,
    vocab_size: int,
    seed: int = 0,
    device: torch.device | str = "cpu",
    layout_seed: int = 0,
) -> torch.Tensor:
    """Past traffic a hot-row cache learns on, ``[T, num_heads]`` with T = max(WARMUP_MIN_TOKENS,
    WARMUP_BATCHES x num_tokens): for a synthetic law an independent draw of it; for text the same
    batch shape over the trace's warm-up documents, disjoint from every measured position."""
    parsed = parse_ids_spec(spec)
    total = max(WARMUP_MIN_TOKENS, WARMUP_BATCHES * num_tokens)
    if parsed.kind != "text":
        return make_ids(spec, total, num_heads, vocab_size, seed + WARMUP_SEED_OFFSET, device, layout_seed)
    check_ngram_heads(parsed, num_heads)
    ids = text_warmup_ids(parsed.corpus, parsed.lower, num_tokens, num_heads, vocab_size, total, seed, layout_seed)
    return torch.from_numpy(np.ascontiguousarray(ids)).to(device)


def zipf_ranks(rng: np.random.Generator, a: float, n: int, size: int) -> np.ndarray:
    """``size`` 0-based ranks in ``[0, n)`` with P(rank k) ~ (k + 1)^-a.

    The first ``_EXACT_ZIPF_RANKS`` ranks are drawn from their exact
    probabilities; the tail from the continuous density x^-a on
    ``[K + 0.5, n + 0.5)`` (the midpoint rule), by its inverse CDF."""
    k = min(n, _EXACT_ZIPF_RANKS)
    head_p = np.arange(1, k + 1, dtype=np.float64) ** -a
    head_mass = head_p.sum()
    lo, hi = k + 0.5, n + 0.5
    tail_mass = _power_integral(a, lo, hi) if n > k else 0.0
    u = rng.random(size) * (head_mass + tail_mass)
    ranks = np.empty(size, dtype=np.int64)
    in_head = u < head_mass
    cdf = np.cumsum(head_p)
    ranks[in_head] = np.minimum(np.searchsorted(cdf, u[in_head], side="right"), k - 1)
    if n > k:
        v = u[~in_head] - head_mass  # in [0, tail_mass)
        if a == 1.0:
            x = lo * np.exp(v)
        else:
            x = (lo ** (1.0 - a) + (1.0 - a) * v) ** (1.0 / (1.0 - a))
        # x in [K + 0.5, n + 0.5): round to the 1-based rank, clip against rounding error.
        ranks[~in_head] = np.clip(np.floor(x + 0.5).astype(np.int64), k + 1, n) - 1
    return ranks


def _power_integral(a: float, lo: float, hi: float) -> float:
    if a == 1.0:
        return math.log(hi / lo)
    return (hi ** (1.0 - a) - lo ** (1.0 - a)) / (1.0 - a)


def _scatter(ranks: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """A seeded permutation of ``[0, n)`` applied to ``ranks``: r -> (m*r + b) mod n
    with gcd(m, n) = 1 and m near a random fraction of n, so consecutive
    (equally hot) ranks land far apart."""
    if n == 1:
        return np.zeros_like(ranks)
    m = int(rng.integers(n // 4, 3 * n // 4 + 1)) | 1 if n > 4 else 1
    while math.gcd(m, n) != 1:
        m += 1
    b = int(rng.integers(0, n))
    return (_mulmod(ranks, m % n, n) + b) % n


def _mulmod(x: np.ndarray, m: int, n: int) -> np.ndarray:
    """(x * m) % n for x, m in [0, n), n <= 2^40, without int64 overflow."""
    if n <= (1 << 31):
        return (x * m) % n
    bits = 20
    x_hi, x_lo = x >> bits, x & ((1 << bits) - 1)
    return (((x_hi * m) % n) * (1 << bits) + x_lo * m) % n


# ------------------------------------------------------------- n-gram hashing
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix64(h: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: spreads every input bit over the whole word."""
    h = h ^ (h >> np.uint64(30))
    h = h * np.uint64(0xBF58476D1CE4E5B9)
    h = h ^ (h >> np.uint64(27))
    h = h * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def ngram_ids_from_tokens(
    tokens: np.ndarray | torch.Tensor,
    num_heads: int,
    vocab_size: int,
    orders: tuple[int, ...] = DEFAULT_NGRAM_ORDERS,
    seed: int = 0,
) -> np.ndarray:
    """Hashed n-gram row ids ``[len(tokens), num_heads]`` of a token stream.

    Head ``h`` takes order ``n = orders[h % len(orders)]`` and, at position
    ``t``, hashes tokens ``t-n+1..t`` (positions before the stream start count
    as token -1) with its own seeded odd multipliers: XOR of
    ``token_i * m_{h,i}``, finalised by splitmix64, modulo its head range."""
    tokens = np.asarray(tokens.cpu() if isinstance(tokens, torch.Tensor) else tokens, dtype=np.int64)
    if tokens.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {tokens.shape}")
    check_ngram_heads(IdsSpec("ngram", orders=tuple(orders)), num_heads)
    ranges = head_ranges(vocab_size, num_heads)
    max_order = max(orders)
    # Row j of `padded` shifted by i gives the token i positions back.
    padded = np.concatenate([np.full(max_order - 1, -1, dtype=np.int64), tokens]).view(np.uint64)
    length = len(tokens)
    out = np.empty((length, num_heads), dtype=np.int64)
    with np.errstate(over="ignore"):
        for h, (start, end) in enumerate(ranges):
            order = orders[h % len(orders)]
            rng = np.random.default_rng([seed, _TAG_HASH, h])
            mults = rng.integers(0, 1 << 63, size=order, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
            acc = np.full(length, np.uint64(order), dtype=np.uint64)
            for i in range(order):  # token i positions back from t
                back = padded[max_order - 1 - i : max_order - 1 - i + length]
                acc ^= (back + np.uint64(1)) * mults[i]
            acc = _mix64(acc) & _MASK64
            out[:, h] = start + (acc % np.uint64(end - start)).astype(np.int64)
    return out


# ----------------------------------------------------------------- statistics
def id_stats(ids: torch.Tensor) -> dict[str, float]:
    """How skewed a batch of ids is.

    ``unique_fraction``: distinct rows / ids; ``top1pct_share``: the share of
    all lookups that go to the hottest 1% of the distinct rows touched (at
    least one row) -- about 0.01 for uniform ids over a large table."""
    flat = ids.reshape(-1)
    total = flat.numel()
    if total == 0:
        return {"num_ids": 0, "num_unique": 0, "unique_fraction": 0.0, "top1pct_share": 0.0,
                "max_count": 0}
    _, counts = torch.unique(flat, return_counts=True)
    num_unique = counts.numel()
    top = max(1, math.ceil(0.01 * num_unique))
    top_counts = torch.topk(counts, top).values
    return {
        "num_ids": total,
        "num_unique": num_unique,
        "unique_fraction": num_unique / total,
        "top1pct_share": float(top_counts.sum().item()) / total,
        "max_count": int(top_counts[0].item()),
    }
