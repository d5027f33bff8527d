"""The suite loop: orders a suite's cases so tables are reused, sends each to its ranks
(``dispatch.CaseDispatcher``: ple_bench's own worker processes, or this process under torchrun),
derives and records every outcome as soon as it is known, survives crashes and Ctrl-C, resumes,
shows progress, and ends with the report.  The run's ``meta.json`` is ``provenance``'s."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import provenance
from .case import Case, with_baselines
from .dispatch import CaseDispatcher
from .results import RunWriter, new_run_id


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
    chosen = [c for c in cases if any(fnmatch.fnmatchcase(c.case_id, p) or c.case_id.startswith(p)
                                      for p in patterns)]
    return with_baselines(chosen)  # a chosen pinned step brings its resident baselines


def table_in_host_memory(impl: str) -> bool | None:
    """The backend's declared capability ``table_in_host_memory`` (None when the
    backend cannot be resolved here)."""
    from .backends import get_backend

    try:
        return bool(get_backend(impl).table_in_host_memory)
    except Exception:  # noqa: BLE001 - an unknown backend: the schema falls back on the impl name
        return None


def lookup_mechanism(impl: str) -> str | None:
    """How the backend moves its rows, from its declared capabilities (record field
    ``lookup_mechanism``; None when the backend cannot be resolved here)."""
    from .backends import get_backend

    try:
        cls = get_backend(impl)
    except Exception:  # noqa: BLE001 - an unknown backend: the schema falls back on the impl name
        return None
    if cls.gathers_on_host:
        return "host_gather"
    return "host_copy" if cls.reads_ids_on_host else "kernel"


def derive_record(rec: dict[str, Any], case: Case, meta: dict[str, Any], peers) -> None:
    """The record's derived figures (:func:`ple_bench.record.derive`, the one place they
    are computed), then the record joins ``peers`` (:class:`ple_bench.record.Peers`: the
    overlap twins and resident baselines of the records after it)."""
    from . import record

    if not isinstance(peers, record.Peers):
        raise TypeError(f"derive_record needs a record.Peers (the run's twins and baselines), got {type(peers).__name__}")
    rec.setdefault("table_in_host_memory", table_in_host_memory(case.impl))
    rec.setdefault("lookup_mechanism", lookup_mechanism(case.impl))
    record.derive(rec, meta.get("ceilings") or {}, peers)
    peers.add(rec)


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
        meta = provenance.resume_meta(writer)
    else:
        run_dir = Path(options.results_dir) / new_run_id(suite.name)
        writer = RunWriter(run_dir)
        done = set()
        meta = provenance.start_meta(suite, mode, run_dir, writer, argv=options.argv, policy=policy,
                                     functional_note=options.functional_note, cases=cases)
    todo = [c for c in order_cases(cases) if c.case_id not in done]
    counts = {"ok": 0, "skipped": 0, "failed": 0, "invalid": 0}
    progress = _Progress(len(todo), options.progress)
    if options.resume and not options.quiet:
        progress.write(f"resuming {run_dir}: {len(done)} cases done, {len(todo)} to run")
    if not options.quiet:
        progress.write(f"run {run_dir.name}: {len(todo)} cases, results in {run_dir}")
    interrupted = False
    executor = CaseDispatcher(options, meta, writer)
    from .record import Peers
    from .results import load_records

    twins = Peers.of(load_records(run_dir) if done else [])  # overlap twins and resident baselines
    try:
        for case in todo:
            progress.start(case.case_id)
            rec = executor.run_case(case, policy)
            provenance._keep_host_gather_ceiling(rec, meta, writer)
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
    meta = provenance.finish_meta(writer, meta, status, executor.abort_reason)
    summary = RunSummary(run_dir=run_dir, counts=counts, interrupted=interrupted,
                         aborted=executor.abort_reason)
    if options.report:
        try:
            from .report import build_report

            summary.report = build_report(run_dir, options.reports_dir)
        except Exception as exc:  # noqa: BLE001 - a report failure must not lose the run
            print(f"warning: report not written: {type(exc).__name__}: {exc}", file=sys.stderr)
        try:
            from .export import write_exports

            write_exports(run_dir)  # summary.md, summary.csv, pytest-benchmark.json
        except Exception as exc:  # noqa: BLE001
            print(f"warning: summaries / pytest-benchmark JSON not written: {exc}", file=sys.stderr)
    return summary
