#!/usr/bin/env bash
# Runs the embedded default on a fresh machine: installs the package into ./.venv, Debian's
# Fashion-MNIST files (for pretraining the tiny backbone) when missing, then
#   .venv/bin/python -m aepg_jax.main --config=configs/default.py --workdir=runs/default
# Extra arguments go to aepg_jax.main (e.g. --config.seed=1); WORKDIR overrides the workdir.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist
  elif command -v sudo >/dev/null 2>&1; then
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist
  else
    echo "Fashion-MNIST is missing: install Debian's dataset-fashion-mnist, or pass" \
         "--config.pretrain.dataset=digits to pretrain on digits instead." >&2
  fi
fi
exec .venv/bin/python -m aepg_jax.main --config=configs/default.py \
  --workdir="${WORKDIR:-runs/default}" "$@"
