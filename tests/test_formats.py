"""Storage formats (dtype names, integer views, FP8 scale and dequantize) and
the synthetic table content that the backends are checked against."""

from __future__ import annotations

import pytest
import torch

from ple_bench.backends import DTYPES, StorageFormat, dtype_from_name, dtype_name, fill_synthetic, synthetic_rows
from ple_bench.backends.formats import MISSING_SCALE, Fp8Format, int_view

from ._reference import assert_bytes_equal, bytes_of, random_table

FP8 = torch.float8_e4m3fn
OUT_DTYPES = [torch.bfloat16, torch.float16, torch.float32]


# ----------------------------------------------------------------- names and views


def test_dtype_names_round_trip():
    assert set(DTYPES) == {"fp32", "fp16", "bf16", "fp8"}
    for name, dtype in DTYPES.items():
        assert dtype_from_name(name) is dtype and dtype_from_name(dtype) is dtype
        assert dtype_name(dtype) == name
        assert StorageFormat.for_dtype(name).name == name


@pytest.mark.parametrize("bad, match", [("fp4", "unknown dtype 'fp4'"), ("float32", "unknown dtype"),
                                        (torch.int8, "unsupported storage dtype"),
                                        (torch.float64, "unsupported storage dtype")])
def test_unknown_dtypes_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        dtype_from_name(bad)
    with pytest.raises(ValueError, match=match):
        StorageFormat.for_dtype(bad)


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_int_view_is_the_same_bytes(name):
    dtype = DTYPES[name]
    t = random_table(7, 9, dtype, seed=1)
    v = int_view(t)
    assert not v.dtype.is_floating_point and v.element_size() == t.element_size()
    assert v.shape == t.shape and v.data_ptr() == t.data_ptr()
    v[3, 4] = 0  # writes through
    assert bytes_of(t[3, 4:5]).eq(0).all()
    ints = torch.arange(5)
    assert int_view(ints) is ints


# ----------------------------------------------------------------- FP8 scale and dequantize


def _fp8_rows(n=64, dim=33, seed=0):
    return random_table(n, dim, FP8, seed=seed)  # random bytes, -0.0 included, no NaN


def test_unquantized_dequantize_is_identity():
    for name in ("fp32", "fp16", "bf16"):
        fmt = StorageFormat.for_dtype(name)
        rows = random_table(4, 5, DTYPES[name], seed=2)
        assert not fmt.quantized and fmt.new_scale("cpu") is None
        fmt.check_loaded(None)
        assert fmt.dequantize(rows, None, DTYPES[name]) is rows


def test_fp8_missing_scale_is_an_error():
    fmt = StorageFormat.for_dtype("fp8")
    assert isinstance(fmt, Fp8Format) and fmt.quantized
    scale = fmt.new_scale("cpu")
    assert scale.dtype == torch.float32 and scale.shape == (1,) and scale.item() == MISSING_SCALE
    with pytest.raises(ValueError, match="missing its global scale"):
        fmt.check_loaded(scale)
    with pytest.raises(ValueError, match="missing its global scale"):
        fmt.check_loaded(None)
    scale.fill_(0.5)
    fmt.check_loaded(scale)
    with pytest.raises(RuntimeError, match="missing its global scale"):
        fmt.dequantize(_fp8_rows(), None, torch.bfloat16)


def test_fp8_scale_on_another_device_is_an_error():
    fmt = Fp8Format()
    scale = torch.full((1,), 0.5, device="meta")
    with pytest.raises(RuntimeError, match=r"scale must be on the output device \(cpu\)"):
        fmt.dequantize(_fp8_rows(), scale, torch.bfloat16)


@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
@pytest.mark.parametrize("scale", [0.375, 2.0, 0.1, 3.7e-3])
def test_fp8_dequantize_is_rows_times_scale_in_the_out_dtype(out_dtype, scale):
    """``rows.to(out) * scale.to(out)``: the scale rounded to the out dtype, one
    rounding of the exact product (an fp8 value times a 24-bit scale is exact in
    float64)."""
    rows = _fp8_rows(seed=int(scale * 1000))
    scale_t = torch.tensor([scale], dtype=torch.float32)
    acts = Fp8Format().dequantize(rows, scale_t, out_dtype)
    assert acts.dtype == out_dtype and acts.shape == rows.shape
    rounded_scale = scale_t.to(out_dtype).double()
    expected = (rows.double() * rounded_scale).to(out_dtype)
    assert_bytes_equal(acts, expected, f"dequantize x{scale} -> {out_dtype}")
    # -0.0 survives dequantize
    neg_zero = bytes_of(rows) == 0x80
    assert neg_zero.any()
    assert torch.signbit(acts.reshape(-1)[neg_zero]).all()


def test_fp8_dequantize_rounds_the_scale_first():
    """Scaling in float32 and then casting gives other bits than the stated
    semantics for a scale that bf16 cannot hold: the test above can tell."""
    rows = _fp8_rows(n=256, seed=3)
    scale = torch.tensor([0.1])
    acts = Fp8Format().dequantize(rows, scale, torch.bfloat16)
    via_fp32 = (rows.float() * scale).to(torch.bfloat16)
    assert not torch.equal(bytes_of(acts), bytes_of(via_fp32))


# ----------------------------------------------------------------- synthetic tables


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_synthetic_rows_are_nonzero_finite_and_exact(name):
    dtype = DTYPES[name]
    ids = torch.cat([torch.arange(0, 3000), torch.tensor([2**31 - 1, 2**31, 320_001_535, 2**40])])
    rows = synthetic_rows(ids, 160, seed=11, dtype=dtype)
    assert rows.shape == (ids.numel(), 160) and rows.dtype == dtype
    as_float = rows.float()
    assert torch.isfinite(as_float).all()
    assert (as_float != 0).all()  # neither +0.0 nor -0.0
    fp8 = synthetic_rows(ids, 160, seed=11, dtype=FP8)
    assert_bytes_equal(rows.to(FP8), fp8, f"{name} values are exact fp8 values")
    assert_bytes_equal(synthetic_rows(ids, 160, 11, dtype), rows, "deterministic")
    assert_bytes_equal(synthetic_rows(ids[5:9].to(torch.int32), 160, 11, dtype), rows[5:9], "int32 ids")


def test_synthetic_rows_depend_on_row_column_and_seed():
    a = synthetic_rows(torch.arange(2000), 64, seed=1, dtype=torch.bfloat16)
    b = synthetic_rows(torch.arange(2000), 64, seed=2, dtype=torch.bfloat16)
    assert (a != b).float().mean() > 0.9
    assert len(set(map(bytes, bytes_of(a).view(2000, -1).numpy()))) == 2000  # distinct rows
    assert (a[:, 0] != a[:, 1]).float().mean() > 0.9
    assert (a < 0).float().mean() > 0.4 and (a > 0).float().mean() > 0.4
    values = set(bytes_of(synthetic_rows(torch.arange(5000), 16, 3, FP8)).tolist())
    assert len(values) == 252  # every finite non-zero e4m3 value occurs


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_fill_synthetic_in_chunks_with_offset_and_padding(name):
    dtype = DTYPES[name]
    table = torch.empty(100, 13, dtype=dtype)
    table.view(torch.uint8).fill_(0x11)
    fill_synthetic(table, first_row=500, seed=4, valid_rows=90, chunk_elems=13 * 7)  # 13 chunks
    expected = synthetic_rows(torch.arange(500, 590), 13, 4, dtype)
    assert_bytes_equal(table[:90], expected, "filled rows")
    pad = table[90:]
    if dtype == FP8:
        assert (bytes_of(pad) == 0x7F).all()
    else:
        assert pad.isnan().all()
