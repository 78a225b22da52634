"""The jitted train and eval steps of one task (SPEC §4, §6, §7).

State is explicit: `TrainState` (trainable PEFT + heads, optimizer state, LAE's offline PEFT,
the task step, the RNG, the first non-finite step) goes in and out of `train_step`; the frozen
backbone and LwF's previous-task copy are separate, non-differentiated arguments. One
compilation per task: task-dependent sizes (class offset, head sizes, freeze steps, schedule
length) are closed over as Python constants; everything per-step is traced.

A train step, for a uint8 batch `(image, label)`:
  1. `x = train_augment(fold_in(rng, global_step), image)` on the device;
  2. `z = f(x)[:, offset:offset + K]` (the task's local logits), `y = label - offset`;
  3. `L = mean(loss(z, y[, alpha_t]))` `+ w * mean(T^2 KL(old || new))` over the old classes
     for LwF (tasks >= 1), `alpha_t = schedule(task_step)`;
  4. gradients w.r.t. the trainable leaves only; while `task_step < freeze_steps` only the
     heads' (a `lax.cond` branch that back-propagates through the head alone) and the PEFT
     updates and Adam state are gated off (`partition.make_optimizer`);
  5. Adam update; LAE (tasks >= 1): `offline <- d offline + (1 - d) online` (PEFT leaves).
Metrics out: loss, alpha, local entropy, gradient norm.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax

from aepg_jax import losses, partition
from aepg_jax.data import augment

Params = dict[str, Any]


@flax.struct.dataclass
class TrainState:
    """Everything a train step changes."""

    trainable: Params  # PEFT + heads (the online model's trainable leaves)
    opt_state: optax.OptState
    offline_peft: Params  # LAE's EMA copy of the PEFT leaves ({} for other methods)
    task_step: jax.Array  # optimizer steps taken in the current task
    global_step: jax.Array  # optimizer steps since the start of the run
    rng: jax.Array  # the run's base key; per-step keys are fold_in(rng, global_step)
    first_bad_step: jax.Array  # global step of the first non-finite loss, -1 if none


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """Static facts of the task being trained (baked into its compiled step)."""

    offset: int  # first class of the task (in the relabelled order)
    num_classes: int  # classes of the task
    freeze_steps: int  # head-only steps at the start of the task
    lae_ema: bool  # update the offline PEFT after every step (LAE, task >= 1)
    lwf: bool  # add the distillation term (LwF, task >= 1)


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """Static run settings the steps need."""

    image_size: int
    crop_scale: tuple[float, float]
    crop_ratio: tuple[float, float]
    flip_prob: float
    normalize: str
    ema_decay: float
    lwf_temperature: float
    lwf_weight: float


def _peft_of(tree: Params, labels: Params) -> Params:
    return partition.split(tree, labels, (partition.PEFT,))[0]


def make_train_step(
    apply_fn: Callable[..., tuple[jax.Array, dict]],
    loss_fn: Callable[..., jax.Array],
    annealed: bool,
    schedule: optax.Schedule,
    optimizer: optax.GradientTransformationExtraArgs,
    trainable_labels: Params,
    task: TaskSpec,
    cfg: StepConfig,
    lwf_apply_fn: Callable[..., tuple[jax.Array, dict]] | None = None,
) -> Callable[..., tuple[TrainState, dict[str, jax.Array]]]:
    """`step(state, frozen, lwf_params, batch[, train_peft]) -> (state, metrics)`, not jitted.

    `apply_fn(params, images)` is the model's forward pass; `frozen` the backbone leaves;
    `lwf_params` the previous task's full parameter tree and `lwf_apply_fn` its forward pass
    (it has one head fewer), or None. `train_peft` (a bool scalar) overrides the phase flag
    `state.task_step >= freeze_steps`; a vmapped multi-seed step passes it unbatched so that
    the head-only `lax.cond` stays a branch instead of becoming a select of both branches.
    """
    has_peft = bool(jax.tree.leaves(_peft_of(trainable_labels, trainable_labels)))
    stop = task.offset + task.num_classes

    def loss_and_metrics(trainable, frozen, lwf_params, images, labels, alpha):
        logits, _ = apply_fn(partition.merge(trainable, frozen), images)
        local = logits[:, task.offset : stop]
        y = labels - task.offset
        per_example = loss_fn(local, y, alpha=alpha) if annealed else loss_fn(local, y)
        loss = jnp.mean(per_example)
        if task.lwf and lwf_params is not None and task.offset > 0:
            old_logits, _ = lwf_apply_fn(lwf_params, images)
            distill = losses.lwf_distillation(
                logits[:, : task.offset], old_logits[:, : task.offset], cfg.lwf_temperature
            )
            loss = loss + cfg.lwf_weight * jnp.mean(distill)
        return loss, losses.mean_entropy(local)

    def grads_all(trainable, *args):
        return jax.value_and_grad(loss_and_metrics, has_aux=True)(trainable, *args)

    def grads_head_only(trainable, frozen, *args):
        head, peft = partition.split(trainable, trainable_labels, (partition.HEAD,))
        (loss, ent), g_head = jax.value_and_grad(
            lambda h: loss_and_metrics(partition.merge(h, peft), frozen, *args), has_aux=True
        )(head)
        return (loss, ent), partition.merge(g_head, jax.tree.map(jnp.zeros_like, peft))

    def step(
        state: TrainState,
        frozen: Params,
        lwf_params: Params | None,
        batch: dict,
        train_peft: jax.Array | None = None,
    ):
        key = jax.random.fold_in(state.rng, state.global_step)
        images = augment.train_augment(
            key,
            batch["image"],
            cfg.image_size,
            scale=cfg.crop_scale,
            ratio=cfg.crop_ratio,
            flip_prob=cfg.flip_prob,
            normalize_mode=cfg.normalize,
        )
        alpha = jnp.asarray(schedule(state.task_step), jnp.float32)
        if train_peft is None:
            train_peft = state.task_step >= task.freeze_steps
        args = (state.trainable, frozen, lwf_params, images, batch["label"], alpha)
        if has_peft and task.freeze_steps > 0:
            (loss, entropy), grads = jax.lax.cond(train_peft, grads_all, grads_head_only, *args)
        else:
            (loss, entropy), grads = grads_all(*args)
        updates, opt_state = optimizer.update(
            grads, state.opt_state, state.trainable, train_peft=train_peft
        )
        trainable = optax.apply_updates(state.trainable, updates)
        offline = state.offline_peft
        if task.lae_ema:
            online = _peft_of(trainable, trainable_labels)
            d = cfg.ema_decay
            offline = jax.tree.map(lambda e, m: d * e + (1.0 - d) * m, offline, online)
        finite = jnp.isfinite(loss)
        first_bad = jnp.where(
            (state.first_bad_step < 0) & ~finite, state.global_step, state.first_bad_step
        )
        new_state = TrainState(
            trainable=trainable,
            opt_state=opt_state,
            offline_peft=offline,
            task_step=state.task_step + 1,
            global_step=state.global_step + 1,
            rng=state.rng,
            first_bad_step=first_bad,
        )
        metrics = {
            "loss": loss,
            "alpha": alpha,
            "entropy": entropy,
            "grad_norm": optax.tree.norm(grads),
            "train_peft": train_peft,
        }
        return new_state, metrics

    return step


def make_eval_step(
    apply_fn: Callable[..., tuple[jax.Array, dict]],
    num_seen: int,
    lae: bool,
    cfg: StepConfig,
) -> Callable[..., dict[str, jax.Array]]:
    """`eval(online_params, offline_params, batch) -> sums` over the valid rows of a batch.

    Task-agnostic: argmax over all `num_seen` classes. Returns correct counts per predictor
    (`model`, or LAE's `online`, `offline` and `ensemble` = argmax_c max(p_on, p_off)), the
    number of valid rows and the summed entropy of the (online) softmax over the seen classes.
    """

    def eval_step(online: Params, offline: Params | None, batch: dict) -> dict[str, jax.Array]:
        images = augment.test_transform(batch["image"], cfg.image_size, cfg.normalize)
        mask = batch["mask"]
        labels = batch["label"]
        logits_on = apply_fn(online, images)[0][:, :num_seen]
        p_on = jax.nn.softmax(logits_on.astype(jnp.float32), axis=-1)

        def correct(probs):
            return jnp.sum((jnp.argmax(probs, -1) == labels) & mask)

        out = {
            "count": jnp.sum(mask),
            "entropy_sum": jnp.sum(jnp.where(mask, losses.entropy(logits_on), 0.0)),
        }
        if lae:
            logits_off = apply_fn(offline, images)[0][:, :num_seen]
            p_off = jax.nn.softmax(logits_off.astype(jnp.float32), axis=-1)
            out |= {
                "online": correct(p_on),
                "offline": correct(p_off),
                "ensemble": correct(jnp.maximum(p_on, p_off)),
            }
        else:
            out["model"] = correct(p_on)
        return out

    return eval_step
