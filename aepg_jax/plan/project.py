"""The whole run's work from its own step counts: calls of each program, projected wall time.

Calls: task 1's step `plan_task(task 0).total_steps` times; tasks 2..T's steps in their head-only
phase `freeze_steps` times and in the PEFT phase the rest (`plan_task`), costed by the last
task's programs (the head sizes differ by a few classes); after task t the evaluation runs
`ceil(test_i / eval.batch_size)` batches for every seen task i <= t; a method program runs its
passes over each task's training data per seed. Time = sum over programs of calls x FLOPs per
call / (peak FLOP/s of the target x MFU); the HBM floor is calls x bytes accessed / (bandwidth x
devices). Host work (data loading, checkpoints, the methods' host hooks) is not counted.
"""

from __future__ import annotations

import dataclasses

from aepg_jax.continual.programs import plan_task
from aepg_jax.continual.setup import Run
from aepg_jax.data import loader
from aepg_jax.plan import programs as programs_lib
from aepg_jax.plan.analysis import Cost
from aepg_jax.plan.targets import Target


def calls(run: Run) -> dict[str, int]:
    """Program name -> calls in the whole run."""
    cfg, tasks = run.cfg, run.data.tasks.tasks
    last = len(tasks)
    plans = [plan_task(cfg, task) for task in tasks]
    out = {"train task 1": plans[0].total_steps}
    if last > 1:
        out[f"train task {last} head-only"] = sum(p.freeze_steps for p in plans[1:])
        out[f"train task {last}"] = sum(p.total_steps - p.freeze_steps for p in plans[1:])
    eval_size = cfg.eval.batch_size
    per_task = [loader.num_batches(len(t.test_indices), eval_size, False) for t in tasks]
    out[f"eval after task {last}"] = sum(sum(per_task[: t + 1]) for t in range(last))
    train_batches = sum(loader.num_batches(len(t.train_indices), eval_size, False) for t in tasks)
    for name, passes in programs_lib.method_passes(run).items():
        out[name] = passes * len(run.axis.seeds) * train_batches
    return out


@dataclasses.dataclass(frozen=True)
class Projection:
    flops: float  # whole run
    bytes_accessed: float
    at_peak: float  # seconds
    hbm_floor: float  # seconds


def project(run: Run, costs: list[Cost], target: Target) -> Projection:
    counts = calls(run)
    by_name = {c.name: c for c in costs}
    flops = sum(counts[n] * by_name[n].flops for n in counts if n in by_name)
    accessed = sum(counts[n] * by_name[n].bytes_accessed for n in counts if n in by_name)
    peak = target.peak(run.cfg.model.dtype)
    bandwidth = target.chip.bandwidth * target.num_devices
    return Projection(flops, accessed, flops / peak, accessed / bandwidth)
