"""Sends each case to its ranks and returns how it ended, a :class:`~ple_bench.record.CaseResult`
(the suite loop makes the record of it, ``record.build``): by default to ple_bench's own
worker processes (``pool.WorkerPool``, one pool per world size, a fresh one after any failure, so a
poisoned or hung worker never runs the next case), under torchrun to this process, one rank of
torchrun's world (``torchrun.TorchrunRanks``)."""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from typing import Any

from ..env import external_world_size, gpu_count
from ..measure.profiler import torch_trace_name
from ..record import CaseResult
from ..results import RunWriter, now_iso
from ..run_meta import RunMeta
from ..spec.case import Case
from .outcome import SkipCase
from .pool import WorkerError, WorkerPool, policy_dict
from .provenance import add_measured
from .torchrun import TorchrunRanks


class CaseDispatcher:
    """Finds (or starts) the worker pool for a case's world size and runs the case there, or,
    under torchrun, hands it to :class:`~ple_bench.run.torchrun.TorchrunRanks`."""

    def __init__(self, options, meta: RunMeta, writer: RunWriter):
        self.options = options
        self.meta = meta
        self.writer = writer
        self.pool = None
        self.torchrun = None
        if external_world_size() is not None:
            self.torchrun = TorchrunRanks(options, meta, writer, external_world_size())

    @property
    def abort_reason(self) -> str | None:
        """Why the run cannot go on (torchrun only: its ranks could not agree or recover)."""
        return self.torchrun.abort_reason if self.torchrun is not None else None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self.torchrun is not None:
            self.torchrun.close()

    @staticmethod
    def _ended(status: str, reason: str = "", **kw) -> CaseResult:
        """A case that ended here, in the parent, before any worker reported on it."""
        return CaseResult(status=status, reason=reason, finished_at=now_iso(), **kw)

    def _ensure_pool(self, world: int):
        if self.pool is not None and (self.pool.world != world or not self.pool.alive()):
            self.pool.close()
            self.pool = None
        if self.pool is None:
            self.pool = WorkerPool(world)
            self._measure_ceilings(world)
        return self.pool

    def _measure_ceilings(self, world: int) -> None:
        ceilings = self.meta.ceilings.raw
        need_single = not ceilings
        need_world = world > 1 and f"allreduce_busbw_gbps_w{world}" not in ceilings
        if not (need_single or need_world):
            return
        reply = self.pool.request(("ceilings",), timeout_s=300)
        if reply[0] == "ok":
            found = dict(reply[1].get("ceilings") or {})
            if not need_single:
                found = {k: v for k, v in found.items() if k.startswith("allreduce")}
            add_measured(self.writer, self.meta, ceilings=found, device=reply[1].get("device"))
        else:
            print(f"warning: ceilings not measured: {reply[1]}", file=sys.stderr)

    def run_case(self, case: Case, policy, extra_options: dict[str, Any] | None = None) -> CaseResult:
        """``case`` run by its ranks; ``extra_options`` go to the worker with the case (a repeated
        case's ``park_tables`` and ``process_facts``)."""
        world = case.world_size
        if self.torchrun is not None:
            return self.torchrun.run_case(case, policy)
        gpus = gpu_count()
        if gpus and world > gpus:
            return self._ended(SkipCase.status, f"needs {world} GPUs, this machine has {gpus}")
        try:
            pool = self._ensure_pool(world)
        except (WorkerError, TimeoutError, OSError) as exc:
            self.close()
            return self._ended("failed", f"could not start {world} worker(s): {exc}")
        options = {"nvtx": self.options.nvtx, "profile_window": self.options.profile_window, **(extra_options or {})}
        if self.options.torch_trace:
            options["torch_trace"] = {"max_samples": self.options.torch_trace,
                                      "path": str(self.writer.run_dir / torch_trace_name(case.case_id))}
        started = time.perf_counter()
        try:
            reply = pool.request(("case", case.axes(), policy_dict(policy), options),
                                 timeout_s=self.options.case_timeout_s)
        except TimeoutError as exc:
            self.close()
            return self._ended("failed", f"timed out: {exc}; its workers were stopped")
        except (BrokenPipeError, EOFError, OSError) as exc:  # a worker that died after its last case
            self.close()
            return self._ended("failed", f"its worker was gone before the case started ({exc}); "
                                         "the workers were restarted")
        duration = round(time.perf_counter() - started, 3)
        status, reason = reply[0], reply[1]
        reported = reply[3] if len(reply) > 3 and isinstance(reply[3], CaseResult) else CaseResult()
        # the reason as the pool gives it (a failure names its rank); a failure keeps its traceback
        result = replace(reported, status=status, reason=reason if status != "ok" else "",
                         traceback=(reply[2] if len(reply) > 2 else "") if status == "failed" else None,
                         duration_s=duration, finished_at=now_iso())
        if status == "failed":
            # a failed case may have left its worker poisoned (a sticky CUDA error) or other
            # ranks stuck in a collective: the next case starts in fresh workers
            self.close()
        return result


def _gathers_on_host(impl: str) -> bool:
    from ..backends.registry import get_backend  # noqa: PLC0415  (torch: the run's own process measures)

    try:
        return bool(get_backend(impl).gathers_on_host)
    except (ImportError, ValueError):  # its case says why when it runs
        return False


def build_native_first(todo: list[Case], mode: str, progress, quiet: bool) -> None:
    """Build the native host gather before the first case that uses it (a host-gather path, or a
    GPU run's host-gather ceiling), so that its first build (about a minute of one core) is not
    timed against a case's ``--case-timeout``, and a case timeout never kills a build midway."""
    if not any(mode == "gpu" or _gathers_on_host(c.impl) for c in todo):
        return
    from ..backends.cuda.native import build_before_cases  # noqa: PLC0415

    status = build_before_cases()
    if not quiet and status != "native":
        progress.write(f"the native host gather is not available ({status}): the host paths run in Python")
