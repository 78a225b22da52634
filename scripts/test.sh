#!/usr/bin/env bash
# Installs aepg_jax with its test extra into ./.venv and runs the CI test suite: ruff, then
# pytest without the `slow` marker. Extra arguments go to pytest. Works on a fresh machine with
# Python >= 3.11 and access to PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
.venv/bin/ruff check aepg_jax tests scripts configs
# pytest's own exit code is the script's exit code (set -e; exec).
exec .venv/bin/python -m pytest -m "not slow" "$@"
