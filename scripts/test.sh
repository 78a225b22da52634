#!/usr/bin/env bash
# Installs aepg_jax with its test extra into ./.venv (created if missing) and runs the
# CI test suite: ruff, then pytest without the `slow` marker. Extra arguments go to pytest.
# Works on a fresh machine with Python >= 3.11 and access to PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[test]"

.venv/bin/ruff check aepg_jax tests scripts configs
# pytest's own exit code is the script's exit code (set -e; exec).
exec .venv/bin/python -m pytest -m "not slow" "$@"
