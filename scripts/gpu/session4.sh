#!/usr/bin/env bash
# Session 4's device calls: `bash scripts/gpu/session4.sh STEP [STEP ...]` on the GPU machine,
# each STEP one of
#   suite:NAME[:CASEGLOB]  python3 -m ple_bench run --suite NAME [--case CASEGLOB] (log NAME.log)
#   resume:RUNDIR          python3 -m ple_bench run --resume RUNDIR (a run cut short by the budget)
#   pytest                 python3 -m pytest -m gpu tests/gpu (log pytest_gpu.log)
#   cmd:COMMAND            any command (log cmd.log)
# within BUDGET_S seconds in all (default 560): a suite that runs out is stopped with SIGINT,
# keeps its records, and can be resumed in the next call. Everything lands in $OUT: logs,
# machine.txt and one tarball of results/ and reports/.
set -u
source scripts/gpu/prelude.sh
budget=${BUDGET_S:-560}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'threads', torch.get_num_threads())"
  free -g | head -2; nproc; } > "$OUT/machine.txt" 2>&1
left() { echo $(( budget - SECONDS )); }
for step in "$@"; do
  kind=${step%%:*}; rest=${step#*:}
  echo "== $step ($(left) s left)"
  case "$kind" in
    suite)
      name=${rest%%:*}; glob=""; [ "$rest" != "$name" ] && glob=${rest#*:}
      timeout -s INT "$(left)" python3 -m ple_bench run --suite "$name" --no-progress ${glob:+--case "$glob"} 2>&1 \
        | tee -a "$OUT/$name.log" | grep -v "^\s*$" | tail -25 ;;
    resume)
      timeout -s INT "$(left)" python3 -m ple_bench run --resume "$rest" --no-progress 2>&1 \
        | tee -a "$OUT/resume.log" | grep -v "^\s*$" | tail -25 ;;
    pytest)
      timeout "$(left)" python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider -rs 2>&1 | tee "$OUT/pytest_gpu.log" | tail -30 ;;
    cmd)
      timeout "$(left)" bash -c "$rest" 2>&1 | tee -a "$OUT/cmd.log" | tail -40 ;;
  esac
done
tar czf "$OUT/runs.tgz" results reports 2>/dev/null
echo "done in $SECONDS s"
