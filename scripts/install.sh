#!/usr/bin/env bash
# Creates ./.venv (if missing) and installs aepg_jax into it in editable mode.
# Usage: bash scripts/install.sh [EXTRAS]   e.g. `test` for pytest and ruff, `hub` for hf-hub: ids.
#
# `browser` is no Python package: Debian's `chromium` (apt-get, as root) where none is on PATH,
# for the slow test that renders a sweep's report page in headless Chromium
# (tests/test_report.py); `bash scripts/install.sh test,browser` installs both.
#
# `aot` (the planner's libtpu and CUDA 13 plugin) goes into ./.venv-aot instead, a venv of its own:
# its plugins load into every jax process, so training's .venv must never have them;
# `python -m aepg_jax.plan` re-executes itself there for TPU/GPU targets (plan/aot_env.py).
#
# Versions: those CI tests, from constraints.txt (`pip install -c`). AEPG_UNPINNED=1 installs
# (and upgrades to) the latest versions pyproject.toml allows instead.
# A call whose pyproject.toml, constraints.txt, Python and mode match the last install, and
# whose extras were installed then, does nothing (stamp: <venv>/.aepg_install); AEPG_REINSTALL=1
# installs anyway.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extras=${1:-}
if [[ ",$extras," == *",browser,"* ]]; then
  extras=$(echo "$extras" | tr ',' '\n' | grep -vx browser | paste -sd, - || true)
  if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
      echo "error: chromium is missing and this is not root with apt-get: install Debian's" \
        "chromium package (apt-get install chromium), then run this again." >&2
      exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq chromium >/dev/null
  fi
fi
venv=.venv
if [[ ",$extras," == *",aot,"* ]]; then
  venv=.venv-aot
fi
if [ ! -x "$venv/bin/python" ]; then
  "$PY" -m venv "$venv"
fi

mode=pinned
pin=(-c constraints.txt)
if [ -n "${AEPG_UNPINNED:-}" ]; then
  mode=unpinned
  pin=(--upgrade --upgrade-strategy eager)
fi
key=$({ cat pyproject.toml constraints.txt; "$venv/bin/python" -VV; echo "$mode"; } | sha256sum)
key=${key%% *}
stamp=$venv/.aepg_install

# The extras installed under this key so far (comma-separated), or nothing.
installed=""
if [ -f "$stamp" ] && [ -z "${AEPG_REINSTALL:-}" ]; then
  read -r old_key old_extras < "$stamp" || true
  if [ "${old_key:-}" = "$key" ]; then
    installed=",${old_extras:-},"
  fi
fi
if [ -n "$installed" ]; then
  missing=""
  for e in ${extras//,/ }; do
    [[ "$installed" == *",$e,"* ]] || missing=1
  done
  if [ -z "$missing" ] && "$venv/bin/python" -c "import aepg_jax" 2>/dev/null; then
    exit 0  # installed as asked already
  fi
fi

"$venv/bin/python" -m pip install --quiet --upgrade pip
spec="."
if [ -n "$extras" ]; then
  spec=".[$extras]"
fi
# setuptools' note on every editable install of a flat layout ("be careful with folders named
# like your package"): informational, nothing to act on.
PYTHONWARNINGS="ignore:Editable installation" \
  "$venv/bin/python" -m pip install --quiet "${pin[@]}" -e "$spec"
all=$(echo "${installed//,/ } ${extras//,/ }" | tr ' ' '\n' | awk NF | sort -u | paste -sd, -)
echo "$key ${all}" > "$stamp"
