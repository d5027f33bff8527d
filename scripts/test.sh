#!/usr/bin/env bash
# The README's test command: set up, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV="${PLE_BENCH_VENV:-.venv}"
exec "$VENV/bin/python" -m pytest -q "$@"
