#!/usr/bin/env bash
# GPU call A: environment, backends, measurement engine, graphs.  Logs under $OUT.
source scripts/gpu/prelude.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; python3 -m ple_bench env; } 2>&1 | tee "$OUT/env.log"
for s in verify_backends verify_measure verify_graphs; do
  echo "=== $s"; timeout 240 python3 scripts/gpu/$s.py > "$OUT/$s.log" 2>&1; echo "rc=$?"; tail -25 "$OUT/$s.log"
done
