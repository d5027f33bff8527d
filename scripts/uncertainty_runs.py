"""Where the variance of repeated runs lives, and whether each run's interval covers the others.

    PYTHONPATH=. python scripts/uncertainty_runs.py docs/runs/20261207-10*default*

For runs of one commit that repeated the same cases (a suite group's ``repeat``), prints, as markdown
(docs/uncertainty.md holds its output):

1. per token count, each run's verdict (ple_bench.verdict: what every screen prints), its ratio and
   its 95 % interval over processes, and how many of the other runs' point ratios it covers;
2. the variance components of the pinned / resident ratio (ple_bench.uncertainty.components: processes,
   rounds inside a process, samples inside a round), per run, and between runs;
3. what each process ran on (the core of its main thread, its compute calibration, the SM clock, the
   table's pin time) beside its mean ratio: the causes to hold a difference between processes against;
4. compare's false alarms: every ordered pair of the runs compared as baseline and candidate.

Reads stored records only (CPU)."""

from __future__ import annotations

import itertools
import statistics
import sys
from pathlib import Path

from ple_bench.report.compare import compare_runs
from ple_bench.results import load_records
from ple_bench.uncertainty import components
from ple_bench.verdict import ratio_rounds, verdicts


def _entries(records):
    """token count -> (verdict entry, its per-round ratios) of each verdict over processes."""
    by_id = {r["case_id"]: r for r in records}
    return {e.num_tokens: (e, ratio_rounds(e, by_id)) for e in verdicts(records) if e.pinned is not None}


def main(argv: list[str]) -> int:
    runs = [Path(a) for a in argv if Path(a, "records.jsonl").exists() or Path(a, "records.jsonl.gz").exists()]
    if len(runs) < 2:
        print("give two or more run folders of one commit that repeated the same cases", file=sys.stderr)
        return 2
    loaded = {run.name: load_records(run) for run in runs}
    pairs = {name: _entries(recs) for name, recs in loaded.items()}
    tokens = sorted(set.intersection(*(set(p) for p in pairs.values())))

    print("## Each run's verdict and how many of the other runs' ratios its interval covers\n")
    print("| tokens | run | verdict | ratio (95 % interval, processes) | covers |")
    print("|---|---|---|---|---|")
    total_in = total = 0
    for t in tokens:
        entries = {name: pairs[name][t][0] for name in pairs}
        for name, e in entries.items():
            others = [o.ratio for n, o in entries.items() if n != name]
            inside = sum(e.ci_low <= r <= e.ci_high for r in others)
            total_in, total = total_in + inside, total + len(others)
            print(f"| {t} | `{name}` | {e.verdict} | {e.ratio:.3f} ({e.ci_low:.3f}-{e.ci_high:.3f}, "
                  f"{e.processes}) | {inside} of {len(others)} |")
        verdicts_at = sorted({e.verdict for e in entries.values()})
        print(f"| {t} | **all** | {' / '.join(verdicts_at)} | spread of the point ratios "
              f"{min(e.ratio for e in entries.values()):.3f}-{max(e.ratio for e in entries.values()):.3f} | |")
    print(f"\nCoverage: {total_in} of {total} ({100 * total_in / total:.0f} %).\n")

    print("## The ratio's variance by level (relative standard deviation, % of the ratio)\n")
    print("| tokens | run | processes | rounds in a process | samples in a round |")
    print("|---|---|---|---|---|")
    for t in tokens:
        means = []
        for name in pairs:
            _e, obs = pairs[name][t]
            c = components(obs)
            means.append(statistics.fmean(o.ms for o in obs))
            if c is not None:
                print(f"| {t} | `{name}` | {c.processes_pct:.2f} | {c.rounds_pct:.2f} | {c.samples_pct:.2f} |")
        between = 100 * statistics.stdev(means) / statistics.fmean(means)
        print(f"| {t} | between the runs' means | {between:.2f} (all levels, {len(means)} runs) | | |")

    print("\n## Each process: where it ran, and its mean ratio\n")
    print("| run | process | tokens | mean ratio | main thread's core | matmuls | SM MHz | table pinned in s |")
    print("|---|---|---|---|---|---|---|---|")
    for name in pairs:
        for t in tokens:
            e, obs = pairs[name][t]
            facts = {}
            for rep in e.pinned["replicates"]:
                facts.setdefault(rep["process"], rep)
            for p in sorted({o.process for o in obs}):
                mean = statistics.fmean(o.ms for o in obs if o.process == p)
                f = facts.get(p, {})
                print(f"| `{name[-4:]}` | {p + 1} | {t} | {mean:.3f} | {f.get('cpu')} | {f.get('compute_matmuls')} | "
                      f"{f.get('sm_clock_mhz')} | {f.get('table_alloc_s', float('nan')):.1f} |")

    print("\n## compare on every ordered pair of the runs (baseline, candidate)\n")
    alarms = 0
    pairs_n = 0
    for a, b in itertools.permutations(runs, 2):
        result = compare_runs([a], [b])
        pairs_n += 1
        alarms += result.exit_code == 1
        counts = {v: len(result.with_verdict(v)) for v in ("regression", "improvement", "same", "workload", "noisy")}
        print(f"- `{a.name}` vs `{b.name}`: exit {result.exit_code}; "
              + ", ".join(f"{n} {v}" for v, n in counts.items() if n))
    print(f"\nFalse alarms (exit 1 between runs of one commit): {alarms} of {pairs_n}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
