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
