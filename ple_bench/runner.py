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
    functional_note: str = ""
    argv: list[str] = field(default_factory=list)


@dataclass
class RunSummary:
    run_dir: Path
    counts: dict[str, int]
    interrupted: bool = False
    report: Path | None = None

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        return 1 if self.counts.get("failed", 0) or self.counts.get("invalid", 0) else 0


def gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        return 0


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


def order_cases(cases: list[Case]) -> list[Case]:
    """Group cases by world size and table so each table is built once; resident
    (device) tables first, so pinned step cases find their resident baseline."""
    def key(c: Case):
        return (c.world_size, c.tp, c.etp, c.dp, c.vocab_size, c.dim, c.dtype, c.num_heads,
                c.impl != "device", c.impl, c.kernel, c.cache_rows, c.num_tokens, c.kind,
                c.case_id)
    return sorted(cases, key=key)


def select_cases(cases: list[Case], patterns: list[str]) -> list[Case]:
    import fnmatch

    if not patterns:
        return cases
    return [c for c in cases if any(fnmatch.fnmatchcase(c.case_id, p) or c.case_id.startswith(p)
                                     for p in patterns)]


def derive_metrics(rec: dict[str, Any], case: Case, ceilings: dict[str, Any], mode: str) -> None:
    """GB/s, rows/s and the share of the ceiling that binds this case."""
    median = rec.get("median_ms")
    rows = rec.get("rows")
    nbytes = rec.get("bytes_moved")
    if median and median > 0 and rows:
        rec["rows_per_s"] = rows / (median / 1e3)
        rec["gbps"] = nbytes / (median * 1e6)
    if mode != "gpu":
        name = "host_memcpy_gbps"
    elif case.impl == "device" or case.impl.startswith("device"):
        name = "d2d_gbps"  # the table is in HBM
    else:
        name = "h2d_gbps"  # the table is in host memory: PCIe binds
    ceiling = ceilings.get(name)
    rec["ceiling"] = name
    rec["ceiling_gbps"] = ceiling
    if ceiling and rec.get("gbps"):
        rec["pct_of_ceiling"] = 100.0 * rec["gbps"] / ceiling
    rr = ceilings.get("pinned_random_row_gbps") if name == "h2d_gbps" else ceilings.get(
        "device_random_row_gbps")
    if rr and rec.get("gbps"):
        rec["pct_of_random_row_ceiling"] = 100.0 * rec["gbps"] / rr


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
                    num_cases=len(cases))
        writer.write_meta(meta)
    todo = [c for c in order_cases(cases) if c.case_id not in done]
    counts = {"ok": 0, "skipped": 0, "failed": 0, "invalid": 0}
    progress = _Progress(len(todo), options.progress)
    if options.resume:
        progress.write(f"resuming {run_dir}: {len(done)} cases done, {len(todo)} to run")
    progress.write(f"run {run_dir.name}: {len(todo)} cases, results in {run_dir}")
    interrupted = False
    executor = _Executor(options, meta, writer)
    try:
        for case in todo:
            progress.start(case.case_id)
            rec = executor.run_case(case, policy)
            derive_metrics(rec, case, meta.get("ceilings") or {}, mode)
            writer.append(rec)
            counts[rec["status"]] += 1
            progress.done(rec["status"])
            if rec["status"] in ("failed", "invalid"):
                progress.write(f"{rec['status'].upper()} {case.case_id}: {rec['reason']}")
    except KeyboardInterrupt:
        interrupted = True
        progress.write(f"interrupted: everything measured so far is in {run_dir}; "
                       f"continue with --resume {run_dir}")
    finally:
        progress.close()
        executor.close()
    meta = writer.update_meta(ended_at=now_iso(), status="interrupted" if interrupted else "complete",
                              ceilings=meta.get("ceilings"), device=meta.get("device"))
    summary = RunSummary(run_dir=run_dir, counts=counts, interrupted=interrupted)
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
        self.torchrun_world = int(os.environ.get("WORLD_SIZE", "1")) if "TORCHELASTIC_RUN_ID" in os.environ \
            or os.environ.get("PLE_BENCH_IN_PROCESS") else None
        self.inproc = None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

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
        started = time.perf_counter()
        try:
            reply = pool.request(("case", case.axes(), policy_dict(policy), options),
                                 timeout_s=self.options.case_timeout_s)
        except TimeoutError as exc:
            self.close()
            return self._record(case, "failed", f"timed out: {exc}; its workers were stopped")
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
            if world > 1 or not pool.alive():
                self.close()  # the others may be stuck in a collective: start afresh
        rec["duration_s"] = round(duration, 3)
        return rec

    def _run_inprocess(self, case: Case, policy) -> dict[str, Any]:
        """Under torchrun: this process is one rank; every rank runs the same cases."""
        from .executor import CaseExecutor, InvalidCase, SkipCase

        if case.world_size != self.torchrun_world:
            return self._record(case, "skipped",
                                f"needs {case.world_size} ranks, torchrun started {self.torchrun_world}")
        if self.inproc is None:
            import torch

            from .parallel import init_distributed

            rank = int(os.environ.get("RANK", "0"))
            device = torch.device("cpu")
            if torch.cuda.is_available():
                device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
                torch.cuda.set_device(device)
            if self.torchrun_world > 1:
                init_distributed()
            self.inproc = CaseExecutor(rank=rank, world_size=self.torchrun_world, device=device)
            if not self.meta.get("ceilings"):
                from .measure import device_info, measure_ceilings

                self.meta["ceilings"] = measure_ceilings(device) if rank == 0 else {}
                self.meta["device"] = device_info(device)
                if rank == 0:
                    self.writer.update_meta(ceilings=self.meta["ceilings"], device=self.meta["device"])
        started = time.perf_counter()
        try:
            rec = self._record(case, "ok", "", self.inproc.run(case, policy))
        except SkipCase as exc:
            rec = self._record(case, "skipped", str(exc))
        except InvalidCase as exc:
            rec = self._record(case, "invalid", str(exc))
        except Exception as exc:  # noqa: BLE001
            rec = self._record(case, "failed", f"{type(exc).__name__}: {exc}")
            rec["traceback"] = traceback.format_exc()
        rec["duration_s"] = round(time.perf_counter() - started, 3)
        return rec
