"""The served decode step (``kind = "serve"``, ple_bench/run/serve.py) on a CPU: the serve axes in
cases and suites (ids of other kinds unchanged), the whole model's step (every layer, the rows
consumed at the use layer, the LM head) against an independent eager model, the byte check catching
a wrong row, the weights allocated as the capacity rule counts them, and the functional serving
suite end to end through ``python -m ple_bench run``."""

from __future__ import annotations

import dataclasses
import textwrap

import pytest
import torch
import torch.nn.functional as F

from ple_bench.record import BY_NAME, derive
from ple_bench.run.serve import FUNCTIONAL_HBM_BYTES, ServeStep, check_serve, serve_batch, serve_capacity
from ple_bench.run.step import StepMismatch
from ple_bench.serving.models import get_model
from ple_bench.spec.case import Case
from tests.test_step import HEADS, SEED, make_backend, make_ids

TINY = get_model("tiny")


def serve_step(impl: str = "device", batch: int = 4, context_len: int = 6) -> ServeStep:
    placement = "hbm" if impl == "device" else "host"
    return ServeStep(make_backend(impl), model=TINY, batch=batch, context_len=context_len, placement=placement,
                     graph="eager", device=torch.device("cpu"), seed=3)


def id_sets(batch: int = 4, n: int = 2) -> list[torch.Tensor]:
    return [s[:batch] for s in make_ids(n, seed=7)]


# ---------------------------------------------------------------- axes and ids
def test_serve_case_ids_name_the_model_context_and_fraction_and_leave_other_ids_alone():
    base = Case(kind="serve", impl="device", model="tiny", context_len=64, batch_fraction=0.5)
    assert ".tiny-ctx64-kvbf16-b0.5-" in base.case_id and ".t256." not in base.case_id
    assert dataclasses.replace(base, batch_fraction=0.25).case_id != base.case_id
    assert dataclasses.replace(base, gpu_memory_utilization=0.8).case_id != base.case_id
    # other kinds' ids do not move (the ids before the serve axes existed): the serve axes sit at their defaults
    assert Case().case_id == "lookup.device.v1048576.d128.bf16.h1.t256-bf21a9e8"
    assert Case(kind="step", compute="decoder", context_len=8).case_id == \
        "step.device.v1048576.d128.bf16.h1.t256.dec-qwen3-8b-L2-ctx8-3d282d14"


def test_suite_resets_serve_axes_elsewhere_and_derived_axes_on_serve_cases(tmp_path):
    from ple_bench.spec.suite import load_suite

    path = tmp_path / "s.toml"
    path.write_text(textwrap.dedent("""
        [suite]
        description = "x"
        [defaults]
        vocab_size = 512
        dim = 16
        model = "tiny"
        batch_fraction = [1.0, 0.5]
        num_tokens = 8
        [[group]]
        kind = ["lookup", "serve"]
        impl = "device"
    """))
    cases = load_suite(path).cases
    lookups = [c for c in cases if c.kind == "lookup"]
    serves = [c for c in cases if c.kind == "serve"]
    assert len(lookups) == 1 and lookups[0].model == Case().model and lookups[0].batch_fraction == 1.0
    assert sorted(c.batch_fraction for c in serves) == [0.5, 1.0]
    assert all(c.num_tokens == Case().num_tokens for c in serves)  # the batch is the capacity rule's


@pytest.mark.parametrize("body, match", [
    ('model = "llama"', "model.*qwen3-8b, qwen3-32b, tiny"),
    ('kv_dtype = "int4"', "kv_dtype.*bf16, fp8"),
    ("batch_fraction = 1.5", "batch_fraction.*<= 1"),
    ("gpu_memory_utilization = 0", "gpu_memory_utilization.*> 0"),
])
def test_suite_refuses_bad_serve_axes(tmp_path, body, match):
    from ple_bench.spec.suite import SuiteError, load_suite

    path = tmp_path / "bad.toml"
    path.write_text(f'[suite]\ndescription = "x"\n[[group]]\nkind = "serve"\n{body}\n')
    with pytest.raises(SuiteError, match=match):
        load_suite(path)


# ---------------------------------------------------------------- the step
def _eager_model(step: ServeStep, rows: torch.Tensor) -> torch.Tensor:
    """The same model written out independently: embedding, every layer in order (the use layer's
    output plus the PLE projection of the dequantized rows), final norm, LM head."""
    x = step.embed[step.tokens]
    layers = list(step.decoder.layers) + (list(step.tail.layers) if step.tail is not None else [])
    for i, layer in enumerate(layers):
        x = step.decoder._layer(x, layer, None)
        if i == TINY.use_layer - 1:
            x = x + step.backend.dequantize(rows, torch.float32).float() @ step.proj
    return F.rms_norm(x, (TINY.hidden,), step.final_norm, 1e-6) @ step.lm_head


@pytest.mark.parametrize("impl", ["device", "pinned_host_flag"])
def test_whole_model_step_matches_an_independent_eager_model(impl):
    step = serve_step(impl)
    try:
        sets = id_sets()
        check_serve(step, sets, SEED)
        step.set_inputs(sets[1])
        step.run()
        expected = _eager_model(step, step.rows.clone())
        assert torch.allclose(step.logits, expected, rtol=1e-4, atol=1e-4)
        assert step.logits.abs().max() > 0 and not torch.isnan(step.logits).any()
        assert len(step.decoder.layers) == TINY.use_layer
        assert len(step.tail.layers) == TINY.layers - TINY.use_layer
    finally:
        step.close()


def test_the_rows_change_the_logits():
    # the consumer is not dead code: other rows, other logits
    step = serve_step()
    try:
        sets = id_sets()
        step.set_inputs(sets[0])
        step.run()
        a = step.logits.clone()
        step.set_inputs(sets[1])
        step.run()
        assert not torch.equal(a, step.logits)
    finally:
        step.close()


def test_check_catches_a_wrong_row():
    step = serve_step()
    try:
        sets = id_sets()
        with pytest.raises(StepMismatch, match="row bytes differ"):
            check_serve(step, sets, SEED + 1)  # the reference of another table
    finally:
        step.close()


def test_weights_and_kv_are_what_the_capacity_rule_counts():
    step = serve_step(batch=3, context_len=5)
    try:
        case = Case(kind="serve", impl="device", model="tiny", vocab_size=64, dim=step.backend.embedding_dim,
                    dtype="fp8", num_heads=HEADS, context_len=5)
        cap = serve_capacity(case, "hbm", torch.device("cpu"))
        assert step.weight_bytes == cap.weight_bytes  # fp32 on a CPU: 4 bytes a weight
        assert step.kv_bytes == 2 * TINY.layers * 3 * 5 * TINY.kv_heads * TINY.head_dim * 4
        assert cap.hbm_bytes == FUNCTIONAL_HBM_BYTES
    finally:
        step.close()


def test_serve_batch_is_the_fraction_of_the_largest_batch():
    case = Case(kind="serve", impl="device", model="tiny", vocab_size=4096, dim=160, dtype="fp8", num_heads=4,
                context_len=64)
    hbm, host = serve_capacity(case, "hbm", torch.device("cpu")), serve_capacity(case, "host", torch.device("cpu"))
    assert host.max_batch > hbm.max_batch > 0  # the table's bytes became KV
    assert serve_batch(hbm, 1.0) == hbm.max_batch
    assert serve_batch(hbm, 0.5) == round(hbm.max_batch * 0.5)
    assert serve_batch(dataclasses.replace(hbm, max_batch=0), 0.5) == 0


def test_derive_gives_tokens_per_s_and_tpot():
    rec = derive({"kind": "serve", "status": "ok", "step_ms": 25.0, "serve_batch": 50}, None)
    assert rec["tokens_per_s"] == pytest.approx(2000.0) and rec["tpot_ms"] == 25.0
    skipped = derive({"kind": "serve", "status": "skipped", "step_ms": None, "serve_batch": None}, None)
    assert skipped["tokens_per_s"] is None and skipped["tpot_ms"] is None
    assert BY_NAME["tokens_per_s"].derived and BY_NAME["serve_batch"].kinds == "serve"


# ---------------------------------------------------------------- end to end
@pytest.mark.slow  # python -m ple_bench run end to end: a new interpreter and its worker process
def test_functional_serving_run_end_to_end(tmp_path):
    """``python -m ple_bench run`` of served steps on a CPU: both placements at the capacity rule's batch
    and half of it, every row checked (status ok, not invalid), the serve fields in each record; a
    context no sequence fits is skipped with the rule's numbers, fp8 KV skipped with its prediction."""
    from tests.test_cli import run_suite_records

    recs = run_suite_records(tmp_path, textwrap.dedent("""
        [suite]
        description = "served steps"
        [suite.timing]
        warmup_ms = 0
        min_samples = 3
        max_samples = 4
        max_time_s = 0.1
        [defaults]
        kind = "serve"
        model = "tiny"
        dtype = "fp8"
        dim = 160
        num_heads = 4
        table_bytes = "512KiB"
        [[group]]
        impl = ["device", "pinned_host_flag"]
        context_len = 64
        batch_fraction = [1.0, 0.5]
        [[group]]
        impl = "device"
        variants = [{context_len = 100000}, {context_len = 64, kv_dtype = "fp8"}]
    """))
    ok = [r for r in recs if r["status"] == "ok"]
    assert len(ok) == 4, [(r["case_id"], r["status"], r["reason"]) for r in recs]
    for r in ok:
        assert r["placement"] == ("hbm" if r["impl"] == "device" else "host")
        assert r["serve_batch"] == round(r["max_batch"] * r["batch_fraction"]) == r["num_tokens"]
        assert r["tokens_per_s"] == pytest.approx(r["serve_batch"] / (r["step_ms"] / 1e3))
        assert r["tpot_ms"] == r["step_ms"] and r["kv_source"] == "measured"
        assert r["kv_bytes"] > 0 and r["weight_bytes"] > 0 and r["capacity_rule"].endswith(f"= {r['max_batch']}")
        assert r["rows"] == r["serve_batch"] * 4 and r["mode"] == "functional"
    by = {(r["placement"], r["batch_fraction"]): r for r in ok}
    assert by["host", 1.0]["max_batch"] > by["hbm", 1.0]["max_batch"]
    assert by["host", 1.0]["ids_on"] == "host" and by["hbm", 1.0]["ids_on"] == "device"
    skipped = {r["context_len"]: r for r in recs if r["status"] == "skipped"}
    assert "no sequence of 100000 tokens fits" in skipped[100000]["reason"]
    assert "kv_dtype=fp8" in skipped[64]["reason"]
    # the skipped cases carry the capacity rule's figures; fp8 KV is labelled a prediction
    fp8, long = skipped[64], skipped[100000]
    assert fp8["kv_source"] == "predicted" and fp8["placement"] == "hbm" and fp8["tokens_per_s"] is None
    assert fp8["max_batch"] > by["hbm", 1.0]["max_batch"]  # half the KV bytes per sequence
    assert fp8["serve_batch"] == fp8["max_batch"] and fp8["capacity_rule"] in fp8["reason"]
    assert long["max_batch"] == 0 and long["kv_source"] is None


def test_serving_suites_are_the_issue_s_cases_and_their_cpu_fallback():
    from ple_bench.spec.suite import load_suite

    gpu = load_suite("serving")
    assert gpu.gpu_only and gpu.functional_fallback == "serving_functional"
    assert len(gpu.cases) == 24 and {c.kind for c in gpu.cases} == {"serve"}
    assert {(c.impl, c.context_len, c.batch_fraction) for c in gpu.cases} == {
        (impl, ctx, f) for impl in ("device", "pinned_host_flag") for ctx in (2048, 8192, 32768)
        for f in (1.0, 0.75, 0.5, 0.25)}
    assert {(c.model, c.kv_dtype, c.table_bytes, c.dim, c.num_heads, c.dtype) for c in gpu.cases} == \
        {("qwen3-8b", "bf16", 320001536 * 160, 160, 16, "fp8")}
    cpu = load_suite("serving_functional")
    assert not cpu.gpu_only and {c.model for c in cpu.cases} == {"tiny"}
    assert {c.impl for c in cpu.cases} == {"device", "pinned_host_flag"}
