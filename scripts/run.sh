#!/usr/bin/env bash
# The README's main command: set up, then `python -m ple_bench run` (args passed on).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV="${PLE_BENCH_VENV:-${VIRTUAL_ENV:-.venv}}"
exec "$VENV/bin/python" -m ple_bench run "$@"
