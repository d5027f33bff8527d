"""One answer, for every entry point, to "what may this process use?": a usable
CUDA GPU (``PLE_BENCH_FORCE_CPU`` pretends there is none — the CLI, the workers,
the pytest suites and the torchrun path all honour it), how many, which device a
rank takes, and how the ranks were launched (torchrun, in-process, or
ple_bench's own worker processes)."""

from __future__ import annotations

import os

FORCE_CPU_ENV = "PLE_BENCH_FORCE_CPU"
IN_PROCESS_ENV = "PLE_BENCH_IN_PROCESS"
#: the run's compute calibration file (``calibration.json`` in the run folder): every worker of a run,
#: a fresh one after a failure too, and a resumed run read the matmul counts the first one measured
CALIBRATION_ENV = "PLE_BENCH_CALIBRATION_FILE"
CALIBRATION_FILE = "calibration.json"


def force_cpu() -> bool:
    """``PLE_BENCH_FORCE_CPU`` is set: behave as on a machine without a GPU."""
    return bool(os.environ.get(FORCE_CPU_ENV))


def gpu_available() -> bool:
    """A CUDA GPU is usable here (and not forced off)."""
    if force_cpu():
        return False
    try:
        import torch  # env answers before torch is imported (conftest, workers set the environment first)

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - a broken CUDA install means "no GPU"
        return False


def gpu_count() -> int:
    """Usable GPUs (0 when forced off or none)."""
    if not gpu_available():
        return 0
    import torch  # env answers before torch is imported (conftest, workers set the environment first)

    return torch.cuda.device_count()


def launcher() -> str:
    """``torchrun`` (its agent started the ranks), ``in_process`` (the ranks are this process and
    its peers, ``PLE_BENCH_IN_PROCESS``) or ``self`` (ple_bench starts its own workers)."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return "torchrun"
    if os.environ.get(IN_PROCESS_ENV):
        return "in_process"
    return "self"


def external_world_size() -> int | None:
    """The world the launcher made (``WORLD_SIZE``) when ranks were not started by ple_bench."""
    return int(os.environ.get("WORLD_SIZE", "1")) if launcher() != "self" else None


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def resolve_device(device):
    """``device`` as a ``torch.device`` (an int is a CUDA index), where a CUDA device without
    an index means the current one (left as it is when CUDA is not usable)."""
    import torch  # env answers before torch is imported (conftest, workers set the environment first)

    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def device_for(rank_index: int, local_rank: int | None = None):
    """The device a rank takes: its GPU (``local_rank``, else ``rank % gpus``) where one is
    usable, else the CPU."""
    import torch  # env answers before torch is imported (conftest, workers set the environment first)

    n = gpu_count()
    if not n:
        return torch.device("cpu")
    index = local_rank if local_rank is not None else rank_index % n
    return torch.device("cuda", index)
