"""GPU state through NVML: the SM clock sampled while measuring (to flag
throttled samples) and the machine description stored with every run.

Everything degrades quietly: with no GPU, no NVML library (``pynvml`` raises
``NVMLError_LibraryNotFound`` on CPU machines) or no ``pynvml`` module, clock
reads return ``None`` and :func:`device_info` describes the host CPU instead.
"""

from __future__ import annotations

import os
import platform
import time
from typing import Any

import torch

_NVML: Any = None  # the pynvml module once initialised, False if unusable


def nvml():
    """The initialised ``pynvml`` module, or None where NVML cannot be used."""
    global _NVML
    if _NVML is None:
        try:
            import pynvml  # optional: NVML

            pynvml.nvmlInit()
            _NVML = pynvml
        except Exception:  # ImportError, NVMLError_LibraryNotFound, driver errors
            _NVML = False
    return _NVML or None


def _cuda_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def nvml_handle(device: torch.device | str):
    """The NVML handle of a CUDA device, matched by UUID (then PCI bus id, then
    index) so that ``CUDA_VISIBLE_DEVICES`` renumbering does not mislead it."""
    device = torch.device(device)
    lib = nvml()
    if lib is None or device.type != "cuda" or not torch.cuda.is_available():
        return None
    idx = _cuda_index(device)
    props = torch.cuda.get_device_properties(idx)
    attempts = []
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        text = str(uuid)
        attempts.append(lambda: lib.nvmlDeviceGetHandleByUUID(text if text.startswith(("GPU-", "MIG-")) else "GPU-" + text))
    if hasattr(props, "pci_bus_id"):
        bus = f"{getattr(props, 'pci_domain_id', 0):08X}:{props.pci_bus_id:02X}:{getattr(props, 'pci_device_id', 0):02X}.0"
        attempts.append(lambda: lib.nvmlDeviceGetHandleByPciBusId_v2(bus))
    if not os.environ.get("CUDA_VISIBLE_DEVICES"):
        attempts.append(lambda: lib.nvmlDeviceGetHandleByIndex(idx))
    for attempt in attempts:
        try:
            return attempt()
        except Exception:
            continue
    return None


class ClockSampler:
    """Reads the current SM clock (MHz) of one device; ``read()`` is None where
    unavailable.  ``read_seconds`` accumulates the time spent reading (so a
    caller can check that sampling the clock does not dominate)."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._handle = nvml_handle(self.device) if self.device.type == "cuda" else None
        self.read_seconds = 0.0
        self.reads = 0
        self.max_sm_clock_mhz: float | None = None
        if self._handle is not None:
            try:
                lib = nvml()
                self.max_sm_clock_mhz = float(lib.nvmlDeviceGetMaxClockInfo(self._handle, lib.NVML_CLOCK_SM))
            except Exception:
                self.max_sm_clock_mhz = None

    @property
    def available(self) -> bool:
        return self._handle is not None

    def read(self) -> float | None:
        if self._handle is None:
            return None
        t0 = time.perf_counter()
        try:
            lib = nvml()
            return float(lib.nvmlDeviceGetClockInfo(self._handle, lib.NVML_CLOCK_SM))
        except Exception:
            return None
        finally:
            self.read_seconds += time.perf_counter() - t0
            self.reads += 1

    def is_throttled(self, mhz: float | None, threshold: float) -> bool:
        """True when a reading is below ``threshold`` x the maximum SM clock."""
        if mhz is None or not self.max_sm_clock_mhz:
            return False
        return mhz < threshold * self.max_sm_clock_mhz


# ------------------------------------------------------------------ machine
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _host_memory_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def _host_info() -> dict[str, Any]:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "cpu_cores_usable": usable,
        "host_memory_bytes": _host_memory_bytes(),
        "torch_threads": torch.get_num_threads(),
    }


def _nvml_str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def device_info(device: torch.device | str) -> dict[str, Any]:
    """A JSON-able description of the device (and always the host).

    CUDA: name, driver, cuda (runtime torch was built with), cuda_driver,
    memory_bytes, sm_count, l2_bytes, compute_capability, max_sm_clock_mhz,
    max_mem_clock_mhz, pcie_gen / pcie_width (current) and pcie_max_gen /
    pcie_max_width, uuid, persistence_mode -- NVML fields None where NVML is
    unusable.  CPU: name is the CPU model, cores, memory."""
    device = torch.device(device)
    info: dict[str, Any] = {"type": device.type, "torch": torch.__version__}
    info.update(_host_info())
    if device.type != "cuda" or not torch.cuda.is_available():
        info.update({"name": info["cpu_model"], "memory_bytes": info["host_memory_bytes"],
                     "cuda": None, "driver": None})
        return info
    idx = _cuda_index(device)
    props = torch.cuda.get_device_properties(idx)
    info.update({
        "index": idx,
        "name": props.name,
        "cuda": torch.version.cuda,
        "memory_bytes": int(props.total_memory),
        "sm_count": int(props.multi_processor_count),
        "l2_bytes": int(getattr(props, "L2_cache_size", 0)) or None,
        "compute_capability": f"{props.major}.{props.minor}",
        "uuid": str(getattr(props, "uuid", "")) or None,
    })
    nvml_fields = {"driver": None, "cuda_driver": None, "max_sm_clock_mhz": None,
                   "max_mem_clock_mhz": None, "pcie_gen": None, "pcie_width": None,
                   "pcie_max_gen": None, "pcie_max_width": None, "persistence_mode": None}
    info.update(nvml_fields)
    lib, handle = nvml(), nvml_handle(device)
    if lib is None or handle is None:
        return info
    queries = {
        "driver": lambda: _nvml_str(lib.nvmlSystemGetDriverVersion()),
        "cuda_driver": lambda: (lambda v: f"{v // 1000}.{(v % 1000) // 10}")(lib.nvmlSystemGetCudaDriverVersion()),
        "max_sm_clock_mhz": lambda: float(lib.nvmlDeviceGetMaxClockInfo(handle, lib.NVML_CLOCK_SM)),
        "max_mem_clock_mhz": lambda: float(lib.nvmlDeviceGetMaxClockInfo(handle, lib.NVML_CLOCK_MEM)),
        "pcie_gen": lambda: int(lib.nvmlDeviceGetCurrPcieLinkGeneration(handle)),
        "pcie_width": lambda: int(lib.nvmlDeviceGetCurrPcieLinkWidth(handle)),
        "pcie_max_gen": lambda: int(lib.nvmlDeviceGetMaxPcieLinkGeneration(handle)),
        "pcie_max_width": lambda: int(lib.nvmlDeviceGetMaxPcieLinkWidth(handle)),
        "persistence_mode": lambda: bool(lib.nvmlDeviceGetPersistenceMode(handle)),
    }
    for key, query in queries.items():
        try:
            info[key] = query()
        except Exception:
            info[key] = None
    return info
