"""Storage formats of the PLE table: unquantized (fp32/fp16/bf16) and FP8 e4m3
with one global float32 scale.  Also the dtype names used everywhere."""

from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp8": torch.float8_e4m3fn,
}
_NAMES = {v: k for k, v in DTYPES.items()}

# Same-width integer dtypes: rows are moved and reduced as raw bits, which is
# byte-exact because every vocabulary row has exactly one owning ETP rank.
_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

# The seed's sentinel for "scale not loaded".
MISSING_SCALE = torch.finfo(torch.float32).min


def dtype_from_name(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        if name not in _NAMES:
            raise ValueError(f"unsupported storage dtype {name}; allowed: {sorted(DTYPES)}")
        return name
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; allowed: {sorted(DTYPES)}") from None


def dtype_name(dtype: torch.dtype) -> str:
    return _NAMES[dtype]


def int_view(t: torch.Tensor) -> torch.Tensor:
    """The same bytes as a same-width integer tensor."""
    if not t.dtype.is_floating_point:
        return t
    return t.view(_INT_VIEW[t.element_size()])


class StorageFormat:
    """How rows are stored and turned into activations."""

    quantized = False

    def __init__(self, storage_dtype: torch.dtype):
        self.storage_dtype = storage_dtype

    @staticmethod
    def for_dtype(dtype: str | torch.dtype) -> "StorageFormat":
        dtype = dtype_from_name(dtype)
        if dtype == torch.float8_e4m3fn:
            return Fp8Format()
        return StorageFormat(dtype)

    @property
    def name(self) -> str:
        return dtype_name(self.storage_dtype)

    def new_scale(self, device: torch.device | str) -> torch.Tensor | None:
        return None

    def check_loaded(self, scale: torch.Tensor | None) -> None:
        return None

    def dequantize(
        self, rows: torch.Tensor, scale: torch.Tensor | None, out_dtype: torch.dtype
    ) -> torch.Tensor:
        return rows  # identity: the table is already in the activation dtype


class Fp8Format(StorageFormat):
    quantized = True

    def __init__(self) -> None:
        super().__init__(torch.float8_e4m3fn)

    def new_scale(self, device: torch.device | str) -> torch.Tensor:
        return torch.full((1,), MISSING_SCALE, dtype=torch.float32, device=device)

    def check_loaded(self, scale: torch.Tensor | None) -> None:
        if scale is None or bool(torch.any(scale == MISSING_SCALE)):
            raise ValueError("FP8 PLE table is missing its global scale (set_scale was never called)")

    def dequantize(
        self, rows: torch.Tensor, scale: torch.Tensor | None, out_dtype: torch.dtype
    ) -> torch.Tensor:
        if scale is None:
            raise RuntimeError("FP8 PLE embedding is missing its global scale")
        if scale.device != rows.device:
            raise RuntimeError(
                f"FP8 PLE scale must be on the output device ({rows.device}), it is on {scale.device}"
            )
        return rows.to(out_dtype) * scale.to(out_dtype)
