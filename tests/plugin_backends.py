"""Plug-in backends used by the runner tests, loaded by import path
(``tests.plugin_backends:Name``) exactly as a user's own class would be."""

from __future__ import annotations

import os

import torch

from ple_bench.backends.device import DeviceResidentEmbedding


class WrongRowsBackend(DeviceResidentEmbedding):
    """Returns the right shape with one wrong byte: must be recorded invalid, never timed."""

    def lookup(self, ids, dp_token_counts=None):
        out = super().lookup(ids, dp_token_counts).clone()
        out.view(torch.uint8).view(-1)[0] ^= 0x01
        return out


class RaisingBackend(DeviceResidentEmbedding):
    def lookup(self, ids, dp_token_counts=None):
        raise RuntimeError("planted failure in lookup")


class CrashingBackend(DeviceResidentEmbedding):
    """Kills its process, as a fatal CUDA error would poison it."""

    def lookup(self, ids, dp_token_counts=None):
        os._exit(17)


class NotABackend:
    pass


class RankOneRaisingBackend(DeviceResidentEmbedding):
    """Raises on rank 1 only, before its first collective, while the other ranks
    go on into the lookup's id gather: a torchrun run must record the case failed,
    naming rank 1, and go on (tests/test_torchrun.py)."""

    def lookup(self, ids, dp_token_counts=None):
        if self.groups.rank == 1:
            raise RuntimeError("planted failure on rank 1")
        return super().lookup(ids, dp_token_counts)


class RankOneRaisingDefaultGroupBackend(DeviceResidentEmbedding):
    """Rank 1 raises while the other ranks wait in a collective of the *default*
    group (as they would in the slowest-rank gather): after the timeout that group
    holds an unmatched operation, so the run must rebuild it before going on."""

    def lookup(self, ids, dp_token_counts=None):
        import torch.distributed as dist

        if self.groups.rank == 1:
            raise RuntimeError("planted failure on rank 1 (default group)")
        dist.all_reduce(torch.ones(1))
        return super().lookup(ids, dp_token_counts)


class PoisoningBackend(DeviceResidentEmbedding):
    """Raises after leaving its process poisoned, as a sticky CUDA error leaves a
    CUDA context: every later lookup in that process fails (``VictimBackend``)."""

    def lookup(self, ids, dp_token_counts=None):
        os.environ["PLE_BENCH_TEST_POISONED"] = "1"
        raise RuntimeError("planted failure that poisons the worker")


class VictimBackend(DeviceResidentEmbedding):
    """An ordinary backend that fails only in a process an earlier case poisoned."""

    def lookup(self, ids, dp_token_counts=None):
        if os.environ.get("PLE_BENCH_TEST_POISONED"):
            raise RuntimeError("ran in a worker an earlier case had poisoned")
        return super().lookup(ids, dp_token_counts)


class HangingBackend(DeviceResidentEmbedding):
    """Never returns from its lookup: the runner must stop it at ``--case-timeout``."""

    def lookup(self, ids, dp_token_counts=None):
        import time

        time.sleep(3600)
        return super().lookup(ids, dp_token_counts)
