"""Where a worker process runs, read from Linux's ``/proc`` and ``/sys`` (no GPU needed): the core
its main thread last ran on, the cores each of its threads last ran on, the cores it may use,
that core's clock where the kernel exposes it, and the transparent huge pages behind its
anonymous memory.  A repeated case (:mod:`ple_bench.run.replicate`) keeps these beside every
round's figures, so that a difference between processes can be held against where they ran."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any


def _last_cpu(stat_text: str) -> int | None:
    """Field 39 of a ``/proc/<pid>/stat`` line (the CPU the task last ran on); the command name in
    field 2 may hold spaces, so the fields are counted after its closing parenthesis."""
    try:
        rest = stat_text.rsplit(")", 1)[1].split()
        return int(rest[36])  # fields 3.. follow the name: field 39 is rest[36]
    except (IndexError, ValueError):
        return None


def current_cpu() -> int | None:
    """The core this thread runs on now (glibc's ``sched_getcpu``), else its last from /proc."""
    try:
        cpu = ctypes.CDLL(None, use_errno=True).sched_getcpu()
        if cpu >= 0:
            return int(cpu)
    except (OSError, AttributeError):
        pass
    try:
        return _last_cpu(Path("/proc/thread-self/stat").read_text())
    except OSError:
        return None


def thread_cpus() -> list[int]:
    """The core each thread of this process last ran on (sorted; threads that vanished while read
    are left out)."""
    out = []
    for task in Path("/proc/self/task").glob("*"):
        try:
            cpu = _last_cpu((task / "stat").read_text())
        except OSError:
            continue
        if cpu is not None:
            out.append(cpu)
    return sorted(out)


def cpu_khz(cpu: int | None) -> int | None:
    """The core's current clock in kHz where cpufreq exposes it (often not in a VM)."""
    if cpu is None:
        return None
    try:
        return int(Path(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq").read_text().strip())
    except (OSError, ValueError):
        return None


def anon_huge_bytes() -> int | None:
    """Bytes of this process's anonymous memory on transparent huge pages (``smaps_rollup``)."""
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def process_facts() -> dict[str, Any]:
    """Where this process runs now: see the module doc (values None where Linux does not say)."""
    cpu = current_cpu()
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = None
    return {"pid": os.getpid(), "cpu": cpu, "cpus_allowed": allowed, "cpu_khz": cpu_khz(cpu),
            "thread_cpus": thread_cpus(), "anon_huge_bytes": anon_huge_bytes()}


__all__ = ["process_facts", "current_cpu", "thread_cpus", "anon_huge_bytes", "cpu_khz"]
