"""One rank's start, written once for ple_bench's own workers (:mod:`.pool`) and for torchrun's ranks
(:mod:`.torchrun`): its device, its process group, its case executor; and the all-reduce ceiling every rank of a
multi-rank world measures with the others."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..env import device_for
from ..measure.repeat import repeat_timed
from ..parallel import init_distributed
from .executor import CaseExecutor


def start_rank(rank: int, world: int, local_rank: int | None = None) -> CaseExecutor:
    """This process as rank ``rank`` of ``world``: its device (``PLE_BENCH_FORCE_CPU`` honoured, as
    every entry point does), the default process group joined (gloo on the CPU) when ``world > 1``, and
    the executor that runs its cases."""
    device = device_for(rank, local_rank=local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1:
        init_distributed("gloo" if device.type == "cpu" else None)
    return CaseExecutor(rank=rank, world_size=world, device=device)


def allreduce_busbw(device, world: int) -> dict[str, float]:
    """All-reduce bus bandwidth over the whole world, measured now (nccl-tests' convention):
    3 untimed all-reduces, then the median of 10, each after a barrier, on the host clock
    around the synchronized call (:func:`ple_bench.measure.repeat.repeat_timed`: every rank
    runs the same fixed count)."""
    nbytes = (256 << 20) if device.type == "cuda" else (8 << 20)
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    timed = repeat_timed(lambda: dist.all_reduce(x), device=device, warmup=3, min_repeats=10, host=True,
                         before=dist.barrier)
    busbw = 2 * (world - 1) / world * nbytes / timed.median_s / 1e9
    return {f"allreduce_busbw_gbps_w{world}": busbw}
