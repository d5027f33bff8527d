"""The systems under test: PLE embedding backends, their formats and kernels."""

from .base import PLEEmbedding, ShardSpec
from .formats import DTYPES, StorageFormat, dtype_from_name, dtype_name
from .kernels import get_kernel, kernel_names, register_kernel
from .registry import backend_names, get_backend, register_backend
from .synthetic import fill_synthetic, synthetic_rows

__all__ = [
    "PLEEmbedding", "ShardSpec", "DTYPES", "StorageFormat", "dtype_from_name", "dtype_name",
    "get_kernel", "kernel_names", "register_kernel", "backend_names", "get_backend",
    "register_backend", "fill_synthetic", "synthetic_rows",
]
