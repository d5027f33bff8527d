#!/usr/bin/env bash
# Nightly benchmark: run the fixed `nightly` suite, export it for pytest-benchmark
# tools, build its report with a trend over the last N nightly runs, and compare it
# with the baseline run.  Exits with compare's code: 0 no regression, 1 regression
# (or a case that broke, or the run itself failed), 2 bad input (no baseline, no new
# run, nothing in common).  See docs/nightly.md.
#
# Environment (all optional):
#   PLE_BENCH_PYTHON     python to use (default: .venv/bin/python if present, else python3)
#   PLE_BENCH_RESULTS    results directory (default: results); history is kept here
#   PLE_BENCH_REPORTS    reports directory (default: reports)
#   PLE_BENCH_BASELINE   baseline run directory or symlink (default: $PLE_BENCH_RESULTS/baseline)
#   PLE_BENCH_SUITE      suite name (default: nightly)
#   PLE_BENCH_HISTORY    how many earlier nightly runs the trend shows (default: 14)
#   PLE_BENCH_THRESHOLD  regression threshold in % (default: 5)
#   PLE_BENCH_ALPHA      Mann-Whitney significance level (default: 0.01)
#   PLE_BENCH_RUN_CMD    the run command (default: "$PY -m ple_bench run --suite $SUITE --results-dir $RESULTS --no-report")
#   PLE_BENCH_INIT_BASELINE=1  with no baseline yet, make this run the baseline and exit 0
# Extra arguments are passed to the run command.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ -n "${PLE_BENCH_PYTHON:-}" ]; then PY="$PLE_BENCH_PYTHON"
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3; fi
RESULTS="${PLE_BENCH_RESULTS:-results}"
REPORTS="${PLE_BENCH_REPORTS:-reports}"
BASELINE="${PLE_BENCH_BASELINE:-$RESULTS/baseline}"
SUITE="${PLE_BENCH_SUITE:-nightly}"
HISTORY="${PLE_BENCH_HISTORY:-14}"
THRESHOLD="${PLE_BENCH_THRESHOLD:-5}"
ALPHA="${PLE_BENCH_ALPHA:-0.01}"
RUN_CMD="${PLE_BENCH_RUN_CMD:-$PY -m ple_bench run --suite $SUITE --results-dir $RESULTS --no-report}"

list_runs() {  # real run directories (not symlinks), one per line
  find "$RESULTS" -mindepth 1 -maxdepth 1 -type d -exec test -f '{}/meta.json' ';' -print 2>/dev/null | sort
}

mkdir -p "$RESULTS" "$REPORTS"
before="$(list_runs)"
echo "nightly: $RUN_CMD $*"
# shellcheck disable=SC2086  # RUN_CMD is a command line on purpose
$RUN_CMD "$@"
run_rc=$?
new="$(comm -13 <(printf '%s\n' "$before") <(list_runs) | tail -n 1)"
if [ -z "$new" ]; then
  echo "nightly: the run wrote no new run directory under $RESULTS (run exit code $run_rc)" >&2
  exit 2
fi
echo "nightly: new run $new (run exit code $run_rc)"

"$PY" -m ple_bench.export "$new" || echo "nightly: pytest-benchmark export failed (not fatal)" >&2
"$PY" -m ple_bench.report report "$new" --reports-dir "$REPORTS" --history-last "$HISTORY" \
  || echo "nightly: report failed (not fatal)" >&2

if [ ! -e "$BASELINE" ]; then
  if [ "${PLE_BENCH_INIT_BASELINE:-0}" = "1" ]; then
    ln -sfn "$(cd "$new" && pwd)" "$BASELINE"
    echo "nightly: no baseline yet; $BASELINE -> $new"
    exit 0
  fi
  echo "nightly: no baseline at $BASELINE (set PLE_BENCH_BASELINE, or PLE_BENCH_INIT_BASELINE=1 to start one)" >&2
  exit 2
fi

"$PY" -m ple_bench.report compare "$BASELINE" "$new" --threshold "$THRESHOLD" --alpha "$ALPHA" \
  --reports-dir "$REPORTS"
rc=$?
if [ "$rc" -eq 0 ] && [ "$run_rc" -ne 0 ]; then
  echo "nightly: compare found no regression, but the run itself exited with $run_rc: failing" >&2
  rc=1
fi
exit "$rc"
