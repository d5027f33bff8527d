"""Command line: ``python -m ple_bench {run,list,report,compare,profile,advise,env}``.

Exit codes: 0 success; 1 a case failed or was invalid (run) / a regression
(compare); 2 bad usage or a bad suite; 130 interrupted (results kept)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

# Verbs that measure (run, profile, env) import the engine -- and so torch, seconds of start-up --
# inside their functions, and so does list (a suite's validators read spec -> workload, backends).
# report, compare and schema read stored records and never load torch (tests/test_cli_imports.py).
from . import env
from .advise.answer import add_advise_args, run_advise
from .env import FORCE_CPU_ENV, force_cpu, gpu_available, gpu_count
from .report.export import write_exports
from .record import markdown
from .report import add_report_args, build_report, run_report
from .report.compare import add_compare_args, run_compare
from .results import RunFileError, ensure_writable_dir, expected_case_ids, load_meta
from .spec.listing import case_json, format_cases, format_cases_narrow

EXIT_BAD_USAGE = 2
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    pass


def _has_gpu() -> bool:
    return gpu_available()


# ------------------------------------------------------------------ run
def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", help="suite name (suites/<name>.toml) or path (default: default; "
                                   "with --resume: the run's own suite)")
    p.add_argument("--case", action="append", default=[], metavar="ID",
                   help="run only cases whose case_id matches this glob or prefix (repeatable)")
    p.add_argument("--results-dir", default="results", type=Path, help="where run folders go (default: results/)")
    p.add_argument("--reports-dir", default="reports", type=Path, help="where HTML reports go (default: reports/)")
    p.add_argument("--resume", type=Path, metavar="RUN_DIR", help="run only the cases missing from RUN_DIR")
    p.add_argument("--calibration", type=Path, metavar="FILE",
                   help="start with the compute calibrations of FILE (an earlier run's calibration.json): "
                        "decode steps of the same shape run the same matmul counts, so compare can hold them "
                        "against that run's (scripts/nightly.sh passes its baseline's)")
    p.add_argument("--case-timeout", type=float, default=900.0, help="seconds before a case is declared hung")
    p.add_argument("--no-report", action="store_true", help="do not build the HTML report at the end")
    p.add_argument("--no-progress", action="store_true",
                   help="one line per case instead of the progress bar (as when stderr is not a terminal)")
    p.add_argument("--no-nvtx", action="store_true", help="do not emit NVTX ranges")
    p.add_argument("--samples", type=int, metavar="N",
                   help="take exactly N samples per measurement (overrides the suite's timing policy)")
    p.add_argument("--profile-window", action="store_true",
                   help="wrap only the measurement phases in cudaProfilerStart/Stop (for ncu/nsys capture ranges)")
    p.add_argument("--torch-trace", type=int, nargs="?", const=10, metavar="N",
                   help="record the first N samples (default 10) of every measurement phase with torch.profiler, "
                        "phases as named ranges; one Chrome/Perfetto trace per case: <run_dir>/trace_<case_id>.json")


def _resume_suite(args: argparse.Namespace):
    """The suite and cases of ``--resume RUN_DIR``: the run's own suite, and of it the cases the
    run was to record (``meta.json``'s list; an older run: every case of the suite).  A ``--suite``
    naming another suite is refused."""
    # suites load torch (spec -> workload, backends): imported here (see the imports above)
    from .spec.suite import load_suite
    meta = load_meta(args.resume)
    suite = load_suite(meta.get("suite_path") or meta["suite"])
    if args.suite is not None:
        asked = load_suite(args.suite)
        if Path(asked.path).resolve() != Path(suite.path).resolve():
            raise UsageError(f"--resume {args.resume} continues a run of suite '{meta.get('suite')}' ({suite.path}); "
                             f"--suite {args.suite} names another ({asked.path}): drop --suite")
    expected = expected_case_ids(meta)
    if expected is None:
        return suite, suite.cases, meta.get("mode")
    by_id = {c.case_id: c for c in suite.cases}
    gone = [cid for cid in expected if cid not in by_id]
    if gone:
        print(f"warning: {len(gone)} case(s) of {args.resume} are no longer in {suite.path} and cannot be run: "
              + ", ".join(gone[:5]) + (" ..." if len(gone) > 5 else ""), file=sys.stderr)
    return suite, [by_id[cid] for cid in expected if cid in by_id], meta.get("mode")


def _resume_args(args: argparse.Namespace) -> list[str]:
    """The flags of this run that a ``--resume`` of it must repeat (its timing, reports, limits)."""
    out: list[str] = []
    if args.samples is not None:
        out += ["--samples", str(args.samples)]
    if args.case_timeout != 900.0:
        out += ["--case-timeout", f"{args.case_timeout:g}"]
    if args.no_report:
        out.append("--no-report")
    elif str(args.reports_dir) != "reports":
        out += ["--reports-dir", str(args.reports_dir)]
    for flag in ("no_progress", "no_nvtx", "profile_window"):
        if getattr(args, flag):
            out.append("--" + flag.replace("_", "-"))
    if args.torch_trace is not None:
        out += ["--torch-trace", str(args.torch_trace)]
    return out


def cmd_run(args: argparse.Namespace) -> int:
    # the engine and torch: only the verbs that measure load them (see the imports above)
    from .measure import TimingPolicy
    from .run.loop import RunOptions, run_suite, select_cases, summary_lines
    from .run.step import read_calibration_file
    from .spec.suite import SuiteError, load_suite
    if args.samples is not None and args.samples < 1:
        print(f"error: --samples {args.samples}: take at least 1 sample per measurement", file=sys.stderr)
        return EXIT_BAD_USAGE
    if args.torch_trace is not None and args.torch_trace < 1:
        print("error: --torch-trace N needs N >= 1", file=sys.stderr)
        return EXIT_BAD_USAGE
    gpu = _has_gpu()
    note = ""
    try:
        if args.resume:
            suite, cases, run_mode = _resume_suite(args)
            if run_mode and run_mode != ("gpu" if gpu else "functional"):
                raise UsageError(f"--resume {args.resume}: the run was measured in {run_mode} mode, this machine "
                                 f"runs {'gpu' if gpu else 'functional'} mode: its records would not compare; "
                                 "resume it where it started")
        else:
            suite = load_suite(args.suite or "default")
            cases = suite.cases
        if not gpu and not args.resume and getattr(suite, "functional_fallback", None):
            fallback = suite.functional_fallback
            note = (f"No CUDA GPU on this machine: suite '{suite.name}' is replaced by the '{fallback}' cases "
                    "in functional mode (CPU, host timer). These numbers check the code paths; they are not "
                    "GPU performance.")
            suite = load_suite(fallback)
            cases = suite.cases
        elif not gpu:
            note = ("No CUDA GPU on this machine: functional mode (CPU, host timer, Triton interpreter). "
                    "These numbers check the code paths; they are not GPU performance.")
    except SuiteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_USAGE
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_USAGE
    cases = select_cases(cases, args.case)
    if not cases:
        print(f"error: no case of suite '{suite.name}' matches {args.case}", file=sys.stderr)
        return EXIT_BAD_USAGE
    try:
        policy = TimingPolicy.from_dict(suite.timing or {})
    except ValueError as exc:
        print(f"error: {suite.path}: [suite.timing]: {exc}", file=sys.stderr)
        return EXIT_BAD_USAGE
    mode = "gpu" if gpu else "functional"
    if not gpu:
        policy = policy.scaled_for_cpu()
    if args.samples is not None:
        policy = dataclasses.replace(policy, min_samples=args.samples, max_samples=args.samples,
                                     max_noise=0.0, min_time_s=0.0, max_time_s=1e9)

    if args.torch_trace and env.launcher() == "torchrun":
        print("error: --torch-trace runs cases in ple_bench's own workers; not under torchrun", file=sys.stderr)
        return EXIT_BAD_USAGE
    rank = env.rank()
    results_dir, reports_dir, resume = args.results_dir, args.reports_dir, args.resume
    quiet = False
    scratch = None
    if env.launcher() == "torchrun" and rank != 0:
        # Only rank 0 writes records and the report; the other ranks run the same cases
        # into a scratch folder (removed at the end). Resuming, they read a copy of the run.
        scratch = Path(tempfile.mkdtemp(prefix=f"ple_bench-rank{rank}-"))
        results_dir, reports_dir, quiet = scratch / "results", scratch / "reports", True
        if resume:
            copy = results_dir / Path(resume).name
            copy.mkdir(parents=True)
            for name in ("meta.json", "records.jsonl"):
                if (Path(resume) / name).exists():
                    shutil.copy2(Path(resume) / name, copy / name)
            resume = copy
    else:  # every output folder is checked before the first case runs
        ensure_writable_dir(resume or results_dir, "--resume" if resume else "--results-dir")
        if not args.no_report:
            ensure_writable_dir(reports_dir, "--reports-dir")
    if note and not quiet:
        print(note, file=sys.stderr)
    calibration = None
    if args.calibration is not None:
        if args.resume:
            raise UsageError("--calibration starts a new run; a resumed run keeps its own calibration.json")
        try:
            calibration = read_calibration_file(args.calibration)
        except ValueError as exc:
            raise UsageError(f"--calibration: {exc}") from None
    options = RunOptions(
        results_dir=results_dir, resume=resume, calibration=calibration,
        case_filter=args.case, case_timeout_s=args.case_timeout,
        progress=not args.no_progress,
        nvtx=not args.no_nvtx, profile_window=args.profile_window,
        torch_trace=args.torch_trace,
        functional_note=note, argv=sys.argv, quiet=quiet, resume_args=_resume_args(args),
    )
    try:
        summary = run_suite(suite, cases, policy, options, mode)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    if quiet:
        return 0  # rank 0's exit code is the run's; a failing code here would make torchrun stop rank 0
    report = None if args.no_report else write_run_outputs(summary.run_dir, reports_dir)
    print()
    for line in summary_lines(summary, mode):
        print(line)
    print(f"records: {summary.run_dir / 'records.jsonl'}")
    if report:
        print(f"report:  {report}")
    if summary.aborted:
        print(f"run ended early: {summary.aborted}", file=sys.stderr)
    return summary.exit_code


def write_run_outputs(run_dir: Path, reports_dir: Path) -> Path | None:
    """After a run: its report (the page's path, None where it failed) and its exports (summary.md,
    summary.csv, pytest-benchmark.json).  A failure of either is a warning: it must not lose the run."""
    report = None
    try:
        report = build_report(run_dir, reports_dir)
    except Exception as exc:  # noqa: BLE001
        print(f"warning: report not written: {type(exc).__name__}: {exc}", file=sys.stderr)
    try:
        write_exports(run_dir)
    except Exception as exc:  # noqa: BLE001
        print(f"warning: summaries / pytest-benchmark JSON not written: {exc}", file=sys.stderr)
    return report


# ------------------------------------------------------------------ list
def cmd_list(args: argparse.Namespace) -> int:
    # suites load torch (spec -> workload, backends): imported here (see the imports above)
    from .spec.suite import SuiteError, list_suites, load_suite
    try:
        suites = [load_suite(args.suite)] if args.suite else list_suites()
    except SuiteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_USAGE
    for suite in suites:
        if args.json:
            for case in suite.cases:
                obj = case_json(case)
                if not args.suite:
                    obj = {"suite": suite.name, **obj}
                print(json.dumps(obj, sort_keys=False))
        elif args.suite and args.wide:
            print(f"# {suite.name}: {suite.description} ({len(suite.cases)} cases)")
            print(format_cases(suite.cases))
        elif args.suite:
            print("\n".join(textwrap.wrap(f"# {suite.name}: {suite.description} ({len(suite.cases)} cases)",
                                          100, subsequent_indent="#   ")))
            print(format_cases_narrow(suite))
        else:
            print(f"{suite.name:<10} {len(suite.cases):>5} cases  {suite.description}")
    return 0


# ------------------------------------------------------------------ env
def cmd_env(args: argparse.Namespace) -> int:
    # the engine and torch: only the verbs that measure load them (see the imports above)
    import torch

    from . import annotate
    from .backends.cuda.uva import uva_available
    lines: list[tuple[str, str]] = []
    gpu = gpu_available()
    lines.append(("torch", f"{torch.__version__} (CUDA {torch.version.cuda})"))
    try:
        import triton  # reported, not required: `env` says when it is missing

        lines.append(("triton", triton.__version__ + ("" if gpu else " (CPU: kernels run under the interpreter)")))
    except Exception as exc:  # noqa: BLE001
        lines.append(("triton", f"missing: {exc}"))
    if gpu:
        n = gpu_count()
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(n))
        lines.append(("GPU", f"{n}: {names}"))
    elif force_cpu():
        lines.append(("GPU", f"forced off ({FORCE_CPU_ENV} is set): runs are functional (CPU, host timer)"))
    else:
        lines.append(("GPU", "none: runs are functional (CPU, host timer); GPU-only cases are skipped"))

    ok, why = uva_available()
    lines.append(("UVA (pinned_uva backend)", "yes" if ok else f"no: {why}; pinned_uva runs in functional mode"))
    lines.append(("multi-rank", "NCCL (one GPU per rank)" if gpu else "gloo on CPU processes"))
    lines.append(("NVTX", "nvtx package present (domain ple_bench)" if annotate.available()
                  else "nvtx package missing: ranges are no-ops"))
    for tool in ("ncu", "nsys"):
        path = shutil.which(tool)
        lines.append((tool, path or "not on PATH"))
    try:
        import pynvml  # optional: NVML clocks

        pynvml.nvmlInit()
        lines.append(("NVML clocks", f"driver {pynvml.nvmlSystemGetDriverVersion()}"))
    except Exception as exc:  # noqa: BLE001
        lines.append(("NVML clocks", f"unavailable: {type(exc).__name__}"))
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    lines.append(("chromium (report checks)", chromium or "not installed"))
    width = max(len(k) for k, _ in lines)
    for k, v in lines:
        print(f"{k:<{width}}  {v}")
    return 0


# ------------------------------------------------------------------ profile
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


def cmd_profile(args: argparse.Namespace) -> int:
    # the engine and torch: only the verbs that measure load them (see the imports above)
    from .measure.profiler import torch_trace_name
    from .run.loop import select_cases
    from .spec.suite import SuiteError, load_suite
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
              + (" + CUDA" if _has_gpu() else "") + f" activity, the first {args.samples} samples of every "
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
    # the engine and torch: only the verbs that measure load them (see the imports above)
    from .measure.profiler import torch_trace_name
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


# ------------------------------------------------------------------ main
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ple_bench",
                                     description="Benchmark PLE / n-gram embedding storage backends.")
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("run", help="run a suite, write results/<run_id>/ and an HTML report")
    _add_run_args(p)
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("list", help="list suites, or one suite's cases")
    p.add_argument("--suite", help="show this suite's cases")
    p.add_argument("--json", action="store_true", help="one JSON object per case (case_id and axes)")
    p.add_argument("--wide", action="store_true",
                   help="with --suite: one column per axis that varies (default: case_id and table size by group)")
    p.set_defaults(func=cmd_list)
    p = sub.add_parser("report", help="(re)build the HTML report of a run")

    add_report_args(p)
    p.set_defaults(func=run_report)
    p = sub.add_parser("compare", help="compare runs (BASE CAND, or BASE... --vs CAND...); exit 1 on a significant regression")

    add_compare_args(p)
    p.set_defaults(func=run_compare)
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
    p.set_defaults(func=cmd_profile)
    p = sub.add_parser("advise", help="where should the table live, and how looked up: ranked from measured runs")

    add_advise_args(p)
    p.set_defaults(func=run_advise)
    p = sub.add_parser("env", help="what this machine can run, and why not")
    p.set_defaults(func=cmd_env)
    p = sub.add_parser("schema", help="print the record schema as markdown (README's record section)")
    p.set_defaults(func=cmd_schema)
    return parser


def cmd_schema(args) -> int:
    sys.stdout.write(markdown())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on bad usage already
        return int(exc.code or 0)

    try:
        return int(args.func(args) or 0)
    except (UsageError, RunFileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_USAGE
    except KeyboardInterrupt:  # Ctrl-C outside a suite loop (which keeps its records and says so)
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (``list --json | head``): stop quietly
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - so the interpreter's final flush does not fail
        except OSError:
            pass
        return 0
