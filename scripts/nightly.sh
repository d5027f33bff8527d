#!/usr/bin/env bash
# Nightly benchmark: run the fixed `nightly` suite PLE_BENCH_RUNS times (separate runs,
# separate processes and table allocations), export and report the newest with a trend
# over the last N nightly runs, and compare those runs with the baseline: a set of
# accepted runs kept as symlinks in a baseline directory.  With >= 3 runs on each side
# the verdict is on run medians, Holm-adjusted over the cases (see
# ple_bench/report/compare/); for the 23 nightly cases a call needs 6 runs a side, so
# that is the default.  Writes the compare's HTML, markdown and CSV summaries and the
# history page (each case's run median over the kept runs).  Exits with compare's code:
# 0 no regression, 1 regression (or a case that broke, or a run itself failed), 2 bad
# input (no baseline, no new run, nothing in common).  See docs/nightly.md.
#
# Environment (all optional):
#   PLE_BENCH_PYTHON     python to use (default: .venv/bin/python if present, else python3)
#   PLE_BENCH_RESULTS    results directory (default: results); history is kept here
#   PLE_BENCH_REPORTS    reports directory (default: reports)
#   PLE_BENCH_BASELINE   the baseline: a directory of symlinks to accepted runs (default:
#                        $PLE_BENCH_RESULTS/baseline); a run directory (or a symlink to one)
#                        is also accepted as a one-run baseline (the older layout)
#   PLE_BENCH_BASELINE_RUNS  how many accepted runs the baseline keeps (default: 6)
#   PLE_BENCH_RUNS       how many runs of the suite a night makes: the candidate (default: 6;
#                        with Holm over 23 cases, 3 or 4 vs as many can call nothing, and
#                        compare says so)
#   PLE_BENCH_SUITE      suite name (default: nightly)
#   PLE_BENCH_HISTORY    how many earlier nightly runs the trend shows (default: 14; the
#                        history page, reports/history-<suite>.html, shows every kept run)
#   PLE_BENCH_THRESHOLD  regression threshold in % (default: 5)
#   PLE_BENCH_ALPHA      Mann-Whitney significance level (default: compare's: 0.05 family-wise
#                        on run medians, 0.01 on pooled samples, which are advisory)
#   PLE_BENCH_RUN_CMD    the run command (default: "$PY -m ple_bench run --suite $SUITE --results-dir $RESULTS --no-report")
#   PLE_BENCH_INIT_BASELINE=1  with no baseline yet, make tonight's runs the baseline and exit 0
#   PLE_BENCH_ACCEPT=1   after the compare, tonight's runs join the baseline, which keeps the
#                        newest PLE_BENCH_BASELINE_RUNS (a change in performance is accepted);
#                        the exit code is still the compare's (against the old baseline)
# Extra arguments are passed to the run command. Every run starts with the baseline's compute
# calibration (`run --calibration`: its first run's calibration.json; without a baseline,
# tonight's first run's), so a decode step runs the baseline's matmul count and stays comparable.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ -n "${PLE_BENCH_PYTHON:-}" ]; then PY="$PLE_BENCH_PYTHON"
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3; fi
RESULTS="${PLE_BENCH_RESULTS:-results}"
REPORTS="${PLE_BENCH_REPORTS:-reports}"
BASELINE="${PLE_BENCH_BASELINE:-$RESULTS/baseline}"
KEEP="${PLE_BENCH_BASELINE_RUNS:-6}"
RUNS="${PLE_BENCH_RUNS:-6}"
SUITE="${PLE_BENCH_SUITE:-nightly}"
HISTORY="${PLE_BENCH_HISTORY:-14}"
THRESHOLD="${PLE_BENCH_THRESHOLD:-5}"
ALPHA_ARGS=()
if [ -n "${PLE_BENCH_ALPHA:-}" ]; then ALPHA_ARGS=(--alpha "$PLE_BENCH_ALPHA"); fi
RUN_CMD="${PLE_BENCH_RUN_CMD:-$PY -m ple_bench run --suite $SUITE --results-dir $RESULTS --no-report}"

list_runs() {  # real run directories (not symlinks), one per line
  find "$RESULTS" -mindepth 1 -maxdepth 1 -type d -exec test -f '{}/meta.json' ';' -print 2>/dev/null | sort
}

baseline_runs() {  # the baseline's runs, one per line (a run directory itself: that one run)
  if [ -f "$BASELINE/meta.json" ]; then
    printf '%s\n' "$BASELINE"
  elif [ -d "$BASELINE" ]; then
    find "$BASELINE/" -mindepth 1 -maxdepth 1 -exec test -f '{}/meta.json' ';' -print 2>/dev/null | sort
  fi
}

set_baseline() {  # the baseline := the newest $KEEP of the given runs, as symlinks in a directory
  local tmp="$BASELINE.new.$$" old="$BASELINE.old.$$" runs=("$@") start run target names=()
  start=$(( ${#runs[@]} > KEEP ? ${#runs[@]} - KEEP : 0 ))
  rm -rf "$tmp" && mkdir -p "$tmp" || return 1
  for run in "${runs[@]:start}"; do
    target="$(cd "$run" && pwd -P)" || return 1  # the run itself, not a symlink to it
    ln -s "$target" "$tmp/$(basename "$target")" || return 1
    names+=("$(basename "$target")")
  done
  if [ -e "$BASELINE" ] || [ -L "$BASELINE" ]; then mv "$BASELINE" "$old" || return 1; fi
  mv "$tmp" "$BASELINE" && rm -rf "$old"  # rm -rf removes the symlinks, never the runs they point to
  echo "nightly: baseline $BASELINE = ${names[*]}"
}

mkdir -p "$RESULTS" "$REPORTS"
new=()
run_rc=0
# every run computes with the baseline's compute calibration (its first run's calibration.json;
# without a baseline, tonight's first run's): a decode step calibrated to another matmul count
# is other work, which compare cannot hold against the baseline (it says WORKLOAD)
calib=""
mapfile -t base0 < <(baseline_runs)
for run in "${base0[@]}"; do
  if [ -f "$run/calibration.json" ]; then calib="$run/calibration.json"; break; fi
done
for i in $(seq 1 "$RUNS"); do
  before="$(list_runs)"
  calib_args=()
  if [ -n "$calib" ]; then calib_args=(--calibration "$calib"); fi
  echo "nightly: run $i/$RUNS: $RUN_CMD ${calib_args[*]} $*"
  # shellcheck disable=SC2086  # RUN_CMD is a command line on purpose
  $RUN_CMD "${calib_args[@]}" "$@"
  rc_i=$?
  [ "$rc_i" -ne 0 ] && [ "$run_rc" -eq 0 ] && run_rc=$rc_i
  one="$(comm -13 <(printf '%s\n' "$before") <(list_runs) | tail -n 1)"
  if [ -z "$one" ]; then
    echo "nightly: run $i wrote no new run directory under $RESULTS (run exit code $rc_i)" >&2
    exit 2
  fi
  echo "nightly: new run $one (run exit code $rc_i)"
  new+=("$one")
  if [ -z "$calib" ] && [ -f "$one/calibration.json" ]; then calib="$one/calibration.json"; fi
done
last="${new[${#new[@]}-1]}"

"$PY" -m ple_bench.report.export "$last" || echo "nightly: pytest-benchmark export failed (not fatal)" >&2
"$PY" -m ple_bench.report report "$last" --reports-dir "$REPORTS" --history-last "$HISTORY" \
  || echo "nightly: report failed (not fatal)" >&2

mapfile -t base < <(baseline_runs)
if [ "${#base[@]}" -eq 0 ]; then
  if [ "${PLE_BENCH_INIT_BASELINE:-0}" = "1" ]; then
    if [ "$run_rc" -ne 0 ]; then
      echo "nightly: a run exited with $run_rc: not starting a baseline from it" >&2
      exit 1
    fi
    echo "nightly: no baseline yet; starting one"
    set_baseline "${new[@]}" || exit 2
    exit 0
  fi
  echo "nightly: no baseline at $BASELINE (set PLE_BENCH_BASELINE, or PLE_BENCH_INIT_BASELINE=1 to start one)" >&2
  exit 2
fi

summary="$REPORTS/compare-$(basename "$last")"
"$PY" -m ple_bench.report compare "${base[@]}" --vs "${new[@]}" --threshold "$THRESHOLD" "${ALPHA_ARGS[@]}" \
  --reports-dir "$REPORTS" --markdown "$summary.md" --csv "$summary.csv"
rc=$?
"$PY" -m ple_bench.report compare "${base[@]}" --history "$RESULTS" --suite "$SUITE" --reports-dir "$REPORTS" \
  || echo "nightly: history page failed (not fatal)" >&2
if [ "$rc" -eq 0 ] && [ "$run_rc" -ne 0 ]; then
  echo "nightly: compare found no regression, but a run itself exited with $run_rc: failing" >&2
  rc=1
fi
if [ "${PLE_BENCH_ACCEPT:-0}" = "1" ]; then
  if [ "$run_rc" -ne 0 ]; then
    echo "nightly: PLE_BENCH_ACCEPT=1, but a run exited with $run_rc: the baseline is not moved" >&2
  else
    echo "nightly: PLE_BENCH_ACCEPT=1: tonight's runs join the baseline (it keeps the newest $KEEP)"
    set_baseline "${base[@]}" "${new[@]}" || exit 2
  fi
fi
exit "$rc"
