#!/usr/bin/env bash
# Creates ./.venv (if missing) and installs aepg_jax into it in editable mode.
# Usage: bash scripts/install.sh [EXTRAS]   e.g. `test` for pytest and ruff.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
spec="."
if [ -n "${1:-}" ]; then
  spec=".[$1]"
fi
.venv/bin/python -m pip install --quiet -e "$spec"
