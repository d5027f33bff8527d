"""The model presets and the capacity rule (ple_bench/serving): the presets against the published
models, the KV bytes per token, the rule at known numbers (the 47.7 GiB table on a 139.8 GiB H200 at
8 K context), the ETP term, the activations term, and the cases that fit nothing (with the numbers)."""

from __future__ import annotations

import pytest

from ple_bench.compute import DECODER_SHAPES
from ple_bench.serving.capacity import capacity
from ple_bench.serving.models import MODELS, get_model

GIB = 1 << 30
H200 = int(139.8 * GIB)
TABLE = int(47.7 * GIB)


def test_presets_have_the_published_parameter_counts():
    # Qwen3-8B: 8.19 B parameters (6.95 B non-embedding); Qwen3-32B: 32.8 B (31.2 B non-embedding)
    assert MODELS["qwen3-8b"].params == pytest.approx(8.19e9, rel=0.002)
    assert MODELS["qwen3-8b"].layers * MODELS["qwen3-8b"].layer_params == pytest.approx(6.95e9, rel=0.005)
    assert MODELS["qwen3-32b"].params == pytest.approx(32.8e9, rel=0.002)
    assert MODELS["qwen3-32b"].layers * MODELS["qwen3-32b"].layer_params == pytest.approx(31.2e9, rel=0.005)
    assert MODELS["qwen3-8b"].weight_bytes() == 2 * MODELS["qwen3-8b"].params
    assert MODELS["qwen3-8b"].weight_bytes(1) == MODELS["qwen3-8b"].params


def test_kv_bytes_per_token_and_sequence():
    m = get_model("qwen3-8b")
    assert m.kv_bytes_per_token("bf16") == 144 * 1024       # 2 x 36 x 8 x 128 x 2
    assert m.kv_bytes_per_token("fp8") == 72 * 1024
    assert m.kv_bytes_per_seq(8192, "bf16") == 8192 * 144 * 1024
    assert get_model("qwen3-32b").kv_bytes_per_token("bf16") == 256 * 1024  # 64 layers
    with pytest.raises(ValueError, match="kv_dtype.*bf16, fp8"):
        m.kv_bytes_per_token("int4")


def test_unknown_model_names_the_allowed_ones():
    with pytest.raises(ValueError, match="qwen3-8b, qwen3-32b, tiny"):
        get_model("llama")


def test_decoder_shapes_are_the_presets():
    for name, m in MODELS.items():
        s = DECODER_SHAPES[name]
        assert (s.hidden, s.heads, s.kv_heads, s.head_dim, s.intermediate) == \
            (m.hidden, m.heads, m.kv_heads, m.head_dim, m.ffn)
        assert s.layer_params == m.layer_params


def test_47_7_gib_table_at_8k_on_an_h200():
    hbm = capacity("qwen3-8b", placement="hbm", context_len=8192, kv_dtype="bf16", hbm_bytes=H200,
                   table_bytes=TABLE)
    host = capacity("qwen3-8b", placement="host", context_len=8192, kv_dtype="bf16", hbm_bytes=H200,
                    table_bytes=TABLE, staging_bytes=64 << 20)
    # (125.8 - 15.3 - 47.7) / 1.125 = 55.8 resident; (125.8 - 15.3 - 0.06) / 1.125 = 98.2 host
    assert hbm.max_batch == 55 and host.max_batch == 98
    assert hbm.reason is None and host.reason is None
    assert hbm.table_term_bytes == TABLE and host.table_term_bytes == 64 << 20
    assert hbm.budget_bytes == int(H200 * 0.9)
    assert hbm.kv_bytes_per_seq == 8192 * 147456
    # the batch's KV fits, one more sequence does not
    for c in (hbm, host):
        left = c.budget_bytes - c.weight_bytes - c.table_term_bytes
        assert left - c.max_batch * (c.kv_bytes_per_seq + c.activation_bytes_per_seq) >= 0
        assert left - (c.max_batch + 1) * (c.kv_bytes_per_seq + c.activation_bytes_per_seq) < 0
    text = hbm.explain()
    assert "139.8 GiB × 0.90" in text and "15.3 weights" in text and "47.7 table" in text and text.endswith("= 55")


def test_etp_divides_the_resident_table_only():
    kw = dict(context_len=8192, kv_dtype="bf16", hbm_bytes=H200, table_bytes=TABLE)
    one = capacity("qwen3-8b", placement="hbm", **kw)
    four = capacity("qwen3-8b", placement="hbm", etp=4, **kw)
    assert four.table_term_bytes == TABLE // 4
    # 3/4 of 47.7 GiB freed = 35.8 GiB = 31 more sequences of 1.125 GiB
    assert four.max_batch == 87 and four.max_batch > one.max_batch
    assert "ETP 4" in four.explain()
    host = capacity("qwen3-8b", placement="host", etp=4, staging_bytes=1 << 20, **kw)
    assert host.table_term_bytes == 1 << 20


def test_activations_take_their_share():
    kw = dict(placement="host", context_len=2048, kv_dtype="bf16", hbm_bytes=H200, table_bytes=TABLE)
    small = capacity("qwen3-8b", activation_bytes_per_seq=0, **kw)
    big = capacity("qwen3-8b", activation_bytes_per_seq=256 << 20, **kw)
    assert big.max_batch < small.max_batch
    assert big.activation_bytes == big.max_batch * (256 << 20)


def test_gpu_memory_utilization_scales_the_budget():
    kw = dict(placement="hbm", context_len=8192, kv_dtype="bf16", hbm_bytes=H200, table_bytes=TABLE)
    assert capacity("qwen3-8b", gpu_memory_utilization=0.8, **kw).max_batch < capacity("qwen3-8b", **kw).max_batch


def test_a_model_that_does_not_fit_at_batch_one():
    c = capacity("qwen3-32b", placement="hbm", context_len=8192, kv_dtype="bf16", hbm_bytes=80 * 10**9,
                 table_bytes=TABLE)
    assert c.max_batch == 0 and c.kv_bytes == 0
    assert "does not fit at batch 1" in c.reason and "108.7 GiB" in c.reason
    assert c.reason in c.explain()


def test_a_context_no_sequence_fits():
    c = capacity("qwen3-8b", placement="hbm", context_len=1 << 20, kv_dtype="bf16", hbm_bytes=80 * 10**9,
                 table_bytes=TABLE)
    assert c.max_batch == 0 and "no sequence of 1048576 tokens fits" in c.reason


def test_a_host_table_larger_than_host_memory():
    c = capacity("qwen3-8b", placement="host", context_len=8192, kv_dtype="bf16", hbm_bytes=H200,
                 table_bytes=TABLE, host_bytes=32 * GIB)
    assert c.max_batch == 0 and "larger than the 32.0 GiB of host memory" in c.reason


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="placement"):
        capacity("tiny", placement="disk", context_len=8, kv_dtype="bf16", hbm_bytes=GIB, table_bytes=1)
    with pytest.raises(ValueError, match="model"):
        capacity("gpt", placement="hbm", context_len=8, kv_dtype="bf16", hbm_bytes=GIB, table_bytes=1)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        capacity("tiny", placement="hbm", context_len=8, kv_dtype="bf16", hbm_bytes=GIB, table_bytes=1,
                 gpu_memory_utilization=1.5)
