"""XLA's bytes per image of the plan's task-1 train step compiled for one target (no device),
with pieces of the step switched off, next to `minimal_step.py`'s step (BENCHMARKS.md, "LAE's
bytes on H100").

    ALLOW_MULTIPLE_LIBTPU_LOAD=1 .venv/bin/python benchmarks/bench_step_bytes.py \
        --dtype=bfloat16 --variants="minimal;;augment;exact_gelu;lora_bf16;no_scale"

A variant is a comma-separated set of: `benchmarks/step_harness.py`'s `patched` switches
(augment, exact_gelu, grad_norm), `lora_bf16` (LoRA's products in the compute dtype),
`no_scale` (LoRA's scale left out of the product: not differentiated), `softmax_bf16`
(attention softmax in bfloat16); `minimal` is the minimal step; the empty variant our step.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "--xla_gpu_enable_triton_gemm" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_triton_gemm=false"
    ).strip()

import argparse
import contextlib
import json
import math
import pathlib
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import minimal_step
import step_harness

from aepg_jax.config import schema
from aepg_jax.data import loader
from aepg_jax.models import peft as peft_lib
from aepg_jax.plan import programs, report, shapes, targets

PIECES = ("lora_bf16", "no_scale", "softmax_bf16", *step_harness.OFF[:2], "grad_norm")


class _LoRANoScale(nn.Module):
    """`peft.LoRA` with its scale created but left out of the product."""

    rank: int

    @nn.compact
    def __call__(self, x):
        width = x.shape[-1]
        a_init = peft_lib._symmetric_uniform(1.0 / math.sqrt(width))

        def branch(name):
            a = self.param(f"{name}_A", a_init, (self.rank, width))
            b = self.param(f"{name}_B", nn.initializers.zeros, (width, self.rank))
            self.param(f"{name}_scale", nn.initializers.ones, ())
            return peft_lib._matmul_f32(peft_lib._matmul_f32(x, a.T), b.T).astype(x.dtype)

        return branch("key"), branch("value")


@contextlib.contextmanager
def _swapped(parts: set[str]):
    saved = []

    def swap(obj, name, value):
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    if "lora_bf16" in parts:
        swap(peft_lib, "_matmul_f32", lambda x, w: x @ w.astype(x.dtype))
    if "no_scale" in parts:
        swap(peft_lib, "LoRA", _LoRANoScale)
    if "softmax_bf16" in parts:
        softmax = jax.nn.softmax
        swap(
            jax.nn,
            "softmax",
            lambda x, axis=-1, **kw: softmax(
                x.astype(jnp.bfloat16) if x.ndim == 4 else x, axis=axis, **kw
            ),
        )
    try:
        with step_harness.patched(parts & set(step_harness.OFF)):
            yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)


def bytes_per_image(program: programs.Program, mesh: Mesh) -> float:
    """XLA's bytes accessed of the compiled modules (GPU: cost analysis per module) / image."""
    from jax._src.lib import _jax

    compiled = program.lower(mesh).compile()
    client = jax.devices("cpu")[0].client
    total = sum(
        float(_jax.hlo_module_cost_analysis(client, m).get("bytes accessed", 0.0))
        for m in compiled.runtime_executable().hlo_modules()
    )
    return total * len(mesh.devices.flat) / program.images


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/imagenet_r.py")
    p.add_argument("--method", default="lae")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--target", default="gpu:h100")
    p.add_argument("--variants", default="minimal;;augment;no_scale")
    a = p.parse_args()
    variants = a.variants.split(";")
    unknown = {x for v in variants for x in v.split(",") if x} - set(PIECES) - {"minimal"}
    if unknown:
        print(
            f"error: --variants: unknown pieces {sorted(unknown)}; use {PIECES}.", file=sys.stderr
        )
        sys.exit(2)
    target = targets.parse(a.target)
    mesh = Mesh(np.asarray(target.devices), (loader.DATA_AXIS,))
    cfg = schema.from_file(a.config, f"tasks=10,method={a.method}")
    cfg.model.init, cfg.model.dtype = "random", a.dtype
    ours = report.all_programs(shapes.shape_run(cfg))[0]
    for variant in variants:
        parts = {x for x in variant.split(",") if x} - {"minimal"}
        if variant == "minimal":
            step, args, donate = minimal_step.minimal_program("vit_b16", 256, a.dtype)
            layouts = (programs.REPLICATED,) * 3 + (programs.BATCH,) * 2
            program = programs.Program("minimal", "train", step, args, layouts, donate, 256)
        else:
            jax.clear_caches()  # a fresh function object: traced again under the patches
            fn = ours.fn
            program = programs.Program(
                ours.name,
                "train",
                lambda *x, f=fn: f(*x),
                ours.args,
                ours.layouts,
                ours.donate,
                ours.images,
            )
        start = time.perf_counter()
        with _swapped(parts):
            mb = bytes_per_image(program, mesh) / 1e6
        row = {
            "dtype": a.dtype,
            "target": a.target,
            "variant": variant or "ours",
            "mb_per_image": round(mb, 1),
            "compile_s": round(time.perf_counter() - start, 1),
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
