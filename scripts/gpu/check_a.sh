#!/usr/bin/env bash
# GPU call A: environment, then every GPU check as a test (python -m pytest -m gpu).  Logs under $OUT.
source scripts/gpu/prelude.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; python3 -m ple_bench env; } 2>&1 | tee "$OUT/env.log"
echo "=== python -m pytest -m gpu"
timeout 570 python3 -m pytest -m gpu -q -rs -p no:cacheprovider --durations=15 > "$OUT/pytest_gpu.log" 2>&1
echo "rc=$?"; tail -40 "$OUT/pytest_gpu.log"
