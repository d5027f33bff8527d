"""TP / ETP / DP topology and the torch.distributed process groups built from it.

Rank layout (world = TP x DP): ``rank = dp_rank * TP + tp_rank``.

* An ETP group is ``ETP`` consecutive ranks: ``ETP / TP`` data-parallel replicas
  (``replicas``) of one TP group share one vocab-parallel table.
* The id-gather group of a rank is the ranks of its ETP group with the same
  ``tp_rank`` (size ``replicas``): the DP peers whose ids it looks up with it.

When DP is larger than ETP / TP there are ``DP / replicas`` independent ETP
groups; each gathers and reduces only inside itself, so ours handles that case
correctly (the seed gathered over the whole DP group and could hang).

Single-process use (TP = ETP = DP = 1) needs no process group at all.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from .env import gpu_available


class TopologyError(ValueError):
    """A (TP, ETP, DP) combination that cannot exist."""


@dataclass(frozen=True)
class Topology:
    tp: int = 1
    etp: int = 1
    dp: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "etp", "dp"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise TopologyError(f"{name.upper()} must be a positive integer, got {value!r}")
        if self.etp % self.tp:
            raise TopologyError(
                f"ETP size must be divisible by TP size, but got ETP={self.etp} and TP={self.tp}"
            )
        if self.etp > self.world_size:
            raise TopologyError(
                f"ETP={self.etp} is larger than the world size TP x DP = {self.tp} x {self.dp} "
                f"= {self.world_size}"
            )
        if self.dp % self.replicas:
            raise TopologyError(
                f"DP={self.dp} is not a multiple of ETP/TP={self.replicas}: the DP ranks cannot be "
                f"split into whole ETP groups"
            )

    @property
    def world_size(self) -> int:
        return self.tp * self.dp

    @property
    def replicas(self) -> int:
        """DP replicas that share one table (``ETP / TP``)."""
        return self.etp // self.tp

    @property
    def num_etp_groups(self) -> int:
        return self.world_size // self.etp

    def coords(self, rank: int) -> "RankCoords":
        if not 0 <= rank < self.world_size:
            raise TopologyError(f"rank {rank} outside world of size {self.world_size}")
        dp_rank, tp_rank = divmod(rank, self.tp)
        group_index, etp_rank = divmod(rank, self.etp)
        return RankCoords(
            rank=rank,
            tp_rank=tp_rank,
            dp_rank=dp_rank,
            etp_rank=etp_rank,
            etp_group_index=group_index,
            slot=dp_rank % self.replicas,
        )

    def etp_group_ranks(self, group_index: int) -> list[int]:
        start = group_index * self.etp
        return list(range(start, start + self.etp))

    def gather_group_ranks(self, group_index: int, tp_rank: int) -> list[int]:
        base = group_index * self.etp + tp_rank
        return [base + i * self.tp for i in range(self.replicas)]

    def group_dp_ranks(self, group_index: int) -> list[int]:
        """The DP ranks (indices into per-DP token counts) of one ETP group."""
        first = group_index * self.replicas
        return list(range(first, first + self.replicas))

    def as_dict(self) -> dict[str, int]:
        return {"tp": self.tp, "etp": self.etp, "dp": self.dp}


@dataclass(frozen=True)
class RankCoords:
    rank: int
    tp_rank: int
    dp_rank: int
    etp_rank: int
    etp_group_index: int
    slot: int  # this rank's slot among the DP replicas sharing its table


@dataclass
class Groups:
    """What one rank needs to talk to its peers. ``etp_group``/``gather_group``
    are ``None`` when the group has a single member (no collective needed)."""

    topology: Topology = field(default_factory=Topology)
    rank: int = 0
    etp_group: Any = None
    gather_group: Any = None

    @property
    def coords(self) -> RankCoords:
        return self.topology.coords(self.rank)

    @classmethod
    def single(cls) -> "Groups":
        return cls()

    @classmethod
    def build(cls, topology: Topology) -> "Groups":
        """Create the ETP and id-gather groups on an initialised default group.

        Every rank must call this (``new_group`` is collective over the world)."""
        if topology.world_size == 1:
            return cls(topology=topology, rank=0)
        if not dist.is_initialized():
            raise RuntimeError(
                f"topology {topology.as_dict()} needs {topology.world_size} ranks, but "
                "torch.distributed is not initialised (use torchrun or ple_bench's launcher)"
            )
        world = dist.get_world_size()
        if world != topology.world_size:
            raise TopologyError(
                f"topology {topology.as_dict()} needs world size {topology.world_size}, "
                f"but torch.distributed has {world} ranks"
            )
        rank = dist.get_rank()
        me = topology.coords(rank)
        # new_group's own default is 30 minutes: give the groups the collective timeout
        timeout = datetime.timedelta(seconds=DEFAULT_TIMEOUT_S)
        etp_group = gather_group = None
        for g in range(topology.num_etp_groups):
            ranks = topology.etp_group_ranks(g)
            pg = dist.new_group(ranks, timeout=timeout) if len(ranks) > 1 else None
            if g == me.etp_group_index:
                etp_group = pg
        for g in range(topology.num_etp_groups):
            for t in range(topology.tp):
                ranks = topology.gather_group_ranks(g, t)
                pg = dist.new_group(ranks, timeout=timeout) if len(ranks) > 1 else None
                if g == me.etp_group_index and t == me.tp_rank:
                    gather_group = pg
        return cls(topology=topology, rank=rank, etp_group=etp_group, gather_group=gather_group)


DEFAULT_TIMEOUT_S = float(os.environ.get("PLE_BENCH_COLLECTIVE_TIMEOUT_S", "120"))


def init_distributed(backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Initialise the default group from torchrun-style environment variables,
    with a timeout so that a dead peer fails the job instead of hanging it."""
    if dist.is_initialized():
        return
    if backend is None:
        backend = "nccl" if gpu_available() else "gloo"
    kwargs: dict[str, Any] = {"backend": backend, "timeout": datetime.timedelta(seconds=timeout_s)}
    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        kwargs["device_id"] = torch.device("cuda", local_rank)
    dist.init_process_group(**kwargs)
