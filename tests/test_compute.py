"""The decoder compute (ple_bench/compute.py) on a CPU: the named shapes against the published
model, one layer against an independent float64 reference (RMSNorm, QK-norm, rotary, GQA attention
over the KV cache, SwiGLU), weights never zero and distinct per layer, the byte counts against the
tensors allocated; the decode step around it (its output checked as the matmul step's is, the
consumer using the rows, graph breaks only at the backend calls); the record's derived figures; the
axes in case ids and suites (default ids unchanged, compute_us refused for the decoder)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import textwrap
from pathlib import Path

import pytest
import torch

from ple_bench import record
from ple_bench.spec.case import Case
from ple_bench.compute import DECODER_SHAPES, DecoderCompute
from ple_bench.run.step import DecodeStep, StepMismatch, check_step, run_step_case
from tests.test_step import DIM, HEADS, SEED, TOKENS, VOCAB, _tiny_policy, make_backend, make_ids
from tests._fixtures import fixture_run

REPO = Path(__file__).resolve().parents[1]
TINY = DECODER_SHAPES["tiny"]


def tiny_decoder(layers: int = 2, context_len: int = 7, batch: int = 3, seed: int = 0) -> DecoderCompute:
    return DecoderCompute("tiny", layers=layers, context_len=context_len, batch=batch, device="cpu",
                          dtype=torch.float32, seed=seed)


def decoder_step(impl: str = "pinned_uva", prefetch: bool = True, **kw) -> DecodeStep:
    return DecodeStep(make_backend(impl), hidden=TINY.hidden, num_tokens=TOKENS, prefetch=prefetch,
                      compute="decoder", decoder_shape="tiny", decoder_layers=2, context_len=9, **kw)


# ---------------------------------------------------------------- shapes and bytes
def test_qwen3_8b_layers_have_the_published_non_embedding_parameters():
    # Qwen3-8B (its model card): 36 layers, 6.95 B non-embedding parameters
    shape = DECODER_SHAPES["qwen3-8b"]
    assert 36 * shape.layer_params == pytest.approx(6.95e9, rel=0.005)
    assert (shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.intermediate) == \
        (4096, 32, 8, 128, 12288)


def test_byte_counts_are_the_tensors_allocated():
    dec = tiny_decoder(layers=3, context_len=5, batch=4)
    weights = sum(w.numel() * w.element_size() for layer in dec.layers for w in layer.weights())
    kv = sum(t.numel() * t.element_size() for layer in dec.layers for t in (layer.k_cache, layer.v_cache))
    assert dec.weight_bytes == weights and dec.kv_bytes == kv
    assert dec.bytes_read == weights + kv


def test_weights_never_zero_and_distinct_per_layer():
    dec = tiny_decoder(layers=3)
    for layer in dec.layers:
        for w in layer.weights():
            assert bool((w != 0).all())
    a, b = dec.layers[0], dec.layers[1]
    for wa, wb in zip(a.weights(), b.weights()):
        assert not torch.equal(wa, wb)
    assert not torch.equal(a.k_cache, b.k_cache)


def test_bad_decoder_parameters_are_refused():
    with pytest.raises(ValueError, match="decoder_layers"):
        tiny_decoder(layers=0)
    with pytest.raises(ValueError, match="context_len"):
        tiny_decoder(context_len=0)
    with pytest.raises(ValueError, match="unknown decoder_shape 'nope'.*qwen3-8b"):
        DecoderCompute("nope", layers=1, context_len=4, batch=2, device="cpu", dtype=torch.float32)


# ---------------------------------------------------------------- the layer's math
def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def reference_layer(dec: DecoderCompute, layer, x: torch.Tensor) -> torch.Tensor:
    """One layer in float64, written out: Hugging Face's Qwen3 decoder layer for one new token
    per sequence at position context_len - 1 (its K/V written there first)."""
    s = dec.shape
    d = lambda t: t.double()  # noqa: E731
    b, hd, pos = x.shape[0], s.head_dim, dec.context_len - 1
    h = _rms(d(x), d(layer.norm_in), s.eps)
    qkv = h @ d(layer.w_qkv)
    q = qkv[:, : s.heads * hd].reshape(b, s.heads, hd)
    k = qkv[:, s.heads * hd: (s.heads + s.kv_heads) * hd].reshape(b, s.kv_heads, hd)
    v = qkv[:, (s.heads + s.kv_heads) * hd:].reshape(b, s.kv_heads, hd)
    q, k = _rms(q, d(layer.q_norm), s.eps), _rms(k, d(layer.k_norm), s.eps)
    freq = s.rope_theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    cos, sin = torch.cos(pos * freq).repeat(2), torch.sin(pos * freq).repeat(2)

    def rope(t):
        return t * cos + torch.cat([-t[..., hd // 2:], t[..., : hd // 2]], -1) * sin

    q, k = rope(q), rope(k)
    keys, values = d(layer.k_cache).clone(), d(layer.v_cache).clone()
    keys[:, :, pos], values[:, :, pos] = k, v
    group = s.heads // s.kv_heads
    out = torch.empty(b, s.heads, hd, dtype=torch.float64)
    for head in range(s.heads):  # query head h reads KV head h // group (HF's repeat_kv)
        kv = head // group
        scores = torch.einsum("bd,bcd->bc", q[:, head], keys[:, kv]) / math.sqrt(hd)
        out[:, head] = torch.einsum("bc,bcd->bd", scores.softmax(-1), values[:, kv])
    x = d(x) + out.reshape(b, -1) @ d(layer.w_o)
    h = _rms(x, d(layer.norm_post), s.eps)
    gate, up = (h @ d(layer.w_gate_up)).chunk(2, dim=1)
    return x + (torch.nn.functional.silu(gate) * up) @ d(layer.w_down)


def test_layers_match_an_independent_reference():
    dec = tiny_decoder(layers=2, context_len=6, batch=3)
    x = torch.randn(3, TINY.hidden)
    want = x.double()
    for layer in dec.layers:
        want = reference_layer(dec, layer, want.float())
    got = dec(x)
    assert got is dec.out and got.shape == (3, TINY.hidden) and bool(torch.isfinite(got).all())
    assert torch.allclose(got.double(), want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_compute_is_a_pure_function_of_its_input_and_reads_the_cache():
    dec = tiny_decoder(context_len=8)
    x = torch.randn(3, TINY.hidden)
    first = dec(x).clone()
    assert torch.equal(dec(x), first)  # the new token's K/V slot is rewritten, not appended
    dec.layers[0].v_cache[:, :, 0].add_(3.0)  # an old position of the context
    assert not torch.allclose(dec(x), first)


# ---------------------------------------------------------------- the step around it
@pytest.mark.parametrize("impl,prefetch", [("device", False), ("pinned_uva", True), ("pinned_uva", False)])
def test_decoder_step_passes_the_step_check_and_the_consumer_uses_the_rows(impl, prefetch):
    step = decoder_step(impl, prefetch)
    assert step.weights == [] and step.compute_matmuls == 0
    sets = make_ids(3, seed=31)
    check_step(step, sets, SEED)  # embeddings bit-exact, output = compute + dequant(rows) @ proj
    step.set_inputs(sets[0])
    a = step.run().clone()
    step.set_inputs(sets[1])
    b = step.run().clone()
    x = step.compute()
    for out, ids in ((a, sets[0]), (b, sets[1])):
        from ple_bench.backends import synthetic_rows

        rows = synthetic_rows(ids.reshape(-1), DIM, SEED, step.backend.storage_dtype).reshape(TOKENS, -1)
        emb = step.backend.dequantize(rows, torch.float32)
        assert torch.allclose(out, x + emb @ step.proj, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(a, b)  # other ids, other output: the layers' output alone is not it


def test_decoder_step_check_catches_a_wrong_table():
    step = decoder_step("device", prefetch=False)
    ids = make_ids(1, seed=8)[0]
    step.backend.weight[int(ids[0, 0])].fill_(0.0)
    with pytest.raises(StepMismatch):
        check_step(step, [ids], SEED)


def test_decoder_step_refuses_a_target_and_another_hidden():
    backend = make_backend("device")
    with pytest.raises(ValueError, match="measured, not targeted"):
        DecodeStep(backend, hidden=TINY.hidden, num_tokens=TOKENS, compute_us=50.0, compute="decoder",
                   decoder_shape="tiny")
    with pytest.raises(ValueError, match="hidden 64"):
        DecodeStep(backend, hidden=128, num_tokens=TOKENS, compute="decoder", decoder_shape="tiny")


def test_breakable_decoder_step_breaks_only_at_the_backend_calls():
    """Captured with fake segments on a CPU: the decoder layers add no eager break (they are
    captured whole), the backend calls are the breaks, as for the matmul chain."""
    from ple_bench.run.graphs import BreakableGraph
    from tests.test_graphs import FakeDevice

    dev = FakeDevice()
    step = decoder_step("pinned_uva", True, graph="breakable",
                        graph_factory=lambda mode: BreakableGraph(mode, segment_factory=dev.factory,
                                                                  pool_factory=object))
    step.set_inputs(make_ids(1, seed=3)[0])
    step.run()
    calls = step.graphs[("step", "breakable")].eager_calls
    assert [c.fn.__func__.__name__ for c in calls] == ["start_prefetch", "finalize"]


def _decoder_case(**kw) -> Case:
    base = dict(kind="step", impl="pinned_uva", vocab_size=VOCAB, dim=DIM, dtype="fp8", num_heads=HEADS,
                num_tokens=TOKENS, hidden=TINY.hidden, prefetch=True, compute="decoder", decoder_shape="tiny",
                decoder_layers=3, context_len=11)
    base.update(kw)
    return Case(**base)


def test_run_step_case_records_the_decoder_compute():
    case = _decoder_case()
    rec = run_step_case(case, make_backend("pinned_uva"), torch.stack(make_ids(3, seed=2)), None,
                        _tiny_policy(), "cpu", table_seed=SEED)
    kv = 3 * 2 * 11 * TOKENS * TINY.kv_heads * TINY.head_dim * 4  # float32 caches in functional mode
    assert rec["compute_kv_bytes"] == kv
    assert rec["compute_bytes"] == 3 * TINY.layer_params * 4 + kv + HEADS * DIM * TINY.hidden * 4
    assert rec["compute_matmuls"] is None and rec["compute_target_us"] is None and rec["matmul_us"] is None
    assert rec["compute_ms"] > 0 and rec["compute_region_alone_ms"] > 0 and rec["compute_in_step_ms"] > 0
    rec.update(case.axes(), status="ok", mode="functional")
    record.derive(rec, {"host_memcpy_gbps": 10.0})
    assert rec["compute_slowdown"] is not None  # compute_us is 0, but the decoder is compute
    assert rec["compute_hbm_gbps"] > 0
    assert rec["compute_pct_of_d2d"] is None  # functional mode: no device copy to be held against


def test_matmul_step_records_its_weight_bytes():
    from tests.test_step import HIDDEN, _case

    rec = run_step_case(_case("device", compute_us=0.0), make_backend("device"), make_ids(1, seed=4)[0], None,
                        _tiny_policy(), "cpu", table_seed=SEED)
    assert rec["compute_matmuls"] == 0 and rec["compute_kv_bytes"] == 0
    assert rec["compute_bytes"] == HEADS * DIM * HIDDEN * 4  # the consumer's projection only


def test_derive_holds_the_compute_against_the_d2d_ceiling():
    rec = {"kind": "step", "status": "ok", "mode": "gpu", "compute": "decoder", "compute_us": 0.0,
           "compute_bytes": 6e9, "compute_ms": 2.0, "compute_in_step_ms": 2.2, "compute_region_alone_ms": 2.0}
    record.derive(rec, {"d2d_gbps": 4000.0})
    assert rec["compute_hbm_gbps"] == pytest.approx(3000.0)
    assert rec["compute_pct_of_d2d"] == pytest.approx(75.0)
    assert rec["compute_slowdown"] == pytest.approx(0.1)
    record.derive(rec, {})
    assert rec["compute_hbm_gbps"] == pytest.approx(3000.0) and rec["compute_pct_of_d2d"] is None
    matmul = dict(rec, compute="matmul")
    record.derive(matmul, {"d2d_gbps": 4000.0})
    assert matmul["compute_slowdown"] is None  # a matmul chain of 0 us: no compute


# ---------------------------------------------------------------- axes, ids, suites
def test_stored_case_ids_are_unchanged_by_the_compute_axes():
    """Cases of an archived run, rebuilt from their stored axes (which predate the compute
    axes), keep their stored case_id."""
    path = fixture_run("20261201-093802-paths-ab72") / "records.jsonl.gz"
    fields = set(Case.__dataclass_fields__)
    with gzip.open(path, "rt") as fh:
        recs = [json.loads(line) for line in fh]
    assert recs and not any("compute" in r for r in recs)
    for r in recs:
        axes = {k: r[k] for k in fields if k in r}
        assert Case.from_axes(axes).case_id == r["case_id"]


def test_decoder_case_id_names_the_decoder():
    case = _decoder_case()
    assert ".dec-tiny-L3-ctx11-" in case.case_id and ".c0us" not in case.case_id
    assert _decoder_case(context_len=12).case_id != case.case_id


def _suite(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "s.toml"
    path.write_text('[suite]\ndescription = "t"\n' + textwrap.dedent(body))
    return path


def test_suite_resets_the_decoder_axes_of_matmul_and_lookup_cases(tmp_path):
    from ple_bench.spec.suite import load_suite

    suite = load_suite(_suite(tmp_path, """
        [[group]]
        kind = ["step", "lookup"]
        compute = ["matmul", "decoder"]
        decoder_shape = "tiny"
        context_len = [16, 32]
        num_tokens = 4
    """))
    cases = {(c.kind, c.compute, c.context_len, c.hidden, c.decoder_shape) for c in suite.cases}
    default = Case()
    assert cases == {("step", "decoder", 16, TINY.hidden, "tiny"), ("step", "decoder", 32, TINY.hidden, "tiny"),
                     ("step", "matmul", default.context_len, default.hidden, default.decoder_shape),
                     ("lookup", "matmul", default.context_len, default.hidden, default.decoder_shape)}


@pytest.mark.parametrize("body,match", [
    ('compute = "decoder"\ncompute_us = 50\n', r"key 'compute_us': 50 us asked of compute = 'decoder'"),
    ('compute = "decoder"\nhidden = 1024\n', r"key 'hidden': 1024.*qwen3-8b.*4096"),
    ('compute = "gemm"\n', r"unknown compute 'gemm'; allowed: matmul, decoder"),
    ('compute = "decoder"\ndecoder_layers = 0\n', r"key 'decoder_layers'"),
])
def test_suite_refuses_bad_decoder_axes(tmp_path, body, match):
    from ple_bench.spec.suite import SuiteError, load_suite

    path = _suite(tmp_path, '[[group]]\nkind = "step"\n' + body)
    with pytest.raises(SuiteError, match=match):
        load_suite(path)


def test_cli_exits_2_for_a_decoder_case_with_a_compute_target(tmp_path):
    from tests._cli import run_cli

    path = _suite(tmp_path, '[[group]]\nkind = "step"\ncompute = "decoder"\ncompute_us = [0, 50]\n')
    proc = run_cli("list", "--suite", str(path), cpu=True)
    assert proc.returncode == 2, proc.stderr
    assert "compute_us" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow  # python -m ple_bench run end to end: a new interpreter and its worker process
def test_run_records_decoder_steps_in_functional_mode(tmp_path):
    """``python -m ple_bench run`` of decoder steps on a CPU: each is checked and measured, the pinned
    step held against its resident decoder step, the compute's figures derived."""
    from ple_bench import results
    from tests.test_cli import run_suite_text

    run_dir, meta = run_suite_text(tmp_path, textwrap.dedent("""
        [suite]
        description = "decoder steps"
        [suite.timing]
        warmup_ms = 0
        min_samples = 3
        max_samples = 5
        max_time_s = 0.2
        [defaults]
        kind = "step"
        vocab_size = 512
        dim = 16
        num_heads = 2
        num_tokens = 4
        compute = "decoder"
        decoder_shape = "tiny"
        context_len = [8, 16]
        [[group]]
        variants = [{impl = "device"}, {impl = "pinned_uva", prefetch = true}]
    """))
    # the suite adds each pinned step's resident baselines (prefetch on; the breakable one is skipped here)
    recs = [r for r in results.load_records(run_dir) if r["status"] == "ok"]
    assert sorted((r["impl"], r["prefetch"]) for r in recs) == \
        [("device", False)] * 2 + [("device", True)] * 2 + [("pinned_uva", True)] * 2
    for r in recs:
        assert r["mode"] == "functional" and r["compute_bytes"] > r["compute_kv_bytes"] > 0
        assert r["compute_hbm_gbps"] > 0 and r["compute_slowdown"] is not None
    kv = {r["context_len"]: r["compute_kv_bytes"] for r in recs if r["impl"] == "device"}
    assert kv[16] == 2 * kv[8]
    by_id = {r["case_id"]: r for r in recs}
    for r in (r for r in recs if r["impl"] == "pinned_uva"):  # each against the resident step of its context
        base = by_id[r["offload_baseline"]]
        assert base["impl"] == "device" and base["context_len"] == r["context_len"]
        assert r["offload_overhead"] is not None


def test_decoder_suite_is_the_paths_comparison_on_the_decoder():
    from ple_bench.spec.suite import load_suite

    suite = load_suite("decoder")
    assert suite.gpu_only
    steps = suite.cases
    assert all(c.kind == "step" and c.compute == "decoder" and c.compute_us == 0 for c in steps)
    assert {c.num_tokens for c in steps} == {64, 256, 512}
    assert len({c.context_len for c in steps}) == 2
    assert {c.impl for c in steps} >= {"device", "pinned_uva", "pinned_cpu_gather", "pinned_copy_engine"}
    assert {c.ids_on for c in steps} == {"host", "device"}
    prefetched = [c for c in steps if c.prefetch]
    assert prefetched and all(c.graph == "breakable" for c in prefetched)
    # every pinned case has a resident step of its own workload (decoder axes included) to be held against
    resident = {record.baseline_key(c.axes()) for c in steps if c.impl == "device" and c.ids_on == "device"}
    for c in steps:
        if c.impl != "device":
            assert record.baseline_key(c.axes()) in resident, c.case_id
    assert record.baseline_key(steps[0].axes()) != record.baseline_key(
        dataclasses.replace(steps[0], context_len=steps[0].context_len + 1).axes())
