#!/usr/bin/env bash
# The README's test command: set up, then run the whole test suite.
# Without a GPU the tests run on every core (pytest-xdist, a file's tests on one worker so that its
# module-scoped fixtures are built once); with one, in a single process, so that the gpu tests
# have the GPU and the host to themselves.  PLE_BENCH_TEST_WORKERS overrides (0: one process).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV="${PLE_BENCH_VENV:-${VIRTUAL_ENV:-.venv}}"
if [ -z "${PLE_BENCH_TEST_WORKERS:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1; then PLE_BENCH_TEST_WORKERS=0; else PLE_BENCH_TEST_WORKERS=logical; fi
fi
exec "$VENV/bin/python" -m pytest -q -n "$PLE_BENCH_TEST_WORKERS" --dist loadfile "$@"
