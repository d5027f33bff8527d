"""advise's error across GPUs (CPU only): each GPU's serve records and decode steps predicted from the
other GPUs' runs alone -- the tables of docs/advise.md, "Another GPU" (:mod:`ple_bench.advise.cross_gpu`).

    PYTHONPATH=. python scripts/gpu_error.py docs/runs/*serving* docs/runs/*faster_than_hbm* > /tmp/gpu.md

The runs are split by meta.json ``device.name``; every ordered pair of GPUs gives one direction.
``--no-steps`` skips the decode steps.  A folder without meta.json, or runs of one GPU only, exit 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ple_bench.advise.cross_gpu import by_gpu, serve_markdown, serve_rows, step_markdown
from ple_bench.advise.model import load_runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR")
    ap.add_argument("--no-steps", action="store_true", help="the serve tables only")
    args = ap.parse_args(argv)
    missing = [d for d in args.runs if not (Path(d) / "meta.json").exists()]
    if missing:
        print(f"error: not a run folder (no meta.json): {', '.join(missing)}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    groups = by_gpu(*load_runs(args.runs))
    if len(groups) < 2:
        print(f"error: runs: every run given is of one GPU ({', '.join(groups) or 'none'}); give runs of two",
              file=sys.stderr)
        return 2
    for source, train in groups.items():
        for target, test in groups.items():
            if source == target:
                continue
            print(f"### The {target} from the {source} ({len(train[1])} runs -> {len(test[1])} runs)\n")
            rows = serve_rows(train, test)
            print(serve_markdown(rows, source, target) if rows else "no serve record of the target to predict")
            if not args.no_steps:
                print()
                print(step_markdown(train, test, source, target))
            print()
    print(f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
