#!/usr/bin/env bash
# Session 3's device calls (issue 12): `bash scripts/gpu/session3.sh STAGE` on the GPU machine.
#   check  : host paths vs the plainest hand version (scripts/gpu/host_path_check.py), then the
#            smoke suite on the GPU (every path with host ids, eager and breakable graphs)
#   paths  : the paths suite (ids on host / device x eager / breakable, every path)
#   default: the default suite, then the studies given in STUDIES (commands, ';'-separated)
# Everything lands in $OUT: logs and one tarball of results/ and reports/.
set -u
source scripts/gpu/prelude.sh
stage=${1:?stage}
budget=${BUDGET_S:-560}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'threads', torch.get_num_threads())"
  free -g | head -2; nproc; } > "$OUT/machine.txt" 2>&1
left() { echo $(( budget - SECONDS )); }
suite() {  # suite name, then extra args
  local name=$1; shift
  timeout -s INT "$(left)" python3 -m ple_bench run --suite "$name" --no-progress "$@" 2>&1 | tee "$OUT/$name.log" | grep -v "^\s*$" | tail -40
}
case "$stage" in
  check)
    python3 scripts/gpu/host_path_check.py --table-gib 8 --out "$OUT/host_path_check.json" 2>&1 | tee "$OUT/host_path_check.log"
    rc=${PIPESTATUS[0]}
    echo "host_path_check exit $rc"
    if [ "$rc" -gt 1 ]; then export PLE_BENCH_RAW_BATCH=0; echo "raw batch call off (check crashed)"; fi
    suite smoke
    ;;
  bisect)
    python3 scripts/gpu/host_gather_bisect.py --out "$OUT/host_gather_bisect.json" 2>&1 | tee "$OUT/host_gather_bisect.log"
    suite smoke
    ;;
  paths)
    suite paths
    ;;
  default)
    suite default
    IFS=';' read -ra cmds <<< "${STUDIES:-}"
    for c in "${cmds[@]}"; do
      [ -n "$c" ] || continue
      echo "== $c"; timeout "$(left)" bash -c "$c" 2>&1 | tee -a "$OUT/studies.log" | tail -30
    done
    ;;
esac
tar czf "$OUT/runs.tgz" results reports 2>/dev/null
echo "stage $stage done in $SECONDS s"
