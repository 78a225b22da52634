#!/usr/bin/env bash
# The plan checked on a GPU machine in one command of about 10 minutes (benchmarks/bench_gpu.py):
# the train step at batch 64/128/256 in f32 and bf16 against the plan's FLOPs and memory, then a 10-task x
# 1-epoch run on synthetic ImageNet-R-shaped JPEGs against the plan's projected time.
#   bash benchmarks/bench_gpu.sh        # ViT-B/16 (a GPU)
#   bash benchmarks/bench_gpu.sh tiny   # the same on the CPU with a tiny ViT (checks the script)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
preset=${1:-vit_b16}
[ "$preset" = tiny ] && export JAX_PLATFORMS=cpu  # no CUDA plugin probing on a CPU host
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # the peak memory figure is the program's, not a pool
exec "$PY" benchmarks/bench_gpu.py --preset="$preset"
