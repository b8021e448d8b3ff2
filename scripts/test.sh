#!/usr/bin/env bash
# The test command: lint (ruff), types (mypy), import contracts (lint-imports), then the
# test suite (pytest).
# Sets up .venv on first use. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS  # each stage says when it starts (CI must stay under 30 minutes)
scripts/setup.sh
echo "[test] ruff (setup took $((SECONDS - t0)) s)" >&2
.venv/bin/ruff check src tests scripts benchmarks
.venv/bin/ruff format --check src tests scripts benchmarks
echo "[test] mypy (at $((SECONDS - t0)) s)" >&2
.venv/bin/mypy
echo "[test] import contracts (at $((SECONDS - t0)) s)" >&2
.venv/bin/lint-imports --no-cache
echo "[test] pytest (at $((SECONDS - t0)) s)" >&2
exec .venv/bin/pytest -q "$@"
