"""The suite loop: orders a suite's cases so tables are reused, sends each to its ranks
(``dispatch.CaseDispatcher``: ple_bench's own worker processes, or this process under torchrun),
turns each :class:`~ple_bench.record.CaseResult` into its record (``record.build``, derived figures
included) and writes it as soon as it is known, survives crashes and Ctrl-C, resumes,
shows progress.  The run's ``meta.json`` is ``provenance``'s; its report and exports are the CLI's to
ask for, after the run."""

from __future__ import annotations

import fnmatch
import json
import os
import shlex
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from .. import record, verdict
from ..uncertainty import processes_for
from ..env import CALIBRATION_ENV, CALIBRATION_FILE
from ..record import Peers, RunContext
from ..results import RunWriter, load_records, new_run_id, not_reached
from ..run_meta import RunMeta
from ..spec.case import HOST_ALLOC_MODES, Case, with_baselines
from . import machine_profile, provenance, replicate
from .dispatch import CaseDispatcher, build_native_first
from .step import seed_calibration


@dataclass
class RunOptions:
    results_dir: Path = Path("results")
    resume: Path | None = None
    case_filter: list[str] = field(default_factory=list)
    case_timeout_s: float = 900.0
    progress: bool = True
    nvtx: bool = True
    profile_window: bool = False
    torch_trace: int | None = None  # record a torch.profiler trace of N samples per window, per case
    functional_note: str = ""
    argv: list[str] = field(default_factory=list)
    quiet: bool = False  # no messages (torchrun ranks other than 0)
    #: the flags that go with ``run --resume RUN_DIR`` to continue this run (printed when it ends
    #: early); None: it cannot be resumed that way (an advise run)
    resume_args: list[str] | None = field(default_factory=list)
    #: compute calibrations to start the run with (``run --calibration FILE``: an earlier run's
    #: calibration.json): its steps run the same matmul counts where the shape matches
    calibration: dict[str, list] | None = None
    #: override a repeated group's processes / rounds (``run --processes N --rounds R``); None: the suite's
    processes: int | None = None
    rounds: int | None = None
    #: start a GPU run's compute calibration from the machine profile and add to it (``--fresh-calibration``: no)
    machine_profile: bool = True


@dataclass
class RunSummary:
    run_dir: Path
    counts: dict[str, int]
    interrupted: bool = False
    resume_command: str | None = None
    aborted: str | None = None  # why a torchrun run ended early
    meta: RunMeta = field(default_factory=RunMeta)  # the run's meta.json at its end
    records: list[dict[str, Any]] = field(default_factory=list)  # every record of the run folder, as stored

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        return 1 if self.counts.get("failed", 0) or self.counts.get("invalid", 0) else 0


def order_cases(cases: list[Case]) -> list[Case]:
    """Group cases by world size and table so each table is built (pinned, filled) once: every
    field of ``Case.table_key`` comes before the axes a table is shared across (kernel, tokens,
    kind, prefetch), so all cases of one table run before it is freed.  Tables by size, smallest
    first (the largest host tables last, each freed before the next is pinned); of one size,
    resident (device) tables first, so pinned step cases find their resident baseline, then
    pinned ones by host allocation (torch's caching allocator, then exact); within a table,
    prefetch off before prefetch on, and a table with default side-stream settings before one with
    a ``stream_priority`` or ``sm_limit``, so prefetch steps find their overlap twin."""
    def alloc_rank(mode: str) -> int:
        return HOST_ALLOC_MODES.index(mode) if mode in HOST_ALLOC_MODES else len(HOST_ALLOC_MODES)

    def key(c: Case):
        return (c.world_size, c.tp, c.etp, c.dp, c.vocab_size, c.dim, c.dtype, c.num_heads,
                c.impl != "device", alloc_rank(c.host_alloc), c.host_alloc, c.impl, c.cache_rows,
                (c.stream_priority, c.sm_limit) != (0, 0), c.stream_priority, c.sm_limit,
                c.gather_threads, repr(c.extra),
                c.kernel, c.num_tokens, c.kind, c.prefetch, c.case_id)
    return sorted(cases, key=key)


def choose_processes(group, options: RunOptions, profile: dict[str, Any] | None) -> tuple[int, str]:
    """The worker processes a repeated group runs in, and why: ``--processes``; else, where the
    group sets ``repeat.target_pct`` and the machine profile holds variance components of its
    cases, the fewest that meet the target for every case (at most ``repeat.most``); else the
    suite's number."""
    processes, rounds = group.repeat
    rounds = options.rounds or rounds
    if options.processes:
        return options.processes, "--processes"
    if group.repeat_target_pct is None:
        return processes, "the suite's number"
    comps = machine_profile.components_of(profile or {}, group.repeated_ids)
    if not comps:
        return processes, (f"the suite's number: this machine's profile holds no variance components of the "
                           f"group yet (a target of +-{group.repeat_target_pct:g} % is read from them)")
    k = max(processes_for(c, group.repeat_target_pct, rounds, most=group.repeat_most) for c in comps.values())
    worst = max(c.half_width_pct(k, rounds) for c in comps.values())
    runs = max(len((profile or {}).get("components", {}).get(cid, [])) for cid in comps)
    return k, (f"chosen for +-{group.repeat_target_pct:g} % from the variance components of up to {runs} earlier "
               f"runs in the machine profile: predicted +-{worst:.1f} % at {k} processes x {rounds} rounds"
               + (f" (the most, {group.repeat_most}, falls short)" if worst > group.repeat_target_pct else ""))


def select_cases(cases: list[Case], patterns: list[str], baselines: bool = True) -> list[Case]:
    if not patterns:
        return cases
    chosen = [c for c in cases if any(fnmatch.fnmatchcase(c.case_id, p) or c.case_id.startswith(p)
                                      for p in patterns)]
    # a chosen pinned step brings its resident baselines (not for a profile of one case)
    return with_baselines(chosen) if baselines else chosen


class _Progress:
    """A tqdm bar where its stream is a terminal; elsewhere (a log, a pipe) and with
    ``--no-progress``, one line per case: its status, its median, the reason of a case not
    measured.  ``enabled=None``: nothing at all (the quiet ranks)."""

    def __init__(self, total: int, bar: bool | None):
        self.bar = None
        self.total, self.n = total, 0
        self.silent = bar is None
        self.case_id = ""
        if bar and sys.stderr.isatty():
            self.bar = tqdm(total=total, unit="case", dynamic_ncols=True, file=sys.stderr,
                            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {postfix}")

    def start(self, case_id: str) -> None:
        self.case_id = case_id
        if self.bar is not None:
            self.bar.set_description_str(case_id[:60])

    def done(self, rec: dict[str, Any]) -> None:
        self.n += 1
        status = rec["status"]
        if self.bar is not None:
            self.bar.set_postfix_str(status)
            self.bar.update(1)
            if status in ("failed", "invalid"):
                self.write(f"{status.upper()} {self.case_id}: {rec.get('reason')}")
        elif not self.silent:
            median = rec.get("median_ms")
            figure = f"{median:10.4f} ms" if isinstance(median, (int, float)) else " " * 13
            reason = f": {rec.get('reason')}" if status != "ok" and rec.get("reason") else ""
            width = len(str(self.total))
            self.write(f"[{self.n:>{width}}/{self.total}] {status:<7} {figure}  {self.case_id}{reason}")

    def write(self, text: str) -> None:
        if self.silent:
            return
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def summary_lines(summary: RunSummary, mode: str) -> list[str]:
    """The run's end on the console: every record of the run folder counted against the cases
    it was to record ("146 of 149"), the skips with their reasons, the cases not reached with
    their groups, and the command that continues the run."""
    meta, records = summary.meta, summary.records
    counts = Counter(r.get("status") for r in records)
    expected = meta.num_cases or 0
    missing = not_reached(meta, (r["case_id"] for r in records))
    n_missing = sum(map(len, missing.values())) if missing is not None else max(expected - len(records), 0)
    total = len(records) + n_missing
    lines = [f"{summary.run_dir.name}: {len(records)} of {total} cases recorded: {counts['ok']} ok, "
             f"{counts['skipped']} skipped, {counts['failed']} failed, {counts['invalid']} invalid  ({mode} mode)"]
    skips: dict[str, list[str]] = {}
    for r in records:
        if r.get("status") == "skipped":
            skips.setdefault(str(r.get("reason") or "no reason recorded"), []).append(r["case_id"])
    if skips:
        lines.append(f"skipped ({counts['skipped']}):")
        for reason, ids in sorted(skips.items(), key=lambda kv: -len(kv[1])):
            shown = ", ".join(ids[:3]) + (f", ... ({len(ids) - 3} more)" if len(ids) > 3 else "")
            lines.append(f"  {len(ids)} x {reason}: {shown}")
    if n_missing:
        lines.append(f"not reached ({n_missing}):")
        if missing is None:
            lines.append("  (this run's meta.json does not list its cases)")
        for group, ids in (missing or {}).items():
            lines.append(f"  [{group}] " + ", ".join(ids))
        if summary.resume_command:
            lines.append(f"continue with: {summary.resume_command}")
    return lines


def resume_command(run_dir: Path, options: RunOptions) -> str | None:
    """The exact command that runs the cases ``run_dir`` lacks, or None where that is not possible."""
    if options.resume_args is None:
        return None
    return shlex.join([sys.executable, "-m", "ple_bench", "run", "--resume", str(run_dir), *options.resume_args])


def _interrupted_text(run_dir: Path, options: RunOptions) -> str:
    text = f"interrupted: everything measured so far is in {run_dir}"
    command = resume_command(run_dir, options)
    return text + (f"; continue with: {command}" if command else "")


def run_suite(suite, cases: list[Case], policy, options: RunOptions, mode: str) -> RunSummary:
    """Run ``cases`` of ``suite``; everything measured is on disk as it finishes."""
    if options.resume:
        run_dir = Path(options.resume)
        writer = RunWriter(run_dir)
        done = writer.done_case_ids()
        meta = provenance.resume_meta(writer)
    else:
        run_dir = Path(options.results_dir) / new_run_id(suite.name)
        writer = RunWriter(run_dir)
        done = set()
        meta = provenance.start_meta(suite, mode, run_dir, writer, argv=options.argv, policy=policy,
                                     functional_note=options.functional_note, cases=cases)
    # one compute calibration per run, shared by every worker (a fresh one after a failure, a resume);
    # on a GPU it starts from the machine profile (the same compute in every run of this machine)
    os.environ[CALIBRATION_ENV] = str(run_dir.resolve() / CALIBRATION_FILE)
    profile_key = machine_profile.machine_key() if mode == "gpu" and options.machine_profile else None
    found = machine_profile.load(profile_key) if profile_key is not None else None
    if options.calibration and not options.resume:
        seed_calibration(run_dir, options.calibration)
        provenance.note(writer, meta, compute_profile={"source": "--calibration"})
    elif profile_key is not None and not options.resume:
        if found is not None:
            seed_calibration(run_dir, found[1]["calibration"])
        provenance.note(writer, meta, compute_profile={
            "source": "machine profile" if found else "calibrated by this run (now the machine profile)",
            "path": str(machine_profile.profile_path(profile_key)), "key": profile_key,
            "created_by": found[1].get("created_by") if found else run_dir.name})
    todo = [c for c in order_cases(cases) if c.case_id not in done]

    stored = meta.repeated if options.resume else {}  # a resumed run keeps its own choice
    choices = {}

    def repeat_of(case_id: str) -> tuple[int, int] | None:
        group = suite.repeat_group(case_id) if hasattr(suite, "repeat_group") else None
        if group is None:
            return None
        if case_id in stored:
            return tuple(stored[case_id])
        if group.name not in choices:
            choices[group.name] = choose_processes(group, options, found[1] if found else None)
        return (choices[group.name][0], options.rounds or group.repeat[1])

    once, repeated = replicate.repeated_cases(todo, repeat_of)
    if repeated:
        provenance.note(writer, meta, repeated={c.case_id: list(repeat_of(c.case_id)) for c in repeated})
        if choices:
            provenance.note(writer, meta, repeat_choice={g: {"processes": k, "why": why}
                                                         for g, (k, why) in choices.items()})
        todo = repeated + once  # first: the cases measured once find the repeated baselines among their peers
    counts = {"ok": 0, "skipped": 0, "failed": 0, "invalid": 0}
    progress = _Progress(len(todo), None if options.quiet else options.progress)
    if options.resume and not options.quiet:
        progress.write(f"resuming {run_dir}: {len(done)} cases done, {len(todo)} to run")
    if not options.quiet:
        progress.write(f"run {run_dir.name}: {len(todo)} cases, results in {run_dir}")
    interrupted = False
    build_native_first(todo, mode, progress, options.quiet)
    executor = CaseDispatcher(options, meta, writer)

    # the run's meta.json (its ceilings grow as they are measured) and its records so far (overlap
    # twins and resident baselines), for each record's derived figures
    context = RunContext(meta, Peers.of(load_records(run_dir) if done else []))

    def keep(case: Case, result) -> dict[str, Any]:
        progress.case_id = case.case_id
        provenance.keep_case_ceilings(result, meta, writer)
        rec = record.build(case, result, context)
        context.peers.add(rec)
        writer.append(rec)
        counts[rec["status"]] += 1
        progress.done(rec)
        return rec

    try:
        if repeated:
            replicate.run_repeated(
                repeated, repeat_of, lambda case, extra: executor.run_case(case, policy, extra), executor.close,
                run_dir, on_round=lambda case_id, where: progress.start(f"{case_id} ({where})") if case_id else progress.write(where),
                on_record=keep)
        for case in once:
            if executor.abort_reason:
                break
            progress.start(case.case_id)
            keep(case, executor.run_case(case, policy))
            if executor.abort_reason:
                if not options.quiet:
                    progress.write(f"run ended early: {executor.abort_reason}")
                break
    except KeyboardInterrupt:
        interrupted = True
        progress.write(_interrupted_text(run_dir, options))
    finally:
        progress.close()
        try:
            executor.close()
        except KeyboardInterrupt:  # Ctrl-C while the workers shut down: the run still ends as interrupted
            if not interrupted:
                interrupted = True
                if not options.quiet:
                    print(_interrupted_text(run_dir, options), file=sys.stderr)
            executor.close()
    if profile_key is not None and (run_dir / CALIBRATION_FILE).exists():
        try:
            calibration = json.loads((run_dir / CALIBRATION_FILE).read_text(encoding="utf-8"))
            _path, added = machine_profile.update(profile_key, calibration, run_dir.name)
            provenance.note(writer, meta, compute_profile=dict(meta.compute_profile, added=added))
        except (OSError, ValueError) as exc:
            print(f"warning: machine profile not updated: {exc}", file=sys.stderr)
    if profile_key is not None and repeated and not interrupted:
        try:
            comps = verdict.ratio_components(load_records(run_dir))
            machine_profile.add_components(profile_key, {k: c.to_json() for k, c in comps.items()}, run_dir.name)
        except (OSError, ValueError) as exc:
            print(f"warning: variance components not kept in the machine profile: {exc}", file=sys.stderr)
    status = "interrupted" if interrupted else "aborted" if executor.abort_reason else "complete"
    meta = provenance.finish_meta(writer, meta, status, executor.abort_reason)
    summary = RunSummary(run_dir=run_dir, counts=counts, interrupted=interrupted,
                         aborted=executor.abort_reason, meta=meta,
                         records=load_records(run_dir, upgrade=False))
    summary.resume_command = resume_command(run_dir, options)
    return summary
