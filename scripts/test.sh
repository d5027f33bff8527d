#!/usr/bin/env bash
# The README's test command: set up, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV="${PLE_BENCH_VENV:-${VIRTUAL_ENV:-.venv}}"
exec "$VENV/bin/python" -m pytest -q "$@"
