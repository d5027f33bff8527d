#!/usr/bin/env bash
# Create .venv (or use $PLE_BENCH_VENV, else an activated virtualenv) and install ple_bench with its test extras.
# torch is pinned to 2.13.0 on machines without a GPU: that CPU build lies on the
# CPU machines' disk; an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${PLE_BENCH_VENV:-${VIRTUAL_ENV:-.venv}}"  # an activated virtualenv is used as it is
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    "$VENV/bin/pip" install -q torch
  else
    "$VENV/bin/pip" install -q "torch==2.13.0"
  fi
fi
"$VENV/bin/pip" install -q -e ".[test]"
echo "ple_bench installed in $VENV"
