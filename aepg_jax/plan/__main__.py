"""Plans a run for TPUs and GPUs without one: compiles every program of the run for each
--target and prints per program its memory per device against the chip's, FLOPs, bytes and
collectives, then the run's projected time; a program that does not fit exits 2 in one line.

    python -m aepg_jax.plan --config=configs/imagenet_r.py:tasks=10,method=lae \
        --config.model.init=random --target=tpu:v5e:4x4 --target=gpu:h100 [--max_batch]

--config and --config.<field>=<value> are those of `python -m aepg_jax.main`; every field with
its default: `python -m pydoc aepg_jax.config.schema`. TPU and GPU targets need the planner's
own venv (`bash scripts/install.sh aot`); docs/planning.md has the details.
"""

from __future__ import annotations

import os
import sys

from aepg_jax.plan import aot_env  # the standard library only: safe before jax

# TPU/GPU targets need the aot extra: here, or in .venv-aot (re-executed there).
aot_env.ensure(sys.argv)

# Compile-only targets: no local accelerator may be claimed, and no autotuner exists for GPU
# Triton GEMMs without a GPU (these flags must be set before jax starts its backends).
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "--xla_gpu_enable_triton_gemm" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_triton_gemm=false"
    ).strip()

from absl import app, flags, logging  # noqa: E402 (after aot_env.ensure)
from ml_collections import config_flags  # noqa: E402 (after aot_env.ensure)

from aepg_jax.config import command_line  # noqa: E402 (after aot_env.ensure)
from aepg_jax.plan import report  # noqa: E402 (after aot_env.ensure)
from aepg_jax.system import cli, xla_cache  # noqa: E402 (after aot_env.ensure)

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, configs/<name>.py[:args], as for aepg_jax.main.", lock_config=True
)
_TARGETS = flags.DEFINE_multi_string(
    "target", None, "tpu:<gen>:<topology> (tpu:v5e:4x4) or gpu:<h100|a100>[x<N>][:<hosts>]."
)
_MAX_BATCH = flags.DEFINE_bool(
    "max_batch", False, "Also find the largest global optim.batch_size that fits (bisection)."
)
_NUM_TRAIN = flags.DEFINE_integer("num_train", None, "Training examples (unknown datasets).")
_NUM_TEST = flags.DEFINE_integer("num_test", None, "Test examples (unknown datasets).")
_NUM_CLASSES = flags.DEFINE_integer("num_classes", None, "Classes (unknown datasets).")
flags.mark_flags_as_required(["config", "target"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    given = (_NUM_TRAIN.value, _NUM_TEST.value, _NUM_CLASSES.value)
    if any(v is not None for v in given) and not all(v is not None for v in given):
        cli.fail("--num_train, --num_test and --num_classes go together; give all three.")
    sizes = given if all(v is not None for v in given) else None
    # The config's persistent compilation cache, as `aepg_jax.main`'s: it keeps the host's
    # programs (jax reads no compile-only TPU/GPU executable back).
    xla_cache.enable(xla_cache.directory(_CONFIG.value.get("compile_cache", xla_cache.DEFAULT)))
    try:
        problem = report.plan(_CONFIG.value, _TARGETS.value, sizes, _MAX_BATCH.value, sys.stdout)
    except ValueError as err:
        cli.fail(cli.one_line(str(err)))
    if problem:
        cli.fail(problem)


if __name__ == "__main__":
    app.run(main, flags_parser=lambda argv: command_line.parse_flags(argv, _CONFIG))
