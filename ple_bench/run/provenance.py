"""The run's provenance: ``meta.json``, what a run was and where it ran.

:func:`start_meta` assembles a new run's ``meta.json`` (suite, mode and timer, versions, git commit,
host, GPUs, how the ranks were launched, the timing policy, the command line), :func:`resume_meta`
reopens it, :func:`finish_meta` closes it (status, end time, abort reason).  While the run goes on,
facts measured on the ranks are added to the same file as they become known, through
:func:`add_measured`: the physical ceilings and the device (called by ``dispatch`` for ple_bench's
own workers, by ``run.torchrun`` under torchrun, which also adds every rank), and the per-case
ceilings of each case -- host-gather, random-row (:func:`keep_case_ceilings`, from the case's
``CaseResult``, called by the suite loop).  The run holds its meta as one
:class:`~ple_bench.run_meta.RunMeta` (what the readers load too), changed here only."""

from __future__ import annotations

import dataclasses
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

import torch

from .. import env
from ..results import RunWriter, expected_case_ids, load_records, not_reached, now_iso
from ..run_meta import RunMeta
from ..spec.case import Case

REPO_ROOT = Path(__file__).resolve().parents[2]


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
    try:
        import triton  # its version, where installed

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
        "gpu_count": env.gpu_count(),
    }


def launch_info(cases: list[Case]) -> dict[str, Any]:
    """How the ranks were started: ``torchrun`` (its world, nodes and run id) or
    ``self`` (ple_bench's own worker processes, one pool per world size)."""
    if env.launcher() != "self":
        environ = os.environ
        return {"launcher": env.launcher(),
                "world_size": int(environ.get("WORLD_SIZE", "1")),
                "local_world_size": int(environ.get("LOCAL_WORLD_SIZE", environ.get("WORLD_SIZE", "1"))),
                "nnodes": int(environ["GROUP_WORLD_SIZE"]) if environ.get("GROUP_WORLD_SIZE") else None,
                "rdzv_run_id": environ.get("TORCHELASTIC_RUN_ID"),
                "master": (f"{environ.get('MASTER_ADDR')}:{environ.get('MASTER_PORT')}"
                           if environ.get("MASTER_ADDR") else None)}
    return {"launcher": "self", "world_sizes": sorted({c.world_size for c in cases})}


def start_meta(suite, mode: str, run_dir: Path, writer: RunWriter, *, argv: list[str], policy,
               functional_note: str, cases: list[Case]) -> RunMeta:
    """A new run's ``meta.json``, written; returns the :class:`RunMeta` the run keeps adding to."""
    meta = base_meta(suite, mode)
    meta.update(run_id=run_dir.name, started_at=now_iso(), status="running", argv=argv,
                timing_policy=dataclasses.asdict(policy), functional_note=functional_note or None,
                num_cases=len(cases), expected_cases=expected_cases(suite, cases), launch=launch_info(cases))
    meta["launcher"] = meta["launch"]["launcher"]
    writer.write_meta(meta)
    return RunMeta(meta)


def expected_cases(suite, cases: list[Case]) -> dict[str, list[str]]:
    """The cases the run is to record, by the suite group that produced them (``meta.json``:
    ``expected_cases``), so a report can name the cases a run did not reach."""
    group_of = {cid: g.name for g in getattr(suite, "groups", []) for cid in g.case_ids}
    out: dict[str, list[str]] = {}
    for case in cases:
        out.setdefault(group_of.get(case.case_id, "(no group)"), []).append(case.case_id)
    return out


def resume_meta(writer: RunWriter) -> RunMeta:
    """A resumed run's ``meta.json``, marked running again."""
    return RunMeta(writer.update_meta(status="running", resumed_at=now_iso()))


def finish_meta(writer: RunWriter, meta: RunMeta, status: str, abort_reason: str | None) -> RunMeta:
    """The run's end: its status (complete, interrupted, aborted), when, and what was measured."""
    extra = {"abort_reason": abort_reason} if abort_reason else {}
    recorded = {r["case_id"] for r in load_records(writer.run_dir, upgrade=False)}
    missing = not_reached(meta, recorded)  # meta: the run's from its start (a resumed run: as stored)
    if missing is not None:
        extra.update(cases_recorded=len(set(expected_case_ids(meta)) & recorded),
                     not_reached=missing)
    return RunMeta(writer.update_meta(ended_at=now_iso(), status=status,
                                      ceilings=meta.get("ceilings"), device=meta.get("device"), **extra))


def note(writer: RunWriter, meta: RunMeta, **fields: Any) -> dict[str, Any]:
    """Facts the run loop settles while it runs (which cases are repeated and how, the compute
    profile it started from), merged into ``meta`` and written to ``meta.json``."""
    meta.update(**fields)
    return writer.update_meta(**fields)


def add_measured(writer: RunWriter, meta: RunMeta, *, ceilings: dict[str, Any] | None = None,
                 device: Any = None, ranks: list[dict[str, Any]] | None = None) -> RunMeta:
    """Facts measured on the ranks while the run goes on, merged into ``meta`` and written to
    ``meta.json``: physical ceilings (merged into those already known), the device (kept once
    known), every rank (under torchrun).  The dispatcher and the torchrun protocol call this; no
    module but this one writes ``meta.json``."""
    fields: dict[str, Any] = {}
    if ceilings:
        fields["ceilings"] = meta.merge_ceilings(ceilings)
    if meta.keep_device(device):
        fields["device"] = device
    if ranks is not None:
        meta.update(ranks=ranks)
        fields["ranks"] = ranks
    if fields:
        writer.update_meta(**fields)
    return meta


def keep_case_ceilings(result, meta: RunMeta, writer) -> None:
    """A case's per-case ceilings (its :class:`~ple_bench.record.CaseResult`'s entries) go into
    ``meta.json``, once per key: a host path's host-gather ceiling per (table bytes, rows, row
    bytes), ``ceilings["host_gather"]["<table>:<rows>:<row>"]``, and a lookup's random-row
    ceiling, ``ceilings["random_row"][<its key>]`` (:func:`ple_bench.measure.ceilings.random_row_key`)."""
    found = []
    ceiling = result.host_gather_ceiling
    if isinstance(ceiling, dict):
        key = f"{ceiling['table_bytes']}:{ceiling['rows']}:{ceiling['row_bytes']}"
        if ceiling.get("ids", "uniform") != "uniform":
            key += f":{ceiling['ids']}"
        found.append(("host_gather", key, ceiling))
    for ceiling in result.random_row_ceilings:
        if isinstance(ceiling, dict):
            found.append(("random_row", str(ceiling["key"]), ceiling))
    if not found:
        return
    changed = [meta.add_case_ceiling(name, key, value) for name, key, value in found]
    if any(changed):
        writer.update_meta(ceilings=meta.get("ceilings"))
