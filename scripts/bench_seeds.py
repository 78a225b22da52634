"""Many seeds in one program: `num_seeds=S` (one vmapped run) vs S sequential single-seed runs.

Both sides run the embedded default (`configs/default.py`: tiny ViT pretrained on
Fashion-MNIST, 5-task digits, LoRA + aEPG + LAE) end to end through `loop.run` (training,
evaluation after every task, checkpoints, reports), seeds `0..S-1`, in this one process:

* sequential: `loop.run(cfg with seed=i)` for i = 0..S-1, one after the other;
* vmapped: `loop.run(cfg with num_seeds=S)` once.

The shared inputs are built before the clock starts (the decoded data caches and the pretrained
backbone, which every seed shares); each side then pays its own compilation, as separate runs
would (in separate processes the sequential side would also pay S interpreter starts and data
loads, which this in-process measurement leaves out). Prints the wall time of each side, the
ratio, and each seed's A_T from both sides (they should agree: seed i of the vmapped run is the
single run of seed i).

    python scripts/bench_seeds.py                      # S=5, the default as shipped
    python scripts/bench_seeds.py --num-seeds 3 --epochs 2 --pretrain-dataset digits  # quick
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import io
import os
import platform
import sys
import tempfile
import time

import jax
import numpy as np

from aepg_jax import config_lib, pretrain
from aepg_jax.continual import loop

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def default_config():
    spec = importlib.util.spec_from_file_location(
        "default", os.path.join(REPO, "configs", "default.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def make_config(args: argparse.Namespace):
    cfg = default_config()
    if args.epochs is not None:
        cfg.optim.epochs = args.epochs
        cfg.optim.peft_freeze_epochs = min(cfg.optim.peft_freeze_epochs, args.epochs // 2)
    if args.tasks is not None:
        cfg.data.num_tasks = args.tasks
    if args.max_steps is not None:
        cfg.max_steps_per_task = args.max_steps
    if args.pretrain_dataset is not None:
        cfg.pretrain.dataset = args.pretrain_dataset
    if args.pretrain_epochs is not None:
        cfg.pretrain.epochs = args.pretrain_epochs
    if args.cache_dir is not None:
        cfg.data.cache_dir = args.cache_dir
        cfg.pretrain.cache_dir = os.path.join(args.cache_dir, "pretrained")
    config_lib.validate(cfg)
    return cfg


def timed_run(cfg, workdir: str) -> tuple[float, dict]:
    """(wall seconds, results) of one `loop.run`; its tables and progress bars are swallowed."""
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        results = loop.run(cfg, workdir)
    return time.perf_counter() - start, results


def main(argv: list[str] | None = None) -> dict[str, tuple[float, list[float]]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-seeds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=None, help="default: the config's (20)")
    parser.add_argument("--tasks", type=int, default=None, help="default: the config's (5)")
    parser.add_argument("--max-steps", type=int, default=None, help="cap on steps per task")
    parser.add_argument("--pretrain-dataset", default=None, help="default: fashion_mnist")
    parser.add_argument("--pretrain-epochs", type=int, default=None)
    parser.add_argument("--cache-dir", default=None, help="default: the config's")
    parser.add_argument(
        "--order", choices=("vmapped-first", "sequential-first"), default="vmapped-first"
    )
    args = parser.parse_args(argv)
    if args.num_seeds < 2:
        parser.error("--num-seeds must be >= 2")

    cfg = make_config(args)
    with tempfile.TemporaryDirectory() as tmp:
        # Shared inputs, untimed: data caches and the pretrained backbone.
        setup = time.perf_counter()
        loop.prepare_data(cfg)
        if cfg.model.init == "pretrained":
            pretrain.pretrain_backbone(cfg, jax.sharding.Mesh(np.array(jax.devices()), ("data",)))
        setup = time.perf_counter() - setup

        def sequential() -> tuple[float, list[float]]:
            total, a_t = 0.0, []
            for seed in range(args.num_seeds):
                c = cfg.copy_and_resolve_references()
                c.seed = seed
                seconds, results = timed_run(c, os.path.join(tmp, f"seed{seed}"))
                total += seconds
                a_t.append(results["A_T"])
            return total, a_t

        def vmapped() -> tuple[float, list[float]]:
            c = cfg.copy_and_resolve_references()
            c.num_seeds = args.num_seeds
            seconds, summary = timed_run(c, os.path.join(tmp, "vmapped"))
            return seconds, [r["A_T"] for r in summary["per_seed"]]

        sides = {"vmapped": vmapped, "sequential": sequential}
        order = ["vmapped", "sequential"]
        if args.order == "sequential-first":
            order.reverse()
        measured = {name: sides[name]() for name in order}

    s = args.num_seeds
    print(
        f"date {datetime.date.today()}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPU threads, jax {jax.__version__} on "
        f"{jax.devices()[0].platform} x{jax.device_count()}"
    )
    print(
        f"configs/default.py: {cfg.data.num_tasks} tasks, {cfg.optim.epochs} epochs/task"
        + (f", at most {cfg.max_steps_per_task} steps/task" if cfg.max_steps_per_task else "")
        + f", batch {cfg.optim.batch_size}, seeds 0..{s - 1}; shared setup "
        f"(caches, pretrained backbone) {setup:.1f} s, untimed"
    )
    seq_s, seq_a = measured["sequential"]
    vm_s, vm_a = measured["vmapped"]
    print(f"{s} sequential runs : {seq_s:8.1f} s ({seq_s / s:.1f} s per seed)")
    print(f"1 vmapped run     : {vm_s:8.1f} s (num_seeds={s})")
    print(f"speed-up sequential / vmapped: {seq_s / vm_s:.2f}x")
    print(
        "A_T per seed (sequential | vmapped): "
        + ", ".join(
            f"{i}: {a:.2f} | {b:.2f}" for i, (a, b) in enumerate(zip(seq_a, vm_a, strict=True))
        )
    )
    diff = float(np.max(np.abs(np.array(seq_a) - np.array(vm_a))))
    print(f"max |A_T difference|: {diff:.4f} points")
    sys.stdout.flush()
    return measured


if __name__ == "__main__":
    main()
