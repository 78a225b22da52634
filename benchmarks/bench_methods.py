"""Training-step time of each continual method relative to plain LoRA, in one process.

    python benchmarks/bench_methods.py [--model tiny|vit_b16] [--batch 32] [--steps 10] [--rounds 3]

Each method's real jitted step (`continual.programs.run_step_fn`: its forward, e.g. the prompt
methods' extra query pass, its loss terms, Adam, its per-step update) on task 1 of the embedded
default's data (digits), a random backbone (the step's cost does not depend on the weights).
`tiny` is the default's ViT; `vit_b16` is ViT-B/16 at 224 px (PEFT on blocks 0-4), slow on a
CPU. After one compiling call per method, rounds alternate between the methods (`--steps`
steps each); the table gives the median step time and its ratio to plain LoRA's.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
import time

import jax

from aepg_jax.config import schema
from aepg_jax.continual import programs, setup, trainer
from aepg_jax.data import loader

DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), "..", "configs", "default.py")
METHODS = ("plain", "lae", "lwf", "l2p", "dualprompt", "coda_prompt", "inflora")


def method_config(name: str, model: str, batch: int, cache: str):
    """configs/default.py with `method.name=name`, a random backbone, `batch` images a step."""
    cfg = schema.from_file(DEFAULT_CONFIG)
    cfg.method.name = name
    cfg.model.init = "random"
    cfg.data.cache_dir = cache
    cfg.optim.batch_size = batch
    cfg.optim.peft_freeze_epochs = 0  # time the full step, PEFT or prompts included
    if model == "vit_b16":
        b16 = schema.base_config("vit_b16").model
        for field in ("patch_size", "hidden_size", "depth", "num_heads", "mlp_dim", "image_size"):
            cfg.model[field] = b16[field]
        cfg.model.peft.blocks = (0, 1, 2, 3, 4)
        cfg.data.store_size = 256
    return cfg


def stepper(cfg, workdir: str):
    """`(step(state) -> state, state)` of task 1 (task 0 set up and skipped: earlier tasks'
    state exists, as in a real run), over a fixed list of batches."""
    run = setup.build(cfg, workdir)
    state = trainer.end_task(run, 0, trainer.begin_task(run, 0, None))
    state = trainer.begin_task(run, 1, state)
    task = run.data.tasks.tasks[1]
    batches = list(
        itertools.islice(
            loader.iterate(
                run.data.train.images,
                run.data.tasks.train_labels,
                task.train_indices,
                cfg.optim.batch_size,
                run.mesh,
                train=True,
                seed=0,
                epoch=0,
            ),
            4,
        )
    )
    fn = jax.jit(programs.run_step_fn(run, 1), donate_argnums=(0,))
    counter = itertools.count()

    def step(state):
        state, metrics = fn(state, run.frozen, batches[next(counter) % len(batches)])
        return state, metrics

    return step, state


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", choices=("tiny", "vit_b16"))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--methods", default=",".join(METHODS))
    args = parser.parse_args(argv)
    names = args.methods.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        steppers = {}
        for name in names:
            cfg = method_config(name, args.model, args.batch, os.path.join(tmp, "cache"))
            step, state = stepper(cfg, os.path.join(tmp, name))
            state, m = step(state)  # compiles
            jax.block_until_ready(m)
            steppers[name] = [step, state]
        times: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(args.rounds):
            for name in names:
                step, state = steppers[name]
                for _ in range(args.steps):
                    start = time.perf_counter()
                    state, m = step(state)
                    jax.block_until_ready(m)
                    times[name].append(time.perf_counter() - start)
                steppers[name][1] = state
    base = statistics.median(times[names[0]])
    print(f"{args.model}, batch {args.batch}, {args.rounds} x {args.steps} steps per method")
    print(f"{'method':<12} {'step ms':>9} {'vs ' + names[0]:>10}")
    for name in names:
        t = statistics.median(times[name])
        print(f"{name:<12} {1000 * t:>9.1f} {t / base:>9.2f}x")


if __name__ == "__main__":
    main()
