#!/usr/bin/env bash
# Create (once) the project's virtual environment in .venv and install KernelArc into it.
# Idempotent: re-running only reinstalls when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv" >&2
  "$PY" -m venv .venv
fi
stamp=.venv/.kernelarc-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[setup] installing dependencies (first run: a minute or two)" >&2
  # torch 2.13.0 resolves to a local CPU wheel on the CPU machines; a GPU machine keeps its own.
  .venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/pip install -q torch==2.13.0
  .venv/bin/pip install -q -e ".[dev]"
  echo "$want" > "$stamp"
fi
