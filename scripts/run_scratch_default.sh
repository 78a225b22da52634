#!/usr/bin/env bash
# The embedded from-scratch example (configs/scratch_default.py) on a fresh machine: installs the
# package into ./.venv and Debian's Fashion-MNIST when missing (as run_default.sh does), trains
# the small ResNet with alpha = 0 (EPG), 0.2 and 1 (CE), then overlays the three runs:
#   runs/scratch_default/a{0,0.2,1}/  and  runs/scratch_default/alpha.png
# WORKDIR overrides runs/scratch_default; extra arguments go to every aepg_jax.main call.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist
  else
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist
  fi
fi
out="${WORKDIR:-runs/scratch_default}"
for a in 0 0.2 1; do
  .venv/bin/python -m aepg_jax.main --config=configs/scratch_default.py:alpha=$a \
    --workdir="$out/a$a" "$@"
done
.venv/bin/python scripts/compare_scratch.py "$out"/a* --out "$out/alpha.png"
