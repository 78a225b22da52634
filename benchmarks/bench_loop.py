"""Training-loop overhead: per-step Python loop over the host loader vs `lax.scan` chunks with
the task's data resident on the device (`optim.steps_per_call`), on the embedded default's tiny
ViT (random backbone, so no pretraining is needed).

    python benchmarks/bench_loop.py [--steps 200] [--steps-per-call 0 (= one epoch)] [--batch 32]

For each mode one task is trained twice: the first pass includes compilation and is reported
apart; the second is timed. Prints steps/s of both modes and the ratio, measured in this run.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import jax

from aepg_jax.config import schema
from aepg_jax.continual import setup, trainer
from aepg_jax.continual.programs import build_programs
from aepg_jax.continual.results import Bookkeeping
from aepg_jax.runs import checkpointing

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def default_config():
    return schema.from_file(os.path.join(REPO, "configs", "default.py"))


def time_task(cfg, workdir: str) -> tuple[float, float]:
    """(first pass seconds incl. compile, second pass seconds) of training task 0."""
    run = setup.build(cfg, workdir)
    programs = build_programs(run)
    book = Bookkeeping(run)
    ckpt = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"))
    times = []
    try:
        for _ in range(2):
            state = trainer.begin_task(run, 0, None)
            start = time.perf_counter()
            state = trainer.train_task(run, programs, book, ckpt, 0, state, 0)
            jax.block_until_ready(state.trainable)
            times.append(time.perf_counter() - start)
    finally:
        ckpt.close()
        book.close()
    return times[0], times[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="training steps of the task")
    parser.add_argument(
        "--steps-per-call", type=int, default=0, help="scan chunk length (0: one epoch)"
    )
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for mode in ("per-step loop", "lax.scan chunks"):
            cfg = default_config()
            cfg.model.init = "random"
            cfg.data.cache_dir = os.path.join(tmp, "cache")
            cfg.data.num_tasks = 5
            cfg.optim.batch_size = args.batch
            cfg.optim.epochs = 1000
            cfg.max_steps_per_task = args.steps
            cfg.log_every_steps = args.steps
            per_epoch = 287 // args.batch  # digits task 0: 287 training images
            k = args.steps_per_call or per_epoch
            cfg.optim.steps_per_call = 1 if mode == "per-step loop" else k
            first, second = time_task(cfg, os.path.join(tmp, mode.replace(" ", "_")))
            results[mode] = (first, second, cfg.optim.steps_per_call)

    print(
        f"device: {jax.devices()[0].device_kind} x{jax.device_count()}, {os.cpu_count()} CPU "
        f"threads; tiny ViT (configs/default.py shape), batch {args.batch}, {args.steps} steps"
    )
    for mode, (first, second, k) in results.items():
        print(
            f"{mode:<16} (steps_per_call={k:>3}): first pass {first:6.1f} s (incl. compile), "
            f"timed pass {args.steps / second:7.1f} steps/s"
        )
    ratio = results["per-step loop"][1] / results["lax.scan chunks"][1]
    print(f"ratio scan / per-step: {ratio:.2f}x")


if __name__ == "__main__":
    main()
