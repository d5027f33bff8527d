#!/usr/bin/env bash
# The same cases of a suite at two commits, one after the other in one device call, then
# `compare` (issue 14: behaviour and results unchanged by the refactor). The older tree is
# unpacked beside the checkout first (git archive, untracked: the device copies it):
#   git archive bb42119 ple_bench suites pyproject.toml | (mkdir -p before && tar -x -C before)
# then on the GPU machine: BUDGET_S=540 bash scripts/gpu/before_after.sh SUITE GLOB [GLOB ...]
# ORDER: the runs in turn (default "before after before": the second "before" is the noise
# floor -- the same code twice; with 3 or more a side the compare is on run medians). AFTER_ENV: env for the newer runs only (e.g. PLE_BENCH_NATIVE=0,
# to hold a later, separate change out). Output in $OUT/before_after/: the runs (runs.tgz),
# the compares (compare-*.txt), the logs.
set -u
source scripts/gpu/prelude.sh
suite=$1; shift
cases=(); for g in "$@"; do cases+=(--case "$g"); done
order=(${ORDER:-before after before})
budget=${BUDGET_S:-540}; share=$(( (budget - 30) / ${#order[@]} ))
dest="$OUT/before_after"; mkdir -p "$dest"
common=(run --suite "$suite" "${cases[@]}" --no-progress --no-report)
i=0; runs=()
for which in "${order[@]}"; do
  i=$(( i + 1 )); d="$dest/$i-$which"
  if [ "$which" = before ]; then
    (cd before && PYTHONPATH="$PWD${PYTHONPATH#"$OLDPWD"}" timeout -s INT "$share" \
       python3 -m ple_bench "${common[@]}" --results-dir "$d") 2>&1 | tee "$dest/$i-$which.log" | tail -2
  else
    env ${AFTER_ENV:-} timeout -s INT "$share" python3 -m ple_bench "${common[@]}" --results-dir "$d" 2>&1 \
      | tee "$dest/$i-$which.log" | tail -2
  fi
  runs+=("$(ls -d "$d"/*/ | head -1)")
done
befores=(); afters=()
for k in "${!order[@]}"; do
  if [ "${order[$k]}" = before ]; then befores+=("${runs[$k]}"); else afters+=("${runs[$k]}"); fi
done
if [ ${#befores[@]} -ge 3 ] && [ ${#afters[@]} -ge 3 ]; then  # run medians, the verdict nightly uses
  python3 -m ple_bench compare "${befores[@]}" --vs "${afters[@]}" --all --out "$dest/compare-runs.html" 2>&1 \
    | tee "$dest/compare-runs.txt" | tail -30
else
  python3 -m ple_bench compare "${runs[0]}" "${runs[1]}" --all --out "$dest/compare-1-2.html" 2>&1 | tee "$dest/compare-1-2.txt" | tail -30
  if [ ${#runs[@]} -ge 3 ]; then
    python3 -m ple_bench compare "${runs[0]}" "${runs[2]}" --all --out "$dest/compare-1-3.html" 2>&1 | tee "$dest/compare-1-3.txt" | tail -30
  fi
fi
(cd "$dest" && tar czf runs.tgz [0-9]-*/ && rm -rf [0-9]-*/)
echo "done in $SECONDS s"
