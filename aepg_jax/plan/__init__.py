"""Planning a run for accelerators without them: `python -m aepg_jax.plan`.

    python -m aepg_jax.plan --config=configs/imagenet_r.py:tasks=10,method=lae \
        --config.model.init=random --target=tpu:v5e:4x4 --target=gpu:h100 [--max_batch]

Builds every jitted program of the continual run (`programs.py`, from the run's own factories),
with its real shapes, shardings, donation and seed vmapping, from the config alone
(`shapes.py`: no data, no weights), compiles each for each target without the target
(`targets.py`: libtpu's compile-only TPU topologies, the CUDA plugin's GPU targets), and prints
per program the memory per device against the chip's HBM, FLOPs and bytes per image, the
collectives and the compile time (`analysis.py`), then the whole run's projected time
(`project.py`). A program that does not fit ends the command with exit code 2 and one `error:`
line. TPU and GPU targets need the optional `aot` extra, kept in a venv of its own
(`bash scripts/install.sh aot` -> `.venv-aot`; `aot_env.py` re-executes the planner there).
"""
