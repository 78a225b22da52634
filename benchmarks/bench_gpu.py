"""What a real accelerator does against what `aepg_jax.plan` predicts for it, in one command
(`benchmarks/bench_gpu.sh`, sized to finish in about 10 minutes on one GPU).

1. The train step of task 1 (LoRA, `configs/imagenet_r.py`'s model) at global batch 64 / 128 /
   256 in float32 and bfloat16 on this machine's devices: images/s, MFU from the plan's FLOP
   count of the same program and the chip's peak (`plan.targets.CHIPS`), the device's peak
   memory (`memory_stats`, where the backend has one) against the compiled program's own
   prediction (XLA's memory analysis, what the plan reports).
2. A shortened run on synthetic ImageNet-R-shaped data made here (random JPEGs of realistic
   sizes in an image folder, 200 classes x 60 images, 10 tasks x 1 epoch) through
   `aepg_jax.main`, its wall time against the plan's projection for the same config at this
   chip's peak and at 40% MFU.

`--preset=tiny` runs the same on the CPU: a width-32 ViT at 16 px, 20 classes x 40 images of
32-64 px, batches 16 / 32 / 64 (the figures then say nothing about accelerators; it
checks the script).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image

from aepg_jax.config import schema
from aepg_jax.plan import programs, project, shapes, targets

ROOT = pathlib.Path(__file__).resolve().parents[1]
PRESETS = {
    # batches, classes, images per class, image sides, model overrides, store size, steps timed
    "vit_b16": ((64, 128, 256), 200, 60, (300, 500), {}, 256, 20),
    "tiny": (
        (16, 32, 64),
        20,
        40,
        (32, 64),
        {
            "model.patch_size": 4,
            "model.hidden_size": 32,
            "model.depth": 2,
            "model.num_heads": 2,
            "model.mlp_dim": 64,
            "model.image_size": 16,
            "model.peft.blocks": (0, 1),
        },
        16,
        5,
    ),
}


def chip() -> targets.Chip:
    kind = jax.devices()[0].device_kind.lower()
    for name in ("h100", "a100", "v5e", "v5p", "v6e", "v4"):
        if name in kind.replace(" ", "").replace("lite", "e"):
            return targets.CHIPS[name]
    return targets.CHIPS["cpu"]


def local_target() -> targets.Target:
    devices = tuple(jax.devices())
    return targets.Target(
        "local",
        f"{len(devices)} x {devices[0].device_kind}",
        "local",
        chip(),
        devices,
        jax.process_count(),
    )


def config(preset: str, overrides: dict, dtype: str, batch: int):
    cfg = schema.from_file(str(ROOT / "configs/imagenet_r.py"), "tasks=10,method=lae")
    for key, value in {
        **PRESETS[preset][4],
        "model.init": "random",
        "model.dtype": dtype,
        "optim.batch_size": batch,
        "data.store_size": PRESETS[preset][5],
        **overrides,
    }.items():
        target = cfg
        *parents, leaf = key.split(".")
        for p in parents:
            target = target[p]
        target[leaf] = value
    return cfg


def concrete(tree, key):
    """Random values for a tree of ShapeDtypeStructs (uint8 images, ints, floats)."""
    leaves, treedef = jax.tree.flatten(tree)
    out = []
    for i, x in enumerate(leaves):
        k = jax.random.fold_in(key, i)
        if x.dtype == jnp.uint8:
            out.append(jax.random.randint(k, x.shape, 0, 256, jnp.int32).astype(jnp.uint8))
        elif jnp.issubdtype(x.dtype, jnp.integer):
            out.append(jnp.zeros(x.shape, x.dtype))
        elif x.dtype == jnp.bool_:
            out.append(jnp.ones(x.shape, x.dtype))
        else:
            out.append(0.02 * jax.random.normal(k, x.shape, x.dtype))
    return jax.tree.unflatten(treedef, out)


def step_rows(preset: str) -> None:
    batches, *_, steps = PRESETS[preset]
    target = local_target()
    mesh = jax.sharding.Mesh(np.asarray(target.devices), ("data",))
    print(f"device: {target.label}; peak {target.chip.peak_bf16 / 1e12:.0f} TFLOP/s bf16")
    print("dtype     batch   img/s   MFU  peak GiB (device)  predicted GiB  plan GFLOP/img")
    for dtype in ("float32", "bfloat16"):
        for batch in batches:
            cfg = config(preset, {"data.num_tasks": 10}, dtype, batch)
            run = shapes.shape_run(cfg, (24_000, 6_000, 200))
            program = programs.train_programs(run)[0]
            flops = program.host_flops
            args = program.sharded(mesh)
            compiled = program.lower(mesh).compile()  # the program the plan compiles, run here
            mem = compiled.memory_analysis()
            predicted = (
                mem.argument_size_in_bytes
                + mem.output_size_in_bytes
                - mem.alias_size_in_bytes
                + mem.temp_size_in_bytes
            )

            def shard(tree, sds):
                return jax.device_put(tree, jax.tree.map(lambda x: x.sharding, sds))

            state = shard(program.args[0], args[0])
            frozen = shard(concrete(args[1], jax.random.PRNGKey(0)), args[1])
            batch_arr = shard(concrete(args[2], jax.random.PRNGKey(1)), args[2])
            state, m = compiled(state, frozen, batch_arr)
            jax.block_until_ready(m)
            start = time.perf_counter()
            for _ in range(steps):
                state, m = compiled(state, frozen, batch_arr)
            jax.block_until_ready(m)
            seconds = (time.perf_counter() - start) / steps
            stats = jax.devices()[0].memory_stats() or {}
            measured = stats.get("peak_bytes_in_use")
            mfu = flops / seconds / target.peak(dtype)
            shown = f"{measured / 2**30:.3g}" if measured else "n/a"
            print(
                f"{dtype:<9}{batch:>6}{batch / seconds:>8.1f}{mfu:>6.1%}{shown:>18}"
                f"{predicted / 2**30:>15.3g}{flops / batch / 1e9:>16.3g}",
                flush=True,
            )


def synthetic_folder(preset: str, root: pathlib.Path) -> None:
    """Random JPEGs: `classes` folders of `per_class` images with sides in `sides` (seeded)."""
    _, classes, per_class, sides, *_ = PRESETS[preset]
    rng = np.random.default_rng(0)
    for c in range(classes):
        d = root / f"class_{c:03d}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            h, w = rng.integers(sides[0], sides[1] + 1, size=2)
            pixels = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(d / f"{i}.jpg", quality=85)


def short_run(preset: str, work: pathlib.Path) -> None:
    data = work / "images"
    start = time.perf_counter()
    synthetic_folder(preset, data)
    print(f"synthetic data: {time.perf_counter() - start:.1f} s")
    batches, classes, per_class = PRESETS[preset][:3]
    per_task = classes * per_class * 4 // 5 // 10  # 80% train, 10 tasks
    batch = max(b for b in batches if b <= per_task)
    overrides = {
        "data.source": "folder",
        "data.data_dir": str(data),
        "data.name": "synthetic",
        "data.cache_dir": str(work / "cache"),
        "optim.epochs": 1,
        "optim.peft_freeze_epochs": 0,
        "eval.batch_size": batch,
    }
    cfg = config(preset, overrides, "bfloat16", batch)
    classes, per_class = PRESETS[preset][1], PRESETS[preset][2]
    n = classes * per_class
    run = shapes.shape_run(cfg, (n - n // 5, n // 5, classes))
    counts = project.calls(run)
    flops = sum(
        counts.get(p.name, 0) * p.host_flops
        for p in programs.train_programs(run) + programs.eval_and_method_programs(run)
    )
    peak = local_target().peak("bfloat16")
    flags = [f"--config.{k}={v}" for k, v in overrides.items()]
    flags += [
        f"--config.{k}={v}" for k, v in PRESETS[preset][4].items() if k != "model.peft.blocks"
    ]
    flags += [
        "--config.model.init=random",
        "--config.model.dtype=bfloat16",
        f"--config.optim.batch_size={batch}",
        f"--config.data.store_size={PRESETS[preset][5]}",
    ]
    if preset == "tiny":
        flags.append("--config.model.peft.blocks=(0,1)")
    cmd = [
        sys.executable,
        "-m",
        "aepg_jax.main",
        "--config=configs/imagenet_r.py:tasks=10,method=lae",
        f"--workdir={work / 'run'}",
        *flags,
    ]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        print(done.stderr[-2000:])
        raise SystemExit(f"the shortened run failed ({done.returncode})")
    print(
        f"shortened run (10 tasks x 1 epoch, {n} images, batch {batch}, bfloat16): "
        f"{seconds:.1f} s wall (decode and cache included); plan: {flops / 1e12:.3g} TFLOP, "
        f"{flops / peak:.3g} s at peak, {flops / peak / 0.4:.3g} s at 40% MFU"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=tuple(PRESETS), default="vit_b16")
    p.add_argument("--workdir", default=os.environ.get("TMPDIR", "/tmp") + "/aepg_bench_gpu")
    a = p.parse_args()
    work = pathlib.Path(a.workdir)
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, preset {a.preset}")
    step_rows(a.preset)
    short_run(a.preset, work)


if __name__ == "__main__":
    main()
