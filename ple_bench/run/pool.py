"""Worker processes: each case runs in a child process (one per rank), so that a
fatal CUDA error, a crash or a hang takes down a worker, never the run.

The parent sends ``("case", axes, policy, options)`` / ``("ceilings",)`` / ``None`` (stop)
to every rank's pipe.  A rank answers a case with ``(status, reason, traceback, result)``: the
:class:`~ple_bench.record.CaseResult` its executor made, however the case ended (``ok``, or as
:mod:`.outcome` says), which the parent turns into the record (``record.build``); anything else
with ``("ok", payload)`` or ``("failed", message, traceback)``.  Only rank 0's reply is kept, or
the first rank's failure."""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing as mp
import os
import signal
import socket
import threading
import time
import traceback
from multiprocessing.connection import wait
from typing import Any

_FATAL_MARKERS = ("illegal memory access", "CUDA error", "device-side assert", "AcceleratorError",
                  "unspecified launch failure", "NCCL", "Connection closed", "DistBackendError")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker_main(rank: int, world: int, port: int, conn, env: dict[str, str]) -> None:
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    # imported here, after the environment above is set: torch reads it when it is first imported
    import torch.distributed as dist

    from .. import annotate
    from ..measure import TimingPolicy, device_info, measure_ceilings, set_profiler_window
    from ..measure.placement import process_facts
    from ..measure.profiler import torch_trace_case
    from ..spec.case import Case
    from .rank import allreduce_busbw, start_rank

    try:
        executor = start_rank(rank, world)
        device = executor.device
        conn.send(("ready", {"device": str(device)}))
    except BaseException as exc:  # noqa: BLE001
        conn.send(("failed", f"worker start failed: {type(exc).__name__}: {exc}", traceback.format_exc()))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg is None:
            break
        op = msg[0]
        try:
            if op == "case":
                _, axes, policy_dict, options = msg
                annotate.set_enabled(options.get("nvtx", True))
                set_profiler_window(options.get("profile_window", False))
                trace = options.get("torch_trace") or {}
                path = trace.get("path")
                if path and rank:  # every rank records its own windows
                    path = path[: -len(".json")] + f".rank{rank}.json"
                executor.park_tables = bool(options.get("park_tables"))
                with torch_trace_case(path, trace.get("max_samples")):
                    result = executor.outcome(Case.from_axes(axes), TimingPolicy(**policy_dict))
                if options.get("process_facts"):
                    result.process = process_facts()
                conn.send((result.status, result.reason, result.traceback or "", result))
                if result.status == "failed" and any(marker in result.reason for marker in _FATAL_MARKERS):
                    break  # the process may be poisoned: let the parent start a fresh one
            elif op == "ceilings":
                ceilings: dict = {}
                info = None
                if rank == 0:
                    ceilings = measure_ceilings(device)
                    info = device_info(device)
                if world > 1:
                    ceilings.update(allreduce_busbw(device, world))
                conn.send(("ok", {"ceilings": ceilings, "device": info}))
            else:
                conn.send(("failed", f"unknown op {op!r}", ""))
        except BaseException as exc:  # noqa: BLE001
            text = f"{type(exc).__name__}: {exc}"
            conn.send(("failed", text, traceback.format_exc()))
            if any(marker in text for marker in _FATAL_MARKERS) or isinstance(exc, KeyboardInterrupt):
                break  # the process may be poisoned: let the parent start a fresh one
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass


class WorkerError(RuntimeError):
    pass


@contextlib.contextmanager
def _sigint_ignored():
    """SIGINT ignored while a worker is started: Ctrl-C at a terminal signals the whole process
    group, and a worker that got it (still importing, or mid-case) died with a KeyboardInterrupt
    traceback; the parent handles Ctrl-C and ends its workers itself.  Python keeps an inherited
    SIG_IGN for SIGINT (it installs its handler only over the default one)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class WorkerPool:
    """``world`` child processes forming one process group."""

    def __init__(self, world: int, *, start_timeout_s: float = 180.0, env: dict[str, str] | None = None):
        self.world = world
        ctx = mp.get_context("spawn")
        port = _free_port()
        self.conns = []
        self.procs = []
        child_env = dict(env or {})
        for rank in range(world):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(rank, world, port, child, child_env),
                               daemon=True, name=f"ple_bench-rank{rank}")
            with _sigint_ignored():  # the child starts with it ignored, and Python keeps it so
                proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
        replies = self._collect(start_timeout_s)
        for rank, reply in enumerate(replies):
            if reply[0] != "ready":
                self.close()
                raise WorkerError(f"rank {rank}: {reply[1]}")

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    def _collect(self, timeout_s: float) -> list[tuple]:
        replies: dict[int, tuple] = {}
        deadline = time.monotonic() + timeout_s
        pending = {conn: rank for rank, conn in enumerate(self.conns)}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                ranks = sorted(pending.values())
                raise TimeoutError(f"rank(s) {ranks} did not answer within {timeout_s:.0f} s")
            ready = wait(list(pending), timeout=min(left, 1.0))
            for conn in ready:
                rank = pending.pop(conn)
                try:
                    replies[rank] = conn.recv()
                except (EOFError, OSError):
                    # its pipe closes a moment before the process can be reaped: wait for the exit
                    # code, which says what killed it ("exit code None" was a race)
                    self.procs[rank].join(timeout=2.0)
                    code = self.procs[rank].exitcode
                    replies[rank] = ("failed", f"rank {rank} died (exit code {code})", "")
                if replies[rank][0] == "failed":
                    return [replies.get(r, ("failed", replies[rank][1], "")) for r in range(self.world)]
            for conn, rank in list(pending.items()):
                if not self.procs[rank].is_alive() and not conn.poll():
                    code = self.procs[rank].exitcode
                    pending.pop(conn)
                    replies[rank] = ("failed", f"rank {rank} died (exit code {code})", "")
                    return [replies.get(r, replies[rank]) for r in range(self.world)]
        return [replies[r] for r in range(self.world)]

    def request(self, msg: tuple, timeout_s: float) -> tuple:
        """Send ``msg`` to every rank; rank 0's reply, or the first rank's failure."""
        for conn in self.conns:
            conn.send(msg)
        replies = self._collect(timeout_s)
        for rank, reply in enumerate(replies):
            if reply[0] == "failed":
                return ("failed", f"rank {rank}: {reply[1]}", reply[2] if len(reply) > 2 else "", *reply[3:4])
        return replies[0]

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        deadline = time.monotonic() + 5
        for p in self.procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        for conn in self.conns:
            conn.close()


def policy_dict(policy) -> dict[str, Any]:
    return dataclasses.asdict(policy)
