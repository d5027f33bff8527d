"""Runs a suite: orders its cases so tables are reused, sends each to a worker
(one process per rank), records every outcome as soon as it is known, survives
crashes and Ctrl-C, resumes, and shows progress.

Two ways to run ranks:
* default: ple_bench starts its own worker processes (``worker.WorkerPool``),
  one pool per world size, gloo on CPUs and NCCL on GPUs;
* under ``torchrun``: every rank runs this same loop in-process; cases whose
  world size differs from torchrun's are skipped; rank 0 writes."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .case import Case
from .results import RunWriter, new_run_id, now_iso

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class RunOptions:
    results_dir: Path = Path("results")
    reports_dir: Path = Path("reports")
    resume: Path | None = None
    case_filter: list[str] = field(default_factory=list)
    case_timeout_s: float = 900.0
    progress: bool = True
    report: bool = True
    nvtx: bool = True
    profile_window: bool = False
    torch_trace: int | None = None  # record a torch.profiler trace of N samples per window, per case
    functional_note: str = ""
    argv: list[str] = field(default_factory=list)
    quiet: bool = False  # no messages (torchrun ranks other than 0)


@dataclass
class RunSummary:
    run_dir: Path
    counts: dict[str, int]
    interrupted: bool = False
    report: Path | None = None
    aborted: str | None = None  # why a torchrun run ended early

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        return 1 if self.counts.get("failed", 0) or self.counts.get("invalid", 0) else 0


def gpu_count() -> int:
    from .env import gpu_count as usable

    return usable()


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5)
        if out.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "-uno"],
                                   capture_output=True, text=True, timeout=5).stdout.strip()
            return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def base_meta(suite, mode: str) -> dict[str, Any]:
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # noqa: BLE001
        triton_version = None
    return {
        "suite": suite.name,
        "suite_path": str(suite.path),
        "mode": mode,
        "timer": "cuda_event" if mode == "gpu" else "host_monotonic",
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": triton_version,
        "python": platform.python_version(),
        "git_commit": git_commit(),
        "host": {"hostname": socket.gethostname(), "platform": platform.platform(),
                 "cpu_count": os.cpu_count()},
        "gpu_count": gpu_count(),
    }


def launch_info(cases: list[Case]) -> dict[str, Any]:
    """How the ranks were started: ``torchrun`` (its world, nodes and run id) or
    ``self`` (ple_bench's own worker processes, one pool per world size)."""
    from . import env as env_policy

    if env_policy.launcher() != "self":
        env = os.environ
        return {"launcher": env_policy.launcher(),
                "world_size": int(env.get("WORLD_SIZE", "1")),
                "local_world_size": int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", "1"))),
                "nnodes": int(env["GROUP_WORLD_SIZE"]) if env.get("GROUP_WORLD_SIZE") else None,
                "rdzv_run_id": env.get("TORCHELASTIC_RUN_ID"),
                "master": f"{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}" if env.get("MASTER_ADDR") else None}
    return {"launcher": "self", "world_sizes": sorted({c.world_size for c in cases})}


def order_cases(cases: list[Case]) -> list[Case]:
    """Group cases by world size and table so each table is built once; resident
    (device) tables first, so pinned step cases find their resident baseline; within
    a table, prefetch off before prefetch on, so prefetch steps find their overlap twin."""
    def key(c: Case):
        return (c.world_size, c.tp, c.etp, c.dp, c.vocab_size, c.dim, c.dtype, c.num_heads,
                c.impl != "device", c.impl, c.kernel, c.cache_rows, c.num_tokens, c.kind,
                c.prefetch, c.case_id)
    return sorted(cases, key=key)


def select_cases(cases: list[Case], patterns: list[str]) -> list[Case]:
    import fnmatch

    if not patterns:
        return cases
    return [c for c in cases if any(fnmatch.fnmatchcase(c.case_id, p) or c.case_id.startswith(p)
                                     for p in patterns)]


def _keep_host_gather_ceiling(rec: dict[str, Any], meta: dict[str, Any], writer) -> None:
    """A host-path record's host-gather ceiling goes into ``meta.json``, once per
    (table bytes, rows, row bytes): ``ceilings["host_gather"]["<table>:<rows>:<row>"]``."""
    ceiling = rec.pop("host_gather_ceiling", None)
    if not isinstance(ceiling, dict):
        return
    ceilings = meta.setdefault("ceilings", {}) or {}
    meta["ceilings"] = ceilings
    table = ceilings.setdefault("host_gather", {})
    key = f"{ceiling['table_bytes']}:{ceiling['rows']}:{ceiling['row_bytes']}"
    if key not in table:
        table[key] = ceiling
        writer.update_meta(ceilings=ceilings)


def table_in_host_memory(impl: str) -> bool | None:
    """The backend's declared capability ``table_in_host_memory`` (None when the
    backend cannot be resolved here)."""
    from .backends import get_backend

    try:
        return bool(get_backend(impl).table_in_host_memory)
    except Exception:  # noqa: BLE001 - an unknown backend: the schema falls back on the impl name
        return None


def derive_record(rec: dict[str, Any], case: Case, meta: dict[str, Any],
                  twins: dict[str, tuple[str, float]]) -> None:
    """The record's derived figures (:func:`ple_bench.record.derive`, the one place they
    are computed), then the record joins ``twins`` if it is a prefetch-off step."""
    from . import record

    rec.setdefault("table_in_host_memory", table_in_host_memory(case.impl))
    record.derive(rec, meta.get("ceilings") or {}, twins)
    if record.is_prefetch_off_twin(rec):
        twins[record.twin_key(rec)] = (rec["case_id"], float(rec["exposed_ms"]))


class _Progress:
    def __init__(self, total: int, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="case", dynamic_ncols=True, file=sys.stderr,
                            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {postfix}")

    def start(self, case_id: str) -> None:
        if self.bar is not None:
            self.bar.set_description_str(case_id[:60])

    def done(self, status: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(status)
            self.bar.update(1)

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_suite(suite, cases: list[Case], policy, options: RunOptions, mode: str) -> RunSummary:
    """Run ``cases`` of ``suite``; everything measured is on disk as it finishes."""
    if options.resume:
        run_dir = Path(options.resume)
        writer = RunWriter(run_dir)
        done = writer.done_case_ids()
        meta = writer.update_meta(status="running", resumed_at=now_iso())
    else:
        run_dir = Path(options.results_dir) / new_run_id(suite.name)
        writer = RunWriter(run_dir)
        done = set()
        meta = base_meta(suite, mode)
        meta.update(run_id=run_dir.name, started_at=now_iso(), status="running", argv=options.argv,
                    timing_policy=_asdict(policy), functional_note=options.functional_note or None,
                    num_cases=len(cases), launch=launch_info(cases))
        meta["launcher"] = meta["launch"]["launcher"]
        writer.write_meta(meta)
    todo = [c for c in order_cases(cases) if c.case_id not in done]
    counts = {"ok": 0, "skipped": 0, "failed": 0, "invalid": 0}
    progress = _Progress(len(todo), options.progress)
    if options.resume and not options.quiet:
        progress.write(f"resuming {run_dir}: {len(done)} cases done, {len(todo)} to run")
    if not options.quiet:
        progress.write(f"run {run_dir.name}: {len(todo)} cases, results in {run_dir}")
    interrupted = False
    executor = _Executor(options, meta, writer)
    from .record import twins_of
    from .results import load_records

    twins = twins_of(load_records(run_dir)) if done else {}  # prefetch-off steps: overlap twins
    try:
        for case in todo:
            progress.start(case.case_id)
            rec = executor.run_case(case, policy)
            _keep_host_gather_ceiling(rec, meta, writer)
            derive_record(rec, case, meta, twins)
            writer.append(rec)
            counts[rec["status"]] += 1
            progress.done(rec["status"])
            if rec["status"] in ("failed", "invalid") and not options.quiet:
                progress.write(f"{rec['status'].upper()} {case.case_id}: {rec['reason']}")
            if executor.abort_reason:
                if not options.quiet:
                    progress.write(f"run ended early: {executor.abort_reason}")
                break
    except KeyboardInterrupt:
        interrupted = True
        progress.write(f"interrupted: everything measured so far is in {run_dir}; "
                       f"continue with --resume {run_dir}")
    finally:
        progress.close()
        try:
            executor.close()
        except KeyboardInterrupt:  # Ctrl-C while the workers shut down: the run still ends as interrupted
            if not interrupted:
                interrupted = True
                print(f"interrupted: everything measured so far is in {run_dir}; "
                      f"continue with --resume {run_dir}", file=sys.stderr)
            executor.close()
    status = "interrupted" if interrupted else "aborted" if executor.abort_reason else "complete"
    extra = {"abort_reason": executor.abort_reason} if executor.abort_reason else {}
    meta = writer.update_meta(ended_at=now_iso(), status=status,
                              ceilings=meta.get("ceilings"), device=meta.get("device"), **extra)
    summary = RunSummary(run_dir=run_dir, counts=counts, interrupted=interrupted,
                         aborted=executor.abort_reason)
    if options.report:
        try:
            from .report import build_report

            summary.report = build_report(run_dir, options.reports_dir)
        except Exception as exc:  # noqa: BLE001 - a report failure must not lose the run
            print(f"warning: report not written: {type(exc).__name__}: {exc}", file=sys.stderr)
        try:
            from .export import write_pytest_benchmark_json

            write_pytest_benchmark_json(run_dir)
        except Exception as exc:  # noqa: BLE001
            print(f"warning: pytest-benchmark JSON not written: {exc}", file=sys.stderr)
    return summary


def _asdict(policy) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(policy)


class _Executor:
    """Finds (or starts) the worker pool for a case's world size and runs it there,
    or runs in-process under torchrun."""

    def __init__(self, options: RunOptions, meta: dict[str, Any], writer: RunWriter):
        self.options = options
        self.meta = meta
        self.writer = writer
        self.pool = None
        from .env import external_world_size

        self.torchrun_world = external_world_size()
        self.inproc = None
        self.agree_group = None
        self.agree_timeout_s = 0.0
        self.abort_reason: str | None = None  # set when a torchrun run cannot go on
        self.recoveries = 0  # process groups rebuilt after a case the ranks left apart

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self.inproc is not None:
            self._close_inprocess()

    def _close_inprocess(self) -> None:
        """Under torchrun: wait for every rank (so that none is torn down while
        rank 0 writes), then leave the process group."""
        import torch.distributed as dist

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

    def _record(self, case: Case, status: str, reason: str = "", result: dict | None = None) -> dict:
        rec: dict[str, Any] = {"case_id": case.case_id, "status": status, "reason": reason,
                               "mode": self.meta.get("mode"), "finished_at": now_iso()}
        rec.update(case.axes())
        rec["world_size"] = case.world_size
        if result:
            rec.update(result)
        return rec

    def _ensure_pool(self, world: int):
        from .worker import WorkerPool

        if self.pool is not None and (self.pool.world != world or not self.pool.alive()):
            self.pool.close()
            self.pool = None
        if self.pool is None:
            self.pool = WorkerPool(world)
            self._measure_ceilings(world)
        return self.pool

    def _measure_ceilings(self, world: int) -> None:
        ceilings = self.meta.get("ceilings") or {}
        need_single = not ceilings
        need_world = world > 1 and f"allreduce_busbw_gbps_w{world}" not in ceilings
        if not (need_single or need_world):
            return
        reply = self.pool.request(("ceilings",), timeout_s=300)
        if reply[0] == "ok":
            found = dict(reply[1].get("ceilings") or {})
            if not need_single:
                found = {k: v for k, v in found.items() if k.startswith("allreduce")}
            ceilings.update(found)
            self.meta["ceilings"] = ceilings
            if reply[1].get("device") and not self.meta.get("device"):
                self.meta["device"] = reply[1]["device"]
            self.writer.update_meta(ceilings=ceilings, device=self.meta.get("device"))
        else:
            print(f"warning: ceilings not measured: {reply[1]}", file=sys.stderr)

    def run_case(self, case: Case, policy) -> dict[str, Any]:
        from .worker import WorkerError, policy_dict

        world = case.world_size
        if self.torchrun_world is not None:
            return self._run_inprocess(case, policy)
        gpus = gpu_count()
        if gpus and world > gpus:
            return self._record(case, "skipped", f"needs {world} GPUs, this machine has {gpus}")
        try:
            pool = self._ensure_pool(world)
        except (WorkerError, TimeoutError, OSError) as exc:
            self.close()
            return self._record(case, "failed", f"could not start {world} worker(s): {exc}")
        options = {"nvtx": self.options.nvtx, "profile_window": self.options.profile_window}
        if self.options.torch_trace:
            options["torch_trace"] = {"max_samples": self.options.torch_trace,
                                      "path": str(self.writer.run_dir / torch_trace_name(case.case_id))}
        started = time.perf_counter()
        try:
            reply = pool.request(("case", case.axes(), policy_dict(policy), options),
                                 timeout_s=self.options.case_timeout_s)
        except TimeoutError as exc:
            self.close()
            return self._record(case, "failed", f"timed out: {exc}; its workers were stopped")
        except (BrokenPipeError, EOFError, OSError) as exc:  # a worker that died after its last case
            self.close()
            return self._record(case, "failed", f"its worker was gone before the case started ({exc}); "
                                                "the workers were restarted")
        duration = time.perf_counter() - started
        status = reply[0]
        if status == "ok":
            rec = self._record(case, "ok", "", reply[1])
        elif status == "skip":
            rec = self._record(case, "skipped", reply[1])
        elif status == "invalid":
            rec = self._record(case, "invalid", reply[1])
        else:
            rec = self._record(case, "failed", reply[1])
            rec["traceback"] = reply[2] if len(reply) > 2 else ""
            # a failed case may have left its worker poisoned (a sticky CUDA error) or other
            # ranks stuck in a collective: the next case starts in fresh workers
            self.close()
        rec["duration_s"] = round(duration, 3)
        return rec

    # ------------------------------------------------------------ under torchrun
    def _start_inprocess(self) -> None:
        """First case of torchrun's world size: join the process group, make the
        agreement group, and measure the ceilings (rank 0) and the all-reduce
        ceiling (every rank)."""
        import datetime

        import torch
        import torch.distributed as dist

        from .executor import CaseExecutor
        from .parallel import DEFAULT_TIMEOUT_S, init_distributed

        world = self.torchrun_world
        rank = int(os.environ.get("RANK", "0"))
        from .env import device_for

        device = device_for(rank, local_rank=int(os.environ.get("LOCAL_RANK", "0")))
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if world > 1:
            init_distributed("gloo" if device.type == "cpu" else None)
            # Outcomes are agreed on in a group of their own (gloo, CPU objects), so that an
            # agreement can never pair with a collective a failed case left behind.  Its
            # timeout is longer than a collective's: a rank that failed early waits here
            # while the others time out of the case's collectives.
            self.agree_timeout_s = max(self.options.case_timeout_s, 2 * DEFAULT_TIMEOUT_S + 30)
            self.agree_group = dist.new_group(backend="gloo",
                                              timeout=datetime.timedelta(seconds=self.agree_timeout_s))
        self.inproc = CaseExecutor(rank=rank, world_size=world, device=device)
        info: dict[str, Any] = {"rank": rank, "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
                                "host": socket.gethostname(), "device": str(device)}
        if rank == 0:
            from .measure import device_info, measure_ceilings

            if not self.meta.get("ceilings"):
                try:
                    self.meta["ceilings"] = measure_ceilings(device)
                except Exception as exc:  # noqa: BLE001 - a run without ceilings is still a run
                    print(f"warning: ceilings not measured: {type(exc).__name__}: {exc}", file=sys.stderr)
                    self.meta["ceilings"] = {}
            if not self.meta.get("device"):
                self.meta["device"] = device_info(device)
            info["need_allreduce"] = f"allreduce_busbw_gbps_w{world}" not in (self.meta.get("ceilings") or {})
        if world > 1:
            everyone: list = [None] * world
            dist.all_gather_object(everyone, info, group=self.agree_group)  # also waits for rank 0's ceilings
            if everyone[0].get("need_allreduce"):
                from .worker import _allreduce_busbw

                found = _allreduce_busbw(device, world)
                if rank == 0:
                    self.meta.setdefault("ceilings", {}).update(found)
            ranks = [{k: v for k, v in e.items() if k != "need_allreduce"} for e in everyone]
        else:
            ranks = [{k: v for k, v in info.items() if k != "need_allreduce"}]
        if rank == 0:
            self.meta["ranks"] = ranks
            self.writer.update_meta(ceilings=self.meta.get("ceilings"), device=self.meta.get("device"),
                                    ranks=ranks)

    def _run_inprocess(self, case: Case, policy) -> dict[str, Any]:
        """Under torchrun: this process is one rank; every rank runs the same cases
        in lockstep and agrees on each case's outcome before the next one."""
        from .executor import InvalidCase, SkipCase

        if case.world_size != self.torchrun_world:
            return self._record(case, "skipped",
                                f"needs {case.world_size} ranks, torchrun started {self.torchrun_world}")
        if self.inproc is None:
            self._start_inprocess()
        started = time.perf_counter()
        try:
            rec = self._record(case, "ok", "", self._traced_run(case, policy))
        except SkipCase as exc:
            rec = self._record(case, "skipped", str(exc))
        except InvalidCase as exc:
            rec = self._record(case, "invalid", str(exc))
        except Exception as exc:  # noqa: BLE001
            rec = self._record(case, "failed", f"{type(exc).__name__}: {exc}")
            rec["traceback"] = traceback.format_exc()
        if self.torchrun_world > 1:
            rec = self._agree(case, rec)
        rec["duration_s"] = round(time.perf_counter() - started, 3)
        return rec

    def _traced_run(self, case: Case, policy) -> dict[str, Any]:
        """``self.inproc.run``, under ``run --torch-trace`` recording the case's windows into
        its run folder (the CLI refuses it under torchrun, whose other ranks write to scratch)."""
        from .measure.profiler import torch_trace_case

        n = self.options.torch_trace
        path = self.writer.run_dir / torch_trace_name(case.case_id, self.inproc.rank) if n else None
        with torch_trace_case(path, n):
            return self.inproc.run(case, policy)

    def _agree(self, case: Case, rec: dict[str, Any]) -> dict[str, Any]:
        """Every rank tells every other how the case ended.  All ok: rank 0's record
        stands.  Otherwise the case is ``failed`` (any rank failed), else ``invalid``,
        else ``skipped``, with each rank's reason (root causes before the collective
        timeouts they led to); the ranks then drop the table and its process groups,
        check the default group, and end the run if it is broken."""
        import torch.distributed as dist

        world = self.torchrun_world
        mine = {"rank": self.inproc.rank, "case_id": case.case_id, "status": rec["status"],
                "reason": rec["reason"], "traceback": rec.get("traceback") or ""}
        everyone: list = [None] * world
        try:
            dist.all_gather_object(everyone, mine, group=self.agree_group)
        except Exception as exc:  # noqa: BLE001
            self.abort_reason = (f"the ranks could not agree on the outcome of {case.case_id} within "
                                 f"{self.agree_timeout_s:.0f} s ({type(exc).__name__}: {exc}): a rank died or "
                                 "hung; ending the run")
            out = self._record(case, "failed", f"rank {mine['rank']} {mine['status']}: {mine['reason']}; "
                                               + self.abort_reason)
            out["traceback"] = mine["traceback"]
            return out
        where = {e["case_id"] for e in everyone}
        if len(where) > 1:
            self.abort_reason = ("the ranks are at different cases (" + ", ".join(
                f"rank {e['rank']}: {e['case_id']}" for e in everyone) + "): they do not run the same case "
                "list (same suite, --case and --resume on every rank?); ending the run")
            return self._record(case, "failed", self.abort_reason)
        statuses = [e["status"] for e in everyone]
        if all(s == "ok" for s in statuses):
            return rec
        uniform = len(set(statuses)) == 1 and len({e["reason"] for e in everyone}) == 1
        if uniform and statuses[0] != "failed":
            return rec  # the same skip / wrong result everywhere: the ranks stayed in step
        status = "failed" if "failed" in statuses else "invalid" if "invalid" in statuses else "skipped"
        bad = sorted((e for e in everyone if e["status"] != "ok"),
                     key=lambda e: (_is_collective_error(e["reason"]), e["rank"]))
        reason = "; ".join(f"rank {e['rank']} {e['status']}: {e['reason']}" for e in bad)
        out = self._record(case, status, reason)
        out["rank_outcomes"] = [{k: e[k] for k in ("rank", "status", "reason")} for e in everyone]
        out["traceback"] = next((e["traceback"] for e in bad if e["traceback"]), "")
        self._recover(case)
        return out

    def _recover(self, case: Case) -> None:
        """After a case the ranks left at different points.  Collectives may be
        pending in any of its groups, the default one included (a late message
        meeting a different collective aborts a gloo process), so every group is
        rebuilt: drop the table, leave all groups, join a fresh default group over
        torchrun's store (its own key prefix), and check it with an all-reduce.
        If that fails anywhere, the run ends with a clear message."""
        import datetime

        import torch
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        from .parallel import DEFAULT_TIMEOUT_S

        world, rank = self.torchrun_world, self.inproc.rank
        self.inproc.release_table()
        self.inproc.groups_by_topology.clear()
        self.inproc.resident_step_ms.clear()
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


def torch_trace_name(case_id: str, rank: int = 0) -> str:
    """The file name of a case's torch.profiler trace in its run folder (``run --torch-trace``)."""
    safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in case_id)
    return f"trace_{safe}.json" if rank == 0 else f"trace_{safe}.rank{rank}.json"


def _is_collective_error(reason: str) -> bool:
    """A failure that is the consequence of another rank's (a collective that timed
    out or lost its peer), as opposed to a root cause."""
    text = reason.lower()
    return reason.startswith(("DistBackendError", "DistNetworkError", "DistError", "DistStoreError")) or any(
        m in text for m in ("timed out", "timeout", "connection closed", "connection reset"))

