#!/usr/bin/env bash
# Installs aepg_jax with its test extra into ./.venv and runs the CI test suite: ruff, then
# pytest without the `slow` marker, in AEPG_TEST_WORKERS [2] pytest-xdist processes (most
# tests compile small programs on one thread: two workers keep a 2-core machine busy). Extra
# arguments go to pytest (`-n 0` runs in one process). Works on a fresh machine with
# Python >= 3.11 and access to PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
.venv/bin/ruff check aepg_jax tests scripts benchmarks configs
# pytest's own exit code is the script's exit code (set -e; exec).
exec .venv/bin/python -m pytest -m "not slow" -n "${AEPG_TEST_WORKERS:-2}" --dist worksteal "$@"
