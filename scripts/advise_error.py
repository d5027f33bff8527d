"""advise's model error, measured on stored runs (CPU only): the tables docs/advise.md quotes.

Prints markdown:

* over the unchanged machine's steps: the held-out-shape error (each table size x row bytes x heads
  left out in turn, every path and the compute refitted on the other shapes; then with the shape's
  ceilings left out too), the extrapolation error (each path's largest token count held out) and
  the leave-one-out error by configuration (``--no-loo`` skips it), per timer and per held-out
  shape (:func:`ple_bench.advise.model.error_markdown`);
* the changed-machine error: each changed configuration the runs hold (fewer gather threads, an SM
  limit, the link shared with a concurrent copy) predicted from the unchanged configurations and the
  machine description changed to match (:func:`ple_bench.advise.model.machine_holdout`);
* ``--predict RUN_DIR...``: the steps of runs measured later, predicted by the model that never saw
  them (:func:`ple_bench.advise.model.heldout_runs`).

    PYTHONPATH=. python scripts/advise_error.py docs/runs/*shapes* docs/runs/*machine* \
        --calibrate $(ls -d docs/runs/2* | grep -v -e shapes -e machine -e advise) \
        --predict docs/runs/*-advise-* > /tmp/error.md

A folder without meta.json exits 2, naming it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ple_bench.advise.model import (build_model, changed_configuration, error_markdown, extrapolation_holdout,
                                    heldout_runs, leave_one_out, load_runs, machine_holdout, machine_markdown,
                                    shape_holdout, step_points, error_cells)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR")
    ap.add_argument("--no-loo", action="store_true", help="skip the leave-one-out error (the slowest)")
    ap.add_argument("--predict", nargs="+", default=[], metavar="RUN_DIR",
                    help="runs of new shapes, measured after: each of their steps predicted from the model of "
                         "RUN_DIR (they are not fitted), the error per shape and timer")
    ap.add_argument("--calibrate", nargs="+", default=[], metavar="RUN_DIR",
                    help="other runs of the same machine whose lookups and ceilings calibrate the machine rates "
                         "(thread fit, random-row and host-gather ceilings); their steps are not fitted")
    args = ap.parse_args(argv)
    missing = [d for d in args.runs + args.calibrate + args.predict if not (Path(d) / "meta.json").exists()]
    if missing:
        print(f"error: not a run folder (no meta.json): {', '.join(missing)}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    records, metas = load_runs(args.runs)
    calibration = load_runs(args.calibrate) if args.calibrate else ((), ())
    model = build_model(records, metas, loo=False, calibration=calibration)
    rates, all_metas = model.rates, list(metas) + list(calibration[1])
    # the shape, extrapolation and leave-one-out errors are the unchanged machine's: each changed
    # configuration (fewer threads, an SM limit, the link shared) is predicted in the machine table
    same = [p for p in model.points if changed_configuration(p, rates) is None]
    model.shape_cases = shape_holdout(same, rates)
    model.strict_cases = shape_holdout(same, rates, metas=all_metas, strict=True)
    model.extrap_cases = extrapolation_holdout(same, rates)
    model.loo_cases = [] if args.no_loo else leave_one_out(same, rates)
    changed = machine_holdout(model.points, rates)
    names = [Path(d).name for d in args.runs]
    shown = ", ".join(names) if len(names) <= 6 else f"{names[0]} ... {names[-1]}"
    print(f"## Model error over {len(names)} run(s): {shown}"
          + (f" (rates calibrated with {len(args.calibrate)} more)" if args.calibrate else "") + "\n")
    print(f"machine rates: {'; '.join(f'{k}: {v}' for k, v in sorted(model.rates.sources.items()))}\n")
    print(f"{len(same)} steps of the unchanged machine ({len(model.points) - len(same)} changed), "
          f"{len(model.fits)} paths, "
          f"{len({p.shape for p in model.points})} shapes (table GiB x row bytes x heads)\n")
    print(error_markdown(model))
    print("\n### Changed machine (each changed configuration from the unchanged ones)\n")
    print(machine_markdown(changed) if changed else "no changed configuration in these runs")
    if args.predict:
        new = [p for p in step_points(load_runs(args.predict)[0]) if changed_configuration(p, rates) is None]
        cases = heldout_runs(same, rates, new)
        print(f"\n### New runs predicted ({', '.join(Path(d).name for d in args.predict)}: not fitted)\n")
        print("| shape | timer | steps | median | worst |\n| --- | --- | --- | --- | --- |")
        for shape in sorted({c.shape for c in cases}):
            for timer in sorted({c.timer for c in cases if c.shape == shape}):
                mine = [c for c in cases if (c.shape, c.timer) == (shape, timer)]
                print(f"| {shape} | {timer} | {error_cells(mine)} |")
        print(f"| **all** | | {error_cells(cases)} |")
    print(f"\n({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
