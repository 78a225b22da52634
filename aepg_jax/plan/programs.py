"""Every jitted program a continual run executes, as `(function, arguments)` to lower, built by
the run's own factories (no second construction of a step):

  train task 1            `continual/programs.py` `run_step_fn` of task 0 (PEFT and heads train)
  train task T head-only  task T-1's step in its head-only phase (when it has one)
  train task T            task T-1's step training PEFT and heads (its largest head set)
  eval after task T       `eval_fn_of` over all T tasks' heads
  <method program>        `Method.host_programs` (e.g. InfLoRA's covariance pass), one seed

with the run's donation (the train state) and `num_seeds` vmapping. A task's step is compiled
once per phase with the phase flag fixed (the run compiles one program with a `lax.cond` over
both; its memory is that of the larger branch). Arguments are host trees whose leaves become
`ShapeDtypeStruct`s with the target mesh's shardings (`Program.sharded`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from aepg_jax.continual import setup
from aepg_jax.continual.programs import eval_fn_of, run_step_fn, task_spec
from aepg_jax.continual.setup import Run
from aepg_jax.data import loader

REPLICATED, BATCH, SEEDS_BATCH = "replicated", "batch", "seeds_batch"


@dataclasses.dataclass(frozen=True)
class Program:
    """One jitted program of the run and how often the run calls it."""

    name: str
    kind: str  # train | eval | method
    fn: Callable
    args: tuple  # host trees (arrays or ShapeDtypeStructs)
    layouts: tuple[str, ...]  # per argument: REPLICATED | BATCH | SEEDS_BATCH
    donate: tuple[int, ...]
    images: int  # images per call, all seeds together

    def sharded(self, mesh: Mesh) -> tuple:
        """The arguments as `ShapeDtypeStruct`s laid out on `mesh`."""
        specs = {
            REPLICATED: PartitionSpec(),
            BATCH: PartitionSpec(loader.DATA_AXIS),
            SEEDS_BATCH: PartitionSpec(None, loader.DATA_AXIS),
        }

        def one(tree, layout):
            sharding = NamedSharding(mesh, specs[layout])
            return jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(jnp.shape(x), x.dtype, sharding=sharding), tree
            )

        return tuple(one(a, lay) for a, lay in zip(self.args, self.layouts, strict=True))

    def lower(self, mesh: Mesh) -> jax.stages.Lowered:
        return jax.jit(self.fn, donate_argnums=self.donate).lower(*self.sharded(mesh))

    @functools.cached_property
    def host_flops(self) -> float:
        """Global FLOPs per call lowered for one host CPU device (no compile: the cost analysis
        of the lowered module; computed once per program)."""
        mesh = loader.data_mesh(jax.devices("cpu")[:1])
        return float(self.lower(mesh).cost_analysis()["flops"])


def _batch(run: Run, batch_size: int, stacked: bool, mask: bool) -> dict[str, Any]:
    """A loader batch's shapes (`data/loader.py`): uint8 images at `data.store_size`."""
    size = run.cfg.data.store_size
    lead = (len(run.axis.seeds),) if stacked else ()
    out = {
        "image": jax.ShapeDtypeStruct((*lead, batch_size, size, size, 3), jnp.uint8),
        "label": jax.ShapeDtypeStruct((*lead, batch_size), jnp.int32),
    }
    if mask:
        out["mask"] = jax.ShapeDtypeStruct((*lead, batch_size), jnp.bool_)
    return out


def task_state(run: Run, t: int):
    """Task `t`'s train state at its start, as `setup.checkpoint_target` rebuilds it."""
    trainable = setup.trainable_for(run, t)
    one = run.method.init_state(run.axis.unstack(setup.trainable_for(run, 0))[0])
    method_state = run.axis.stack([one] * len(run.axis.seeds))
    return setup.fresh_state(run, trainable, method_state, 0)


def train_programs(run: Run) -> list[Program]:
    """The train steps: task 1's, and the last task's per phase."""
    cfg, last = run.cfg, run.num_tasks - 1
    batch_size = cfg.optim.batch_size
    vmapped = run.axis.vmapped
    batch = _batch(run, batch_size, stacked=vmapped, mask=True)
    batch_layout = SEEDS_BATCH if vmapped else BATCH
    images = batch_size * len(run.axis.seeds)
    out = []
    tasks = [(0, None, "train task 1")]
    if last > 0:
        if task_spec(run, last).freeze_steps > 0:
            tasks.append((last, False, f"train task {last + 1} head-only"))
        tasks.append((last, True, f"train task {last + 1}"))
    for t, phase, name in tasks:
        state = task_state(run, t)
        fn = run_step_fn(run, t, phase=phase)
        out.append(
            Program(
                name,
                "train",
                fn,
                (state, run.frozen, batch),
                (REPLICATED, REPLICATED, batch_layout),
                (0,),
                images,
            )
        )
    return out


def eval_and_method_programs(run: Run) -> list[Program]:
    """The evaluation after the last task and the method's own programs at the last task."""
    last = run.num_tasks - 1
    state = task_state(run, last)
    eval_size = run.cfg.eval.batch_size
    eval_batch = _batch(run, eval_size, stacked=False, mask=True)
    seeds = len(run.axis.seeds)
    out = [
        Program(
            f"eval after task {last + 1}",
            "eval",
            eval_fn_of(run, last),
            (state.trainable, state.method_state, run.frozen, eval_batch),
            (REPLICATED, REPLICATED, REPLICATED, BATCH),
            (),
            eval_size * seeds,
        )
    ]
    one_trainable = run.axis.unstack(state.trainable)[0]
    one_state = run.axis.unstack(state.method_state)[0]
    frozen = run.frozen
    if run.frozen_axis == 0:
        frozen = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), frozen)
    hosted = run.method.host_programs(one_trainable, one_state, frozen, eval_batch, last)
    for name, (fn, args, _passes) in hosted.items():
        layouts = tuple(BATCH if a is eval_batch else REPLICATED for a in args)
        out.append(Program(f"{run.method.name} {name}", "method", fn, args, layouts, (), eval_size))
    return out


def method_passes(run: Run) -> dict[str, int]:
    """Per method program: passes over each task's training data, per seed."""
    last = run.num_tasks - 1
    state = task_state(run, last)
    one_trainable = run.axis.unstack(state.trainable)[0]
    one_state = run.axis.unstack(state.method_state)[0]
    batch = _batch(run, run.cfg.eval.batch_size, stacked=False, mask=True)
    hosted = run.method.host_programs(one_trainable, one_state, run.frozen, batch, last)
    return {f"{run.method.name} {name}": passes for name, (_, _, passes) in hosted.items()}
