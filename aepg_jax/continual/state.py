"""The run's train state: building it at a task's start, and its shape in a checkpoint.

The trainable tree during task t is the initial PEFT plus every task's head (head s initialised
from the seed's key, `fold_in(key, 1000 + s)`, present from the start so that the shapes, and
the compiled programs, hold for the whole run) plus whatever the method grows for tasks 0..t
(`fold_in(key, 2000 + t)`); rebuilding it from the keys gives any checkpoint's structure.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import optax

from aepg_jax.continual import train_step as ts
from aepg_jax.continual.setup import Run
from aepg_jax.models import head, partition
from aepg_jax.runs import checkpointing

Params = dict[str, Any]

# Version of the checkpointed state's layout; a checkpoint of another layout is refused.
# 2: the method's state is `TrainState.method_state` (1 had `offline_peft` and an `lwf` item).
# 3: run-static shapes: every task's head from the start, the method state from task 0.
STATE_LAYOUT = 3


def learning_rate(cfg, steps_per_epoch: int) -> float | optax.Schedule:
    """`optim.learning_rate`, constant or decayed per epoch as CODA-P's and InfLoRA's code.

    With `lr(k) = lr * cos(99 pi k / (200 (E - 1)))`, epoch `e = count // steps_per_epoch` of
    E trains at `lr(max(e - 1, 0))`: the reference's `CosineSchedule` sets lr(0) in its
    constructor, then resets its epoch counter to -1, so its first `step()` (at the start of
    epoch 1 in CODA-Prompt, at the end of epoch 0 in InfLoRA) sets lr(0) again. Epochs 0 and
    1 both train at lr; the last trains at lr(E - 2) (4.7e-5 for lr 1e-3, E = 50)."""
    o = cfg.optim
    if o.lr_schedule == "constant":
        return o.learning_rate  # a float keeps Adam's state free of a schedule count
    span = 200.0 * max(o.epochs - 1, 1)

    def schedule(count: jax.Array) -> jax.Array:
        epoch = jnp.minimum(count // steps_per_epoch, o.epochs - 1)
        k = jnp.maximum(epoch - 1, 0)  # the reference's one-epoch lag (docstring)
        return o.learning_rate * jnp.cos(99.0 * jnp.pi * k / span)

    return schedule


def optimizer(
    cfg, trainable: Params, steps_per_epoch: int = 1
) -> optax.GradientTransformationExtraArgs:
    """Adam (`optim.*`) on the PEFT and head leaves; PEFT updates gated by the phase flag.

    With `optim.clip_norm > 0` the gradient's global norm over every trainable leaf is clipped
    first (torch's `clip_grad_norm_` over the parameters that train; in a head-only phase the
    PEFT gradients, which are then discarded, still count in the norm)."""
    o = cfg.optim
    adam = optax.adam(learning_rate(cfg, steps_per_epoch), o.b1, o.b2, o.eps)
    tx = partition.make_optimizer(partition.label_params(trainable), adam)
    if o.clip_norm > 0:
        tx = optax.chain(optax.clip_by_global_norm(o.clip_norm), tx)
    return tx


def with_heads(run: Run, trainable: Params) -> Params:
    """Every task's head added to every seed's tree, head t initialised from
    `fold_in(key, 1000 + t)` as if it grew at task t's start: the tree's shapes hold for the
    whole run (the classes of later tasks are masked, their heads get no gradient)."""

    def one_seed(i: int, tree: Params) -> Params:
        for t, n in enumerate(run.head_sizes):
            tree = head.grow(
                tree, jax.random.fold_in(run.keys[i], 1000 + t), n, run.cfg.model.hidden_size
            )
        return tree

    return run.axis.map(one_seed, trainable)


def grow(run: Run, trainable: Params, task: int) -> Params:
    """Adds the method's own task leaves of task `task` to every seed's tree (the heads are
    there from the start, `with_heads`)."""

    def one_seed(i: int, tree: Params) -> Params:
        return run.method.grow(task, tree, jax.random.fold_in(run.keys[i], 2000 + task))

    return run.axis.map(one_seed, trainable)


def first_trainable(run: Run) -> Params:
    """The trainable tree before task 0's hooks: the initial PEFT and every task's head."""
    return with_heads(run, run.axis.stack(list(run.initial_peft)))


def trainable_for(run: Run, task: int) -> Params:
    """The trainable tree of task `task` as first built (deterministic per seed)."""
    trainable = first_trainable(run)
    for t in range(task + 1):
        trainable = grow(run, trainable, t)
    return trainable


def initial_method_state(run: Run) -> Params:
    """Every seed's method state before task 0 (`Method.init_state` of task 0's tree)."""
    first = run.axis.unstack(trainable_for(run, 0))
    return run.axis.stack([run.method.init_state(tr) for tr in first])


def fresh_state(
    run: Run, trainable: Params, method_state: Params, global_step: int
) -> ts.TrainState:
    """A task's first state: a new optimizer state, task step 0, the seed's RNG."""
    tx = optimizer(run.cfg, run.axis.unstack(trainable)[0])
    states = [
        ts.TrainState(
            trainable=tr,
            opt_state=tx.init(tr),
            method_state=ms,
            task_step=jnp.zeros([], jnp.int32),
            global_step=jnp.asarray(global_step, jnp.int32),
            rng=jax.random.fold_in(key, 7),
            first_bad_step=jnp.asarray(-1, jnp.int32),
        )
        for tr, ms, key in zip(
            run.axis.unstack(trainable), run.axis.unstack(method_state), run.keys, strict=True
        )
    ]
    # Copies: the train step donates its state, which must never alias `initial_peft`.
    state = jax.tree.map(lambda x: jnp.array(x, copy=True), run.axis.stack(states))
    return jax.device_put(state, run.replicated)


def checkpoint_target(run: Run, meta: dict) -> dict[str, ts.TrainState]:
    """A state of the structure of the checkpoint described by `meta` (values arbitrary)."""
    where = os.path.join(run.workdir, "checkpoints")
    if meta.get("state_layout") != STATE_LAYOUT:
        raise checkpointing.IncompatibleCheckpoint(
            f"The checkpoints in {where} were written by an older aepg_jax (state layout "
            f"{meta.get('state_layout', 1)}, this one reads {STATE_LAYOUT}); use a new workdir."
        )
    if meta.get("seeds") != list(run.axis.seeds):
        raise checkpointing.IncompatibleCheckpoint(
            f"The checkpoints in {where} hold seeds {meta.get('seeds')}, this run trains "
            f"{list(run.axis.seeds)}; use a new workdir."
        )
    task, phase = meta["task"], meta["phase"]
    trainable = trainable_for(run, task)
    one = run.method.state_like(task, phase, lambda t: run.axis.unstack(trainable_for(run, t))[0])
    method_state = run.axis.stack([one] * len(run.axis.seeds))
    return {"state": fresh_state(run, trainable, method_state, 0)}
