"""``profile``: one case under ncu or nsys (its measurement window only), or torch.profiler."""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ..env import gpu_available
from ..results import ensure_writable_dir
from . import EXIT_BAD_USAGE, UsageError


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("profile", help="run one case under ncu or nsys with NVTX ranges, or torch.profiler")
    p.add_argument("--suite", required=True)
    p.add_argument("--case", required=True, help="case_id (or unique prefix/glob)")
    p.add_argument("--tool", choices=["ncu", "nsys", "torch"], default="ncu",
                   help="torch: a torch.profiler (Kineto) trace, Chrome / Perfetto JSON in the run folder")
    p.add_argument("--out", help="output folder (default results/profiles/<case_id>; "
                                 "torch: the results folder, default --results-dir)")
    p.add_argument("--results-dir", default="results")
    p.add_argument("--samples", type=int, default=10, help="samples per measurement under the profiler")
    p.add_argument("--metrics", metavar="LIST",
                   help="ncu only: collect just these comma-separated metrics (e.g. gpu__time_duration.sum): "
                        "one pass per kernel instead of the default sections")
    p.add_argument("--cache-control", choices=["all", "none"],
                   help="ncu only: 'all' (ncu's default) flushes the GPU caches before every profiled kernel, "
                        "'none' profiles it warm")
    p.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    p.set_defaults(func=main)
    return p


NSYS_DOC = "https://docs.nvidia.com/nsight-systems/UserGuide/"


def profile_command(tool: str, suite: str, case_id: str, out: Path, python: str = sys.executable,
                    samples: int = 10, metrics: str | None = None,
                    cache_control: str | None = None) -> list[str]:
    """The profiler command line for one case, limited to the measurement window.

    ``metrics`` (ncu only): collect just these comma-separated metrics, one pass
    per kernel instead of the default sections' replays (e.g.
    ``gpu__time_duration.sum`` for kernel durations, minutes faster).

    ``torch``: no external tool -- ``run --torch-trace`` records the first
    ``samples`` samples of every measurement phase with torch.profiler into
    ``<out>/<run_id>/trace_<case_id>.json`` (``out`` is the results folder)."""
    if (metrics or cache_control) and tool != "ncu":
        raise UsageError(f"--metrics and --cache-control are ncu options, not ones of {tool}")
    if tool == "torch":
        return [python, "-m", "ple_bench", "run", "--suite", suite, "--case", case_id,
                "--torch-trace", str(samples), "--samples", str(samples), "--no-report", "--no-progress",
                "--results-dir", str(out)]
    inner = [python, "-m", "ple_bench", "run", "--suite", suite, "--case", case_id, "--profile-window",
             "--samples", str(samples), "--no-report", "--no-progress", "--results-dir", str(out / "results")]
    if tool == "ncu":
        chosen = ["--metrics", metrics] if metrics else []
        if cache_control:
            chosen += ["--cache-control", cache_control]
        return ["ncu", "--clock-control", "none", "--nvtx", "--nvtx-include", "ple_bench@measurement/", *chosen,
                "--profile-from-start", "off", "--target-processes", "all",
                "--export", str(out / "profile"), "--force-overwrite", *inner]
    if tool == "nsys":
        return ["nsys", "profile", "--trace", "cuda,nvtx,osrt", "--capture-range", "cudaProfilerApi",
                "--capture-range-end", "stop", "--output", str(out / "profile"), "--force-overwrite", "true",
                *inner]
    raise UsageError(f"unknown profiler {tool!r}: use ncu, nsys or torch")


def main(args: argparse.Namespace) -> int:
    # the engine and torch: only the verbs that measure load them (see commands/__init__.py)
    from ..measure.profiler import torch_trace_name
    from ..run.loop import select_cases
    from ..spec.suite import SuiteError, load_suite
    if args.samples < 1:
        print(f"error: --samples {args.samples}: take at least 1 sample per measurement", file=sys.stderr)
        return EXIT_BAD_USAGE
    try:
        suite = load_suite(args.suite)
    except SuiteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_USAGE
    matches = select_cases(suite.cases, [args.case], baselines=False)
    if len(matches) != 1:
        ids = ", ".join(c.case_id for c in matches[:5]) or "none"
        print(f"error: --case must match exactly one case of '{suite.name}', matched {len(matches)}: {ids}",
              file=sys.stderr)
        return EXIT_BAD_USAGE
    case = matches[0]
    if args.tool == "torch":  # a run folder of its own under the results folder
        out = Path(args.out) if args.out else Path(args.results_dir)
    else:
        out = Path(args.out) if args.out else Path(args.results_dir) / "profiles" / case.case_id
    try:
        cmd = profile_command(args.tool, str(suite.path), case.case_id, out, samples=args.samples,
                              metrics=args.metrics, cache_control=args.cache_control)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_USAGE
    print("command: " + shlex.join(cmd))
    if args.tool == "torch":
        print(f"trace:   {out}/<run_id>/{torch_trace_name(case.case_id)} (torch.profiler, CPU"
              + (" + CUDA" if gpu_available() else "") + f" activity, the first {args.samples} samples of every "
              "measurement phase)")
        if args.dry_run:
            return 0
        return _profile_torch(cmd, out, case.case_id)
    if args.dry_run:
        return 0
    if shutil.which(cmd[0]) is None:
        print(f"error: {cmd[0]} is not on PATH (try --dry-run to see the command)", file=sys.stderr)
        return EXIT_BAD_USAGE

    ensure_writable_dir(out, "--out")
    rc = _call(cmd)
    ext = ".ncu-rep" if args.tool == "ncu" else ".nsys-rep"
    print(f"profile: {out / ('profile' + ext)} (exit {rc})")
    return rc


def _call(cmd: list[str]) -> int:
    """Run the profiler's command; on Ctrl-C (which the child, in the same process group, gets
    too) let it end cleanly -- its run keeps its records -- before the interrupt goes on."""
    proc = subprocess.Popen(cmd)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        try:
            proc.wait(timeout=60)
        except (KeyboardInterrupt, subprocess.TimeoutExpired):
            proc.kill()
        raise


def _profile_torch(cmd: list[str], out: Path, case_id: str) -> int:
    """Run ``run --torch-trace`` and point at the trace it wrote in its new run folder."""
    # the engine and torch: only the verbs that measure load them (see commands/__init__.py)
    from ..measure.profiler import torch_trace_name
    started = time.time()
    rc = _call(cmd)
    name = torch_trace_name(case_id)
    found = [p for p in out.glob(f"*/{name}") if p.stat().st_mtime >= started - 1]
    if not found:
        print(f"error: no trace written (exit {rc}): the case recorded no measurement phase "
              f"(skipped or failed? see records.jsonl of the newest run folder in {out})", file=sys.stderr)
        return rc or 1
    trace = max(found, key=lambda p: p.stat().st_mtime)
    size = trace.stat().st_size
    print(f"trace: {trace} ({size / 1e6:.2f} MB, exit {rc})")
    print("open it in https://ui.perfetto.dev (Open trace file) or chrome://tracing (Load); "
          "the phases are named ranges on the Python thread, kernels and copies on their CUDA streams")
    return rc
