#!/usr/bin/env bash
# The test command: lint (ruff), types (mypy), then the test suite (pytest).
# Sets up .venv on first use. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "[test] ruff" >&2
.venv/bin/ruff check src tests scripts benchmarks
.venv/bin/ruff format --check src tests scripts benchmarks
echo "[test] mypy" >&2
.venv/bin/mypy
echo "[test] pytest" >&2
exec .venv/bin/pytest -q "$@"
