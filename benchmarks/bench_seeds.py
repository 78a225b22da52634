"""Many seeds in one program: `num_seeds=S` (one vmapped run) vs S sequential single-seed runs.

Both sides run the embedded default (`configs/default.py`: tiny ViT pretrained on
Fashion-MNIST, 5-task digits, LoRA + aEPG + LAE) end to end (training, evaluation after every
task, checkpoints, reports), seeds `0..S-1`:

* sequential: S runs with `seed=i`, one after the other;
* vmapped: one run with `num_seeds=S`.

`--mode cli` (default) times what a user types: each run is its own
`python -m aepg_jax.main --config=configs/default.py --workdir=... --config.seed=i` process
(the sequential side pays S interpreter starts, imports and data loads, the vmapped side one).
`--mode inprocess` calls `trainer.run` in this process for both sides (no process start; the
sequential side still compiles its steps once per run, as separate runs would).

The shared inputs are built before the clock starts (the decoded data caches and the pretrained
backbone, which every seed shares). Prints the wall time of each side, the ratio, and each
seed's A_T from both sides (they should agree: seed i of the vmapped run is the single run of
seed i).

    python benchmarks/bench_seeds.py                      # S=5, the default as shipped, CLI runs
    python benchmarks/bench_seeds.py --mode inprocess
    python benchmarks/bench_seeds.py --num-seeds 3 --epochs 2 --pretrain-dataset digits  # quick
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

from aepg_jax.config import schema
from aepg_jax.continual import setup as run_setup
from aepg_jax.continual import trainer
from aepg_jax.pretraining import pretrain

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def default_config():
    return schema.from_file(os.path.join(REPO, "configs", "default.py"))


def overrides(args: argparse.Namespace) -> dict[str, object]:
    """The config fields the command line changes, as `--config.<key>` would set them."""
    out: dict[str, object] = {}
    if args.epochs is not None:
        out["optim.epochs"] = args.epochs
        out["optim.peft_freeze_epochs"] = min(
            default_config().optim.peft_freeze_epochs, args.epochs // 2
        )
    if args.tasks is not None:
        out["data.num_tasks"] = args.tasks
    if args.max_steps is not None:
        out["max_steps_per_task"] = args.max_steps
    if args.pretrain_dataset is not None:
        out["pretrain.dataset"] = args.pretrain_dataset
    if args.pretrain_epochs is not None:
        out["pretrain.epochs"] = args.pretrain_epochs
    if args.cache_dir is not None:
        out["data.cache_dir"] = args.cache_dir
        out["pretrain.cache_dir"] = os.path.join(args.cache_dir, "pretrained")
    return out


def make_config(args: argparse.Namespace):
    cfg = default_config()
    for key, value in overrides(args).items():
        *parents, leaf = key.split(".")
        node = cfg
        for part in parents:
            node = node[part]
        node[leaf] = value
    schema.validate(cfg)
    return cfg


def cli_run(args: argparse.Namespace, workdir: str, **fields: object) -> tuple[float, dict]:
    """(wall seconds, results) of one `python -m aepg_jax.main` process on the default."""
    command = [
        sys.executable,
        "-m",
        "aepg_jax.main",
        f"--config={os.path.join(REPO, 'configs', 'default.py')}",
        f"--workdir={workdir}",
    ]
    command += [f"--config.{k}={v}" for k, v in {**overrides(args), **fields}.items()]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"error: {' '.join(command)} failed:\n{done.stderr[-3000:]}")
    name = "results_seeds.json" if fields.get("num_seeds", 1) != 1 else "results.json"
    with open(os.path.join(workdir, name)) as f:
        return seconds, json.load(f)


def timed_run(cfg, workdir: str) -> tuple[float, dict]:
    """(wall seconds, results) of one `trainer.run`; its tables and progress bars are swallowed."""
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        results = trainer.run(cfg, workdir)
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
    parser.add_argument("--mode", choices=("cli", "inprocess"), default="cli")
    args = parser.parse_args(argv)
    if args.num_seeds < 2:
        parser.error("--num-seeds must be >= 2")

    cfg = make_config(args)
    with tempfile.TemporaryDirectory() as tmp:
        # Shared inputs, untimed: data caches and the pretrained backbone.
        setup = time.perf_counter()
        run_setup.prepare_data(cfg)
        if cfg.model.init == "pretrained":
            pretrain.pretrain_backbone(cfg, jax.sharding.Mesh(np.array(jax.devices()), ("data",)))
        setup = time.perf_counter() - setup

        def sequential() -> tuple[float, list[float]]:
            total, a_t = 0.0, []
            for seed in range(args.num_seeds):
                workdir = os.path.join(tmp, f"seed{seed}")
                if args.mode == "cli":
                    seconds, results = cli_run(args, workdir, seed=seed)
                else:
                    c = cfg.copy_and_resolve_references()
                    c.seed = seed
                    seconds, results = timed_run(c, workdir)
                total += seconds
                a_t.append(results["A_T"])
            return total, a_t

        def vmapped() -> tuple[float, list[float]]:
            workdir = os.path.join(tmp, "vmapped")
            if args.mode == "cli":
                seconds, summary = cli_run(args, workdir, num_seeds=args.num_seeds)
            else:
                c = cfg.copy_and_resolve_references()
                c.num_seeds = args.num_seeds
                seconds, summary = timed_run(c, workdir)
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
        f"{jax.devices()[0].platform} x{jax.device_count()}; mode {args.mode}"
        + (" (one `python -m aepg_jax.main` process per run)" if args.mode == "cli" else "")
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
