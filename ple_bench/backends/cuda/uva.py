"""Unified Virtual Addressing: whether it is there, and a CUDA view of a pinned
host tensor built through public APIs only (``__cuda_array_interface__`` +
``torch.as_tensor``).  The view aliases the host bytes; a kernel reading it
reads host memory over PCIe / C2C without a copy."""

from __future__ import annotations

import platform

import torch


def uva_available(device: torch.device | str | None = None) -> tuple[bool, str]:
    if not torch.cuda.is_available():
        return False, "CUDA is not available on this machine"
    if "microsoft" in platform.uname().release.lower():
        return False, "pinned memory is not usable under WSL"
    return True, ""


class _CudaArrayInterface:
    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
        }


def cuda_view_of_pinned(host: torch.Tensor, device: torch.device | str = "cuda") -> torch.Tensor:
    """A CUDA tensor with ``host``'s shape and dtype that aliases its pinned bytes."""
    if host.device.type != "cpu" or not host.is_pinned():
        raise ValueError("a UVA view needs a pinned host tensor")
    if not host.is_contiguous():
        raise ValueError("a UVA view needs a contiguous host tensor")
    nbytes = host.numel() * host.element_size()
    with torch.cuda.device(torch.device(device)):
        raw = torch.as_tensor(_CudaArrayInterface(host.data_ptr(), nbytes), device=device)
    if raw.data_ptr() != host.data_ptr():
        raise RuntimeError("UVA view does not alias the pinned buffer (no unified addressing)")
    return raw.view(host.dtype).view(host.shape)
