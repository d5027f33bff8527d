"""Repeat at the level that varies: a group with ``repeat = { processes = k, rounds = R }``
(:class:`ple_bench.spec.suite.SuiteGroup`) has its cases -- and their resident baselines -- measured
in k fresh worker processes, one after another (a fresh interpreter, a fresh pin and fill of each
table), and in each process R rounds; a round measures every case once, in an order drawn anew
(seeded by the run, the process and the round), so a pinned step and its baseline alternate
instead of one always following the other.  Between its cases the worker keeps both tables
(``park_tables``: neither is pinned or filled twice inside a process); each round re-captures its
graphs and re-allocates its buffers as any case does.

Each round's result is appended to ``replicates.jsonl`` in the run folder as it comes (nothing is
lost to a crash or Ctrl-C); the record of a case is built once its last round is in: its figures
(:data:`FIGURES`) are the mean over processes of each process's mean of its rounds
(:func:`ple_bench.uncertainty.point`), its ``replicates`` list every round's figures with the standard
error of each median and where the process ran (:func:`ple_bench.measure.placement.process_facts`),
and everything else is the first round's.  The interval of every figure and ratio is read from
``replicates`` (:mod:`ple_bench.uncertainty`)."""

from __future__ import annotations

import json
import math
import random
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from ..record import CaseResult
from ..spec.case import Case
from ..uncertainty import Obs, median_se, point

REPLICATES_FILE = "replicates.jsonl"

#: the figures a repeated case carries as the mean over its processes, each with the raw samples
#: it is the median of (a round's standard error is read from them)
FIGURES = (("step_ms", "samples_ms"), ("median_ms", "samples_ms"),
           ("step_host_sync_ms", "step_host_sync_samples_ms"), ("full_step_ms", "full_step_samples_ms"),
           ("full_step_host_sync_ms", "full_step_host_sync_samples_ms"), ("compute_ms", "compute_samples_ms"))
#: what each round keeps of its process's placement and its case's state (the causes to hold a
#: difference between processes against)
_FACTS = ("cpu", "cpus_allowed", "cpu_khz", "thread_cpus", "anon_huge_bytes", "pid")
_STATE = ("sm_clock_mhz", "compute_matmuls", "matmul_us", "table_alloc_s", "table_fill_s", "table_reused",
          "host_alloc_note")


def round_entry(process: int, round_: int, position: int, result: CaseResult) -> dict[str, Any]:
    """One round of one case: its figures, their standard errors, where it ran."""
    m = result.measurement
    ms: dict[str, float] = {}
    se: dict[str, float] = {}
    for figure, samples_key in FIGURES:
        v = m.get(figure)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0:
            ms[figure] = float(v)
            samples = m.get(samples_key)
            if isinstance(samples, list) and samples:
                se[figure] = median_se([float(x) for x in samples if isinstance(x, (int, float))])
    entry: dict[str, Any] = {"process": process, "round": round_, "position": position, "status": result.status,
                             "ms": ms, "se_ms": se}
    facts = result.process or {}
    for key in _FACTS:
        if key in facts:
            entry[key] = facts[key]
    state = {**result.table_cost, **m}
    for key in _STATE:
        if state.get(key) is not None:
            entry[key] = state[key]
    if result.status != "ok":
        entry["reason"] = result.reason
    return entry


def merge(case: Case, rounds: list[tuple[dict[str, Any], CaseResult]], processes: int) -> CaseResult:
    """The case's result over its rounds: the first round's, its figures the mean over processes,
    ``replicates`` every round's entry.  A round that did not end ok makes the case end as it did."""
    bad = [(e, r) for e, r in rounds if r.status != "ok"]
    if bad:
        entry, result = bad[0]
        why = f"process {entry['process'] + 1}, round {entry['round'] + 1}: {result.reason}"
        return replace(result, reason=why if result.status != "skipped" else result.reason)
    first = rounds[0][1]
    measurement = dict(first.measurement)
    entries = [e for e, _ in rounds]
    for figure, _samples in FIGURES:
        obs = [Obs(e["process"], e["round"], e["ms"][figure]) for e in entries if figure in e["ms"]]
        if obs and len(obs) == len(entries):
            measurement[figure] = point(obs)
    measurement["replicates"] = entries
    measurement["processes"] = len({e["process"] for e in entries})
    measurement["rounds"] = max(e["round"] for e in entries) + 1
    return replace(first, measurement=measurement,
                   duration_s=round(sum(r.duration_s or 0.0 for _, r in rounds), 3))


def round_order(cases: list[Case], run_id: str, process: int, round_: int) -> list[Case]:
    """The cases of one round in an order drawn from the run, the process and the round."""
    rng = random.Random(zlib.crc32(f"{run_id}|{process}|{round_}".encode()))
    order = list(cases)
    rng.shuffle(order)
    return order


def load_rounds(run_dir: Path) -> list[dict[str, Any]]:
    """The rounds ``replicates.jsonl`` holds (a resumed run goes on from them); an unreadable line
    (a crash mid-write) is left out."""
    path = Path(run_dir) / REPLICATES_FILE
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def run_repeated(cases: list[Case], repeat_of: Callable[[str], tuple[int, int]], run_case: Callable[..., CaseResult],
                 fresh_process: Callable[[], None], run_dir: Path, on_round: Callable[[str, str], None],
                 on_record: Callable[[Case, CaseResult], None]) -> None:
    """Measure ``cases`` (each with its ``repeat_of(case_id)``) process by process, round by round;
    call ``on_record`` with each case's merged result once its rounds are all in.

    Cases of one (processes, rounds) setting share their processes and rounds (a pinned step and
    its baselines must, to be paired).  ``fresh_process`` ends the worker so the next case starts a
    new one; ``run_case(case, extra_options)`` runs one case there."""
    by_setting: dict[tuple[int, int], list[Case]] = {}
    for c in cases:
        by_setting.setdefault(repeat_of(c.case_id), []).append(c)
    path = Path(run_dir) / REPLICATES_FILE
    done: dict[str, list[dict[str, Any]]] = {}
    for e in load_rounds(run_dir):
        done.setdefault(str(e.get("case_id")), []).append(e)
    run_id = Path(run_dir).name
    for (processes, rounds), group in by_setting.items():
        collected: dict[str, list[tuple[dict[str, Any], CaseResult]]] = {c.case_id: [] for c in group}
        start = 0
        # a resumed run keeps the processes whose every round of every case is in
        while all(sum(1 for e in done.get(c.case_id, []) if e.get("process") == start) >= rounds for c in group) \
                and start < processes:
            for c in group:
                for e in done[c.case_id]:
                    if e.get("process") == start:
                        collected[c.case_id].append((e, _result_of(e)))
            start += 1
        for p in range(start, processes):
            fresh_process()
            on_round("", f"{len(group)} repeated cases: process {p + 1}/{processes} (a fresh worker), {rounds} rounds")
            for r in range(rounds):
                for position, case in enumerate(round_order(group, run_id, p, r)):
                    on_round(case.case_id, f"process {p + 1}/{processes}, round {r + 1}/{rounds}")
                    result = run_case(case, {"park_tables": True, "process_facts": True})
                    entry = round_entry(p, r, position, result)
                    collected[case.case_id].append((entry, result))
                    with path.open("a", encoding="utf-8") as fh:
                        stored = dict(entry, case_id=case.case_id)
                        if p == 0 and r == 0:  # the first round's whole result: the record is built on it
                            stored["result"] = _plain({k: getattr(result, k) for k in _KEPT})
                        fh.write(json.dumps(stored, default=str) + "\n")
        fresh_process()  # the next work starts in a fresh worker, the parked tables freed
        for case in group:
            on_record(case, merge(case, collected[case.case_id], processes))


#: what the first round's stored result keeps (a resumed run builds the record on it)
_KEPT = ("measurement", "table_cost", "traffic", "kernel_ran", "lookup_mechanism", "table_in_host_memory")


def _plain(fields: Mapping[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(dict(fields), default=str))


def _result_of(entry: Mapping[str, Any]) -> CaseResult:
    """A stored round as a result (its figures are in the entry; the first round's whole result)."""
    kept = dict(entry.get("result") or {})
    return CaseResult(status=entry.get("status", "ok"), reason=entry.get("reason", ""),
                      **{k: kept[k] for k in _KEPT if k in kept})


def repeated_cases(cases: Iterable[Case], repeat_of: Callable[[str], Any]) -> tuple[list[Case], list[Case]]:
    """(the cases measured once, the repeated ones)."""
    once, repeated = [], []
    for c in cases:
        (repeated if repeat_of(c.case_id) else once).append(c)
    return once, repeated


__all__ = ["FIGURES", "REPLICATES_FILE", "merge", "round_entry", "round_order", "run_repeated", "repeated_cases",
           "load_rounds"]
