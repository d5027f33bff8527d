"""The torchrun protocol: under ``torchrun`` every rank runs the same case loop in its own process
(torchrun's agent started them).  The first case joins the process group, makes a gloo group of
its own for agreements and measures the ceilings; after each case every rank tells every other
how it ended (:meth:`TorchrunRanks._agree`), and after a case the ranks left at different points
they rebuild every process group and check it (:meth:`TorchrunRanks._recover`), or end the run
with the reason (``abort_reason``).  Rank 0 writes the records."""

from __future__ import annotations

import datetime
import os
import socket
import sys
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from ..measure import device_info, measure_ceilings
from ..measure.profiler import torch_trace_case, torch_trace_name
from ..parallel import DEFAULT_TIMEOUT_S
from ..record import CaseResult
from ..results import RunWriter, now_iso
from ..run_meta import RunMeta
from ..spec.case import Case
from .outcome import SkipCase
from .provenance import add_measured
from .rank import allreduce_busbw, start_rank


class TorchrunRanks:
    """This process as one rank of torchrun's world: its case executor, agreement group and the
    state of the agreement / recovery protocol."""

    def __init__(self, options, meta: RunMeta, writer: RunWriter, world: int):
        self.options = options
        self.meta = meta
        self.writer = writer
        self.torchrun_world = world
        self.inproc = None  # the CaseExecutor, made by start() at the first case
        self.agree_group = None
        self.agree_timeout_s = 0.0
        self.abort_reason: str | None = None  # set when a torchrun run cannot go on
        self.recoveries = 0  # process groups rebuilt after a case the ranks left apart

    def close(self) -> None:
        """Under torchrun: wait for every rank (so that none is torn down while
        rank 0 writes), then leave the process group."""
        if self.inproc is None:
            return
        self.inproc.release_table()
        self.inproc = None
        if not dist.is_initialized():
            return
        if self.agree_group is not None and not self.abort_reason:
            try:
                dist.all_gather_object([None] * self.torchrun_world, "done", group=self.agree_group)
            except Exception:  # noqa: BLE001 - the run is over either way
                pass
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass

    @staticmethod
    def _ended(status: str, reason: str = "", **kw) -> CaseResult:
        return CaseResult(status=status, reason=reason, finished_at=now_iso(), **kw)

    def start(self) -> None:
        """First case of torchrun's world size: join the process group, make the
        agreement group, and measure the ceilings (rank 0) and the all-reduce
        ceiling (every rank)."""
        world = self.torchrun_world
        rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.inproc = start_rank(rank, world, local_rank=local_rank)
        device = self.inproc.device
        if world > 1:
            # Outcomes are agreed on in a group of their own (gloo, CPU objects), so that an
            # agreement can never pair with a collective a failed case left behind.  Its
            # timeout is longer than a collective's: a rank that failed early waits here
            # while the others time out of the case's collectives.
            self.agree_timeout_s = max(self.options.case_timeout_s, 2 * DEFAULT_TIMEOUT_S + 30)
            self.agree_group = dist.new_group(backend="gloo",
                                              timeout=datetime.timedelta(seconds=self.agree_timeout_s))
        info: dict[str, Any] = {"rank": rank, "local_rank": local_rank,
                                "host": socket.gethostname(), "device": str(device)}
        found: dict[str, Any] = {}  # rank 0: ceilings measured now, written with the ranks below
        found_device = None
        if rank == 0:
            if not self.meta.ceilings.raw:
                try:
                    found = measure_ceilings(device)
                except Exception as exc:  # noqa: BLE001 - a run without ceilings is still a run
                    print(f"warning: ceilings not measured: {type(exc).__name__}: {exc}", file=sys.stderr)
            if self.meta.device is None:
                found_device = device_info(device)
            known = {**self.meta.ceilings.raw, **found}
            info["need_allreduce"] = f"allreduce_busbw_gbps_w{world}" not in known
        if world > 1:
            everyone: list = [None] * world
            dist.all_gather_object(everyone, info, group=self.agree_group)  # also waits for rank 0's ceilings
            if everyone[0].get("need_allreduce"):
                busbw = allreduce_busbw(device, world)
                if rank == 0:
                    found.update(busbw)
            ranks = [{k: v for k, v in e.items() if k != "need_allreduce"} for e in everyone]
        else:
            ranks = [{k: v for k, v in info.items() if k != "need_allreduce"}]
        if rank == 0:
            add_measured(self.writer, self.meta, ceilings=found, device=found_device, ranks=ranks)

    def run_case(self, case: Case, policy) -> CaseResult:
        """Under torchrun: this process is one rank; every rank runs the same cases
        in lockstep and agrees on each case's outcome before the next one."""
        if case.world_size != self.torchrun_world:
            return self._ended(SkipCase.status,
                               f"needs {case.world_size} ranks, torchrun started {self.torchrun_world}")
        if self.inproc is None:
            self.start()
        started = time.perf_counter()
        result = self._traced_run(case, policy)
        result.finished_at = now_iso()
        if self.torchrun_world > 1:
            result = self._agree(case, result)
        result.duration_s = round(time.perf_counter() - started, 3)
        return result

    def _traced_run(self, case: Case, policy) -> CaseResult:
        """``self.inproc.outcome``, under ``run --torch-trace`` recording the case's windows into
        its run folder (the CLI refuses it under torchrun, whose other ranks write to scratch)."""
        n = self.options.torch_trace
        path = self.writer.run_dir / torch_trace_name(case.case_id, self.inproc.rank) if n else None
        try:
            with torch_trace_case(path, n):
                return self.inproc.outcome(case, policy)
        except Exception as exc:  # noqa: BLE001 - the trace itself failed
            return self._ended("failed", f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())

    def _agree(self, case: Case, result: CaseResult) -> CaseResult:
        """Every rank tells every other how the case ended.  All ok: rank 0's result
        stands.  Otherwise the case is ``failed`` (any rank failed), else ``invalid``,
        else ``skipped``, with each rank's reason (root causes before the collective
        timeouts they led to); the ranks then drop the table and its process groups,
        check the default group, and end the run if it is broken."""
        world = self.torchrun_world
        facts = dict(lookup_mechanism=result.lookup_mechanism, table_in_host_memory=result.table_in_host_memory)
        mine = {"rank": self.inproc.rank, "case_id": case.case_id, "status": result.status,
                "reason": result.reason, "traceback": result.traceback or ""}
        everyone: list = [None] * world
        try:
            dist.all_gather_object(everyone, mine, group=self.agree_group)
        except Exception as exc:  # noqa: BLE001
            self.abort_reason = (f"the ranks could not agree on the outcome of {case.case_id} within "
                                 f"{self.agree_timeout_s:.0f} s ({type(exc).__name__}: {exc}): a rank died or "
                                 "hung; ending the run")
            return self._ended("failed", f"rank {mine['rank']} {mine['status']}: {mine['reason']}; "
                                         + self.abort_reason, traceback=mine["traceback"], **facts)
        where = {e["case_id"] for e in everyone}
        if len(where) > 1:
            self.abort_reason = ("the ranks are at different cases (" + ", ".join(
                f"rank {e['rank']}: {e['case_id']}" for e in everyone) + "): they do not run the same case "
                "list (same suite, --case and --resume on every rank?); ending the run")
            return self._ended("failed", self.abort_reason, **facts)
        statuses = [e["status"] for e in everyone]
        if all(s == "ok" for s in statuses):
            return result
        uniform = len(set(statuses)) == 1 and len({e["reason"] for e in everyone}) == 1
        if uniform and statuses[0] != "failed":
            return result  # the same skip / wrong result everywhere: the ranks stayed in step
        status = "failed" if "failed" in statuses else "invalid" if "invalid" in statuses else "skipped"
        bad = sorted((e for e in everyone if e["status"] != "ok"),
                     key=lambda e: (_is_collective_error(e["reason"]), e["rank"]))
        reason = "; ".join(f"rank {e['rank']} {e['status']}: {e['reason']}" for e in bad)
        out = self._ended(status, reason, **facts,
                          rank_outcomes=[{k: e[k] for k in ("rank", "status", "reason")} for e in everyone],
                          traceback=next((e["traceback"] for e in bad if e["traceback"]), ""))
        self._recover(case)
        return out

    def _recover(self, case: Case) -> None:
        """After a case the ranks left at different points.  Collectives may be
        pending in any of its groups, the default one included (a late message
        meeting a different collective aborts a gloo process), so every group is
        rebuilt: drop the table, leave all groups, join a fresh default group over
        torchrun's store (its own key prefix), and check it with an all-reduce.
        If that fails anywhere, the run ends with a clear message."""
        world, rank = self.torchrun_world, self.inproc.rank
        self.inproc.reset()
        self.recoveries += 1
        try:
            store = c10d._get_default_store()
            backend = dist.get_backend()
            dist.destroy_process_group()
            kwargs: dict[str, Any] = {
                "backend": backend, "rank": rank, "world_size": world,
                "store": dist.PrefixStore(f"ple_bench/recovery{self.recoveries}", store),
                "timeout": datetime.timedelta(seconds=DEFAULT_TIMEOUT_S)}
            if backend == "nccl":
                kwargs["device_id"] = self.inproc.device
            dist.init_process_group(**kwargs)
            self.agree_group = dist.new_group(backend="gloo",
                                              timeout=datetime.timedelta(seconds=self.agree_timeout_s))
        except Exception as exc:  # noqa: BLE001
            self.abort_reason = (f"could not rebuild the process group after the failure of {case.case_id} "
                                 f"({type(exc).__name__}: {exc}); ending the run. Records so far are kept; "
                                 "continue with torchrun ... -m ple_bench run --resume RUN_DIR")
            return
        device = self.inproc.device if backend == "nccl" else torch.device("cpu")
        try:
            probe = torch.full((1,), rank + 1, dtype=torch.int64, device=device)
            dist.all_reduce(probe)
            expect = world * (world + 1) // 2
            health = "ok" if int(probe.item()) == expect else \
                f"all-reduce probe gave {int(probe.item())}, expected {expect}"
        except Exception as exc:  # noqa: BLE001
            health = f"{type(exc).__name__}: {exc}"
        everyone: list = [None] * world
        try:
            dist.all_gather_object(everyone, (rank, health), group=self.agree_group)
        except Exception as exc:  # noqa: BLE001
            everyone = [(rank, f"agreement failed: {type(exc).__name__}: {exc}")]
        broken = [f"rank {r}: {h}" for r, h in everyone if h != "ok"]
        if broken:
            self.abort_reason = (f"the process group is broken after the failure of {case.case_id} ("
                                 + "; ".join(broken) + "); ending the run. Records so far are kept; "
                                 "continue with torchrun ... -m ple_bench run --resume RUN_DIR")


def _is_collective_error(reason: str) -> bool:
    """A failure that is the consequence of another rank's (a collective that timed
    out or lost its peer), as opposed to a root cause."""
    text = reason.lower()
    return reason.startswith(("DistBackendError", "DistNetworkError", "DistError", "DistStoreError")) or any(
        m in text for m in ("timed out", "timeout", "connection closed", "connection reset"))
