"""Where a default-suite run's time went, and what the levers applied since it was run take off.

    python scripts/default_suite_time.py docs/runs/20261202-075048-default-f9f7 \
        [--before docs/runs/20261201-123806-default-fa39]

Prints, from the run's records.jsonl(.gz) and meta.json: the run's time (started_at to
ended_at), the time by group (duration_s, and the table builds: table_alloc_s + table_fill_s
of each table's first case), then one line per lever, each computed from the records:

* distinct-row count: the 32 768-token lookups' time beyond what an earlier run (--before)
  spent on them once the timing policy's change is taken out (their samples' sum and the
  warm-ups). unique_rows_fraction was counted there with np.unique on the host (now a sort on
  the GPU);
* 47.7 GiB torch table: its table_alloc_s (its 64 GiB block now comes from torch's cache,
  pinned for the 32 GiB table);
* no warm-L2 twin: per lookup that had one, the 50 ms warm-up and max(0.15 s floor, the hot
  samples' sum);
* per-case ceilings: per random-row ceiling in meta.json, max(0.15, repeats x ms) less
  max(0.05, 10 x ms) where it stopped at the floor.

With ``--suite NAME [--also RUN ...]`` it estimates instead how long the suite's cases as they
are now would take: each case's duration_s net of its table build where one of the runs holds
its case_id (the latest run that does), else the median of the runs' records of the same path
(impl, graph); plus one build per pinned table (vocab_size, host_alloc: the other paths take a
filled table over), the longest seen for it; plus the first run's time outside its cases.

An estimate, not a measurement: a fresh run replaces it."""

from __future__ import annotations

import argparse
import gzip
import json
from datetime import datetime
from pathlib import Path

import pandas as pd


def load(run: Path) -> tuple[pd.DataFrame, dict]:
    path = run / "records.jsonl"
    opener = open if path.exists() else gzip.open
    path = path if path.exists() else run / "records.jsonl.gz"
    with opener(path, "rt") as fh:
        df = pd.DataFrame([json.loads(line) for line in fh if line.strip()])
    meta = json.loads((run / "meta.json").read_text())
    group = {cid: g for g, ids in meta.get("expected_cases", {}).items() for cid in ids}
    df["group"] = df["case_id"].map(group)
    first = df["table_reused"].eq(False)
    df["build_s"] = 0.0
    df.loc[first, "build_s"] = df.loc[first, "table_alloc_s"].fillna(0) + df.loc[first, "table_fill_s"].fillna(0)
    return df, meta


def _sum_s(samples) -> float:
    return sum(samples) / 1e3 if isinstance(samples, list) else 0.0


def _count(samples) -> int:
    return int(isinstance(samples, list))


def estimate(suite_name: str, runs: list[Path]) -> None:
    """Print the estimated time of ``suite_name``'s current cases from ``runs`` (see the module doc)."""
    from ple_bench.spec.suite import load_suite  # the repository on PYTHONPATH

    frames = []
    for order, run in enumerate(runs):
        df, meta = load(run)
        df["order"] = order
        frames.append(df)
    first, meta = load(runs[0])
    total = (datetime.fromisoformat(meta["ended_at"]) - datetime.fromisoformat(meta["started_at"])).total_seconds()
    overhead = total - float(first["duration_s"].sum())
    df = pd.concat(frames, ignore_index=True)
    df["net_s"] = df["duration_s"] - df["build_s"]
    latest = df.sort_values("order").groupby("case_id")["net_s"].last()
    by_path = df.groupby(["impl", "graph"])["net_s"].median()
    builds = df[df["table_reused"].eq(False)].groupby(["vocab_size", "host_alloc"])["build_s"].max()
    cases = load_suite(suite_name).cases
    matched = [latest[c.case_id] for c in cases if c.case_id in latest.index]
    guessed = [by_path.get((c.impl, c.graph), df["net_s"].median()) for c in cases if c.case_id not in latest.index]
    tables = {(c.vocab_size, c.host_alloc) for c in cases if c.impl != "device"}
    unseen = tables - set(builds.index)
    build = sum(float(builds.get(t, builds.max())) for t in tables)  # a table no run built: the longest build
    left = sum(matched) + sum(guessed) + build + overhead
    print(f"{suite_name}: {len(cases)} cases; {len(matched)} timed in these runs ({sum(matched):.0f} s), "
          f"{len(guessed)} by their path's median ({sum(guessed):.0f} s); {len(tables)} pinned tables "
          f"built ({build:.0f} s, {len(unseen)} of them in no run: the longest build each); "
          f"outside the cases {overhead:.0f} s")
    print(f"estimate: {left:.0f} s ({left / 60:.1f} min)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--before", type=Path, help="an earlier default run (for the distinct-count lever)")
    ap.add_argument("--suite", help="estimate this suite's current cases from the run(s) instead")
    ap.add_argument("--also", type=Path, nargs="*", default=[], help="more runs to take case times from (--suite)")
    args = ap.parse_args()
    if args.suite:
        estimate(args.suite, [args.run, *args.also])
        return
    df, meta = load(args.run)
    total = (datetime.fromisoformat(meta["ended_at"]) - datetime.fromisoformat(meta["started_at"])).total_seconds()
    print(f"{args.run.name}: {len(df)} records, {total:.0f} s from start to end")
    by = df.groupby("group").agg(cases=("case_id", "size"), time_s=("duration_s", "sum"), build_s=("build_s", "sum"))
    print(by.sort_values("time_s", ascending=False).round(1).to_string(), "\n")

    levers: list[tuple[str, float]] = []
    if args.before is not None:
        old, _ = load(args.before)
        for d in (df, old):
            d["sampled_s"] = sum(d[k].apply(_sum_s) for k in ("samples_ms", "hot_samples_ms", "graph_samples_ms"))
            d["measurements"] = sum(d[k].apply(_count) for k in ("samples_ms", "hot_samples_ms", "graph_samples_ms"))
        both = old.merge(df, on="case_id", suffixes=("_old", ""))
        big = both[both["num_tokens"].eq(32768) & both["kind"].eq("lookup")]
        policy_saving = (big["sampled_s_old"] - big["sampled_s"]) + 0.05 * big["measurements"]
        excess = big["duration_s"] - big["duration_s_old"] + policy_saving
        levers.append((f"distinct-row count on the GPU ({len(big)} lookups of 32 768 tokens)", float(excess.sum())))
    torch47 = df[df["vocab_size"].eq(320001536) & df["host_alloc"].eq("torch") & df["table_reused"].eq(False)]
    if len(torch47) and not bool(torch47["host_alloc_from_cache"].fillna(False).iloc[0]):
        levers.append(("47.7 GiB torch table in the cached 64 GiB block", float(torch47["table_alloc_s"].iloc[0])))
    hot = df[df["hot_samples_ms"].apply(lambda s: isinstance(s, list))]
    if len(hot):
        hot_s = (0.05 + hot["hot_samples_ms"].apply(_sum_s).clip(lower=0.15)).sum()
        levers.append((f"no warm-L2 twin ({len(hot)} lookups)", float(hot_s)))
    ceilings = meta.get("ceilings", {}).get("random_row", {})
    saved = 0.0
    for c in ceilings.values():
        sampled = c["repeats"] * c["ms"] / 1e3
        if sampled <= 0.15:
            saved += 0.15 - max(0.05, 10 * c["ms"] / 1e3)
    if ceilings:
        levers.append((f"per-case ceilings at a 0.05 s floor ({len(ceilings)} random-row ceilings)", saved))
    left = total
    for name, s in levers:
        left -= s
        print(f"  -{s:5.1f} s  {name}")
    print(f"estimate: {left:.0f} s ({left / 60:.1f} min)")


if __name__ == "__main__":
    main()
