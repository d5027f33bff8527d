#!/usr/bin/env bash
# before_after.sh -- do the records of a run change across a refactor?  Runs one small suite with
# an older tree and with this tree, in turn on this machine, then compares the runs with this
# tree's `python -m ple_bench compare` and prints its verdict (same per case where the median did
# not move beyond the threshold, PASS where no case regressed).
#
# The older tree is a plain export, no git needed on the machine.  Locally (any tree):
#     mkdir -p .carry-before
#     git archive 6ff8d6b^1 ple_bench suites pyproject.toml | tar -x -C .carry-before
# (6ff8d6b^1: the main line just before the layout move; any other commit works the same way.)
# .carry-before/ is git-ignored: carry it.  On the GPU machine, from this tree's root:
#     source scripts/gpu/prelude.sh && bash scripts/gpu/before_after.sh
# (device tool: carry [".whl", ".carry-before"]).
#
# Both trees expand the suite to the same case ids (checked first: the script stops if not).
# Default suite: scripts/gpu/before_after.toml (8 cases on a 1 GiB table: device and pinned-UVA
# lookups at 256 and 4096 tokens, a prefetched pinned decode step and its 3 resident baselines,
# the default suite's timing).
#
# The runs go in turn, ORDER (default "before after before after before after", about 20 s a run
# on one H200 after the prelude, about 2-2.5 minutes in all): with 3 or more runs a side the
# verdict is on run medians, the rule nightly uses (PASS / same per case).  One run a side cannot
# tell a change from run-to-run noise: a pinned table of 64 MiB-1 GiB runs up to ~12 % faster or
# slower depending on where its allocation lands, and the same code twice got 19 "regressions"
# of 78 (docs/benchmark-engine.md, "Run to run").  With fewer runs a side (ORDER="before after
# before") the script compares before vs after beside before vs before, the noise floor.
#
# Environment:
#   BEFORE=.carry-before   the older tree
#   SUITE=scripts/gpu/before_after.toml   a suite name both trees have (e.g. smoke) or a path
#   ORDER="before after before after before after"
#   RUN_ARGS=              more arguments for every run (e.g. "--samples 3" for a quick check)
#   OUT=$OUT or results/before_after   where the run folders, the compares' markdown/CSV/HTML go
#   RUN_TIMEOUT_S=150      a run still going after this long is interrupted (its records kept)
#   PYTHON=python3
set -euo pipefail
set -f  # RUN_ARGS may hold --case globs: no pathname expansion

BEFORE=${BEFORE:-.carry-before}
SUITE=${SUITE:-scripts/gpu/before_after.toml}
RUN_ARGS=${RUN_ARGS:-}
ORDER=${ORDER:-before after before after before after}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-150}
OUT=${OUT:-results/before_after}
PYTHON=${PYTHON:-python3}
HERE=$PWD

if [ ! -d "$BEFORE/ple_bench" ]; then
  echo "before_after: no older tree at $BEFORE (export one: see the top of $0)" >&2
  exit 2
fi
case "$SUITE" in
  */*|*.toml) SUITE_ARG=$(cd "$(dirname "$SUITE")" && pwd)/$(basename "$SUITE") ;;  # a path: absolute for both trees
  *) SUITE_ARG=$SUITE ;;  # a name: each tree's own suites/<name>.toml
esac
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# each tree on its own import path (the prelude put this tree first on PYTHONPATH: take it off)
EXTRA_PATH=${PYTHONPATH:-}
EXTRA_PATH=${EXTRA_PATH#"$HERE"}
EXTRA_PATH=${EXTRA_PATH#:}
in_tree() {  # in_tree DIR CMD...: run CMD in DIR with DIR's ple_bench first on the path
  local dir=$1
  shift
  (cd "$dir" && PYTHONPATH="$dir${EXTRA_PATH:+:$EXTRA_PATH}" "$@")
}
BEFORE=$(cd "$BEFORE" && pwd)

ids() {  # the case ids a tree expands the suite to, sorted
  in_tree "$1" "$PYTHON" -c "
import sys
from ple_bench.spec.suite import load_suite
print('\n'.join(sorted(c.case_id for c in load_suite(sys.argv[1]).cases)))" "$SUITE_ARG" 2>/dev/null ||
  in_tree "$1" "$PYTHON" -c "
import sys
from ple_bench.suite import load_suite
print('\n'.join(sorted(c.case_id for c in load_suite(sys.argv[1]).cases)))" "$SUITE_ARG"
}
ids "$BEFORE" > "$OUT/ids_before.txt"
ids "$HERE" > "$OUT/ids_after.txt"
if ! diff "$OUT/ids_before.txt" "$OUT/ids_after.txt" > "$OUT/ids.diff"; then
  echo "before_after: the trees expand $SUITE to different case ids ($OUT/ids.diff):" >&2
  cat "$OUT/ids.diff" >&2
  exit 2
fi
echo "before_after: $(wc -l < "$OUT/ids_after.txt") cases, the same ids in both trees"

# The decode steps of every run that can take it start with the first run's compute calibration
# (`run --calibration`, in trees that have it): a step calibrated to another matmul count is other
# work, which compare does not hold against the first (WORKLOAD). A tree without the option
# calibrates its own.
CALIB=""
takes_calibration() { in_tree "$1" "$PYTHON" -m ple_bench run --help 2>/dev/null | grep -q -- "--calibration"; }
run_tree() {  # run_tree DIR LABEL: one run of the suite with DIR's code into $OUT/LABEL/<run_id>
  local dir=$1 label=$2 t0 calib_args=()
  t0=$(date +%s)
  rm -rf "${OUT:?}/$label"
  mkdir -p "$OUT/$label"
  if [ -n "$CALIB" ] && takes_calibration "$dir"; then calib_args=(--calibration "$CALIB"); fi
  # shellcheck disable=SC2086  # RUN_ARGS: several words on purpose
  in_tree "$dir" timeout -s INT "$RUN_TIMEOUT_S" "$PYTHON" -m ple_bench run --suite "$SUITE_ARG" --results-dir "$OUT/$label" \
    --reports-dir "$OUT/reports" --no-report --no-progress "${calib_args[@]}" $RUN_ARGS > "$OUT/$label.log" 2>&1 || {
    tail -20 "$OUT/$label.log" >&2
    echo "before_after: the $label run failed ($OUT/$label.log)" >&2
    exit 2
  }
  tail -1 "$OUT/$label.log"
  echo "before_after: $label took $(( $(date +%s) - t0 )) s"
}
befores=()
afters=()
i=0
for which in $ORDER; do
  i=$(( i + 1 ))
  case "$which" in
    before) run_tree "$BEFORE" "$i-before" ;;
    after) run_tree "$HERE" "$i-after" ;;
    *) echo "before_after: ORDER holds before and after, not $which" >&2; exit 2 ;;
  esac
  dir=$(find "$OUT/$i-$which" -mindepth 1 -maxdepth 1 -type d | sort | tail -1)
  if [ -z "$CALIB" ] && [ -f "$dir/calibration.json" ]; then CALIB="$dir/calibration.json"; fi
  if [ "$which" = before ]; then befores+=("$dir"); else afters+=("$dir"); fi
done
if [ ${#befores[@]} -eq 0 ] || [ ${#afters[@]} -eq 0 ]; then
  echo "before_after: ORDER needs a before and an after run" >&2
  exit 2
fi

verdicts() {  # verdicts CSV: the count of each status
  "$PYTHON" - "$1" <<'PY'
import collections, csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
counts = collections.Counter(r.get("status", "?") for r in rows)
print(", ".join(f"{n} {s}" for s, n in counts.most_common()) or "no case compared")
PY
}
compare() {  # compare NAME BASE... --vs CAND...: this tree's compare, its tail and the verdict counts
  local name=$1 rc
  shift
  set +e
  in_tree "$HERE" "$PYTHON" -m ple_bench compare "$@" --all --reports-dir "$OUT/reports" \
    --out "$OUT/reports/compare-$name.html" --markdown "$OUT/compare-$name.md" --csv "$OUT/compare-$name.csv" \
    > "$OUT/compare-$name.txt" 2>&1
  rc=$?
  set -e
  grep -v -E '^(same|SAME|insufficient|INSUFFICIENT) ' "$OUT/compare-$name.txt" | tail -12
  echo "before_after: $name: compare exit $rc; per case: $(verdicts "$OUT/compare-$name.csv")"
  return $rc
}
status=0
if [ ${#befores[@]} -ge 3 ] && [ ${#afters[@]} -ge 3 ]; then  # run medians, the verdict nightly uses
  compare before-vs-after "${befores[@]}" --vs "${afters[@]}" || status=$?
else
  compare before-vs-after "${befores[0]}" "${afters[0]}" || status=$?
  if [ ${#befores[@]} -ge 2 ]; then  # the noise floor: the same code twice
    compare before-vs-before "${befores[0]}" "${befores[1]}" || true
  fi
fi
echo "before_after: done in $SECONDS s; outputs in $OUT"
exit $status
