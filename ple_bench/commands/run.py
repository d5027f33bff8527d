"""``run``: run a suite, write ``results/<run_id>/`` and its report and exports."""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import tempfile
from pathlib import Path

from .. import env
from ..env import gpu_available
from ..report import build_report
from ..report.export import write_exports
from ..results import ensure_writable_dir, expected_case_ids, load_meta
from . import EXIT_BAD_USAGE, UsageError


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("run", help="run a suite, write results/<run_id>/ and an HTML report")
    configure(p)
    p.set_defaults(func=main)
    return p


def _has_gpu() -> bool:
    return gpu_available()


def configure(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--fresh-calibration", action="store_true",
                   help="calibrate the decode step's compute anew instead of reading this machine's profile "
                        "(~/.cache/ple_bench/machine, $PLE_BENCH_PROFILE_DIR), and leave the profile as it is")
    p.add_argument("--processes", type=_count, metavar="K",
                   help="a repeated group (the suite's repeat = {processes, rounds}): measure its cases in K fresh "
                        "worker processes instead of the suite's number")
    p.add_argument("--rounds", type=_count, metavar="R",
                   help="a repeated group: R randomized rounds in each process instead of the suite's number")
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


def _count(text: str) -> int:
    """An integer in [1, 64] (argparse exits 2 naming the flag otherwise)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError(f"{value} is not in [1, 64]")
    return value


def _resume_suite(args: argparse.Namespace):
    """The suite and cases of ``--resume RUN_DIR``: the run's own suite, and of it the cases the
    run was to record (``meta.json``'s list; an older run: every case of the suite).  A ``--suite``
    naming another suite is refused."""
    # suites load torch (spec -> workload, backends): imported here (see commands/__init__.py)
    from ..spec.suite import load_suite
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
    if args.fresh_calibration:
        out.append("--fresh-calibration")
    for flag in ("processes", "rounds"):
        if getattr(args, flag, None) is not None:
            out += [f"--{flag}", str(getattr(args, flag))]
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


def main(args: argparse.Namespace) -> int:
    # the engine and torch: only the verbs that measure load them (see commands/__init__.py)
    from ..measure import TimingPolicy
    from ..run.loop import RunOptions, run_suite, select_cases, summary_lines
    from ..run.step import read_calibration_file
    from ..spec.suite import SuiteError, load_suite
    if args.samples is not None and args.samples < 1:
        print(f"error: --samples {args.samples}: take at least 1 sample per measurement", file=sys.stderr)
        return EXIT_BAD_USAGE
    if not args.case_timeout > 0:  # 0, a negative or NaN: every case would "not answer" at once
        print(f"error: --case-timeout {args.case_timeout:g}: give a case more than 0 s", file=sys.stderr)
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
        processes=args.processes, rounds=args.rounds, machine_profile=not args.fresh_calibration,
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
