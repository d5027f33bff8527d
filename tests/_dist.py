"""Run a function on N ranks of a gloo process group, each rank in its own
Python process, for the multi-rank tests.

``run_ranks("tests.test_parallel:_rank_main", world_size, args={...})`` starts
``world_size`` subprocesses (``python -m tests._dist``), each initialises the
default group from a file store (no TCP port to pick, so parallel test runs do
not collide), calls ``fn(rank, world_size, **args)`` and writes its JSON result.
The parent waits with a deadline: a rank that fails kills its peers (they would
otherwise wait in a collective) and a run past the deadline is killed; both
raise :class:`RankFailure` with every rank's stderr tail, so a hang fails the
test instead of stalling it.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent


class RankFailure(AssertionError):
    """A rank raised, exited non-zero, or the run exceeded its deadline."""


def _tail(path: Path, limit: int = 3000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "<no output>"
    return text[-limit:]


def run_ranks(
    target: str,
    world_size: int,
    *,
    args: dict[str, Any] | None = None,
    timeout_s: float = 120.0,
    collective_timeout_s: float = 60.0,
) -> list[Any]:
    """Run ``target`` ("module:function") on ``world_size`` gloo ranks and
    return the ranks' results (JSON round-tripped), in rank order."""
    args = args or {}
    with tempfile.TemporaryDirectory(prefix="ple_dist_") as tmp:
        tmpdir = Path(tmp)
        spec = {
            "target": target,
            "world_size": world_size,
            "args": args,
            "store": str(tmpdir / "store"),
            "collective_timeout_s": collective_timeout_s,
        }
        (tmpdir / "spec.json").write_text(json.dumps(spec))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        env.setdefault("OMP_NUM_THREADS", "1")
        procs: list[subprocess.Popen] = []
        logs = []
        try:
            for rank in range(world_size):
                log = open(tmpdir / f"rank{rank}.log", "wb")
                logs.append(log)
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "tests._dist", str(tmpdir), str(rank)],
                        cwd=str(REPO_ROOT), env=env, stdout=log, stderr=subprocess.STDOUT,
                    )
                )
            deadline = time.monotonic() + timeout_s
            failure = None
            while True:
                codes = [p.poll() for p in procs]
                bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
                if bad:
                    failure = f"rank(s) {bad} exited with {[codes[r] for r in bad]}"
                    break
                if all(c == 0 for c in codes):
                    break
                if time.monotonic() > deadline:
                    stuck = [r for r, c in enumerate(codes) if c is None]
                    failure = f"timed out after {timeout_s:.0f}s (rank(s) {stuck} still running: hang?)"
                    break
                time.sleep(0.05)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait()
            for log in logs:
                log.close()
        if failure is not None:
            details = "\n".join(
                f"--- rank {r} (exit {procs[r].returncode}) ---\n{_tail(tmpdir / f'rank{r}.log')}"
                for r in range(world_size)
            )
            raise RankFailure(f"{target} on {world_size} ranks: {failure}\n{details}")
        return [json.loads((tmpdir / f"rank{r}.json").read_text()) for r in range(world_size)]


def _child(tmpdir: str, rank: int) -> None:
    import datetime

    import torch.distributed as dist

    spec = json.loads((Path(tmpdir) / "spec.json").read_text())
    world = spec["world_size"]
    dist.init_process_group(
        "gloo",
        init_method=f"file://{spec['store']}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=spec["collective_timeout_s"]),
    )
    try:
        module_name, _, fn_name = spec["target"].partition(":")
        fn = getattr(importlib.import_module(module_name), fn_name)
        result = fn(rank, world, **spec["args"])
        (Path(tmpdir) / f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]))
