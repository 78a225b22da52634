"""Pure train and eval steps of a from-scratch ResNet (docs/algorithm.md §9).

A train step on a uint8 batch `(image, label)` of global size B:

    x      = RandomCrop(S, pad) + flip + standardize, key = fold_in(rng, step)
    z, bs' = f(params, bs, x, train=True)        BatchNorm: batch statistics of the B examples
    L      = mean_b loss(z_b, y_b [, alpha_t])   e.g. mix: alpha CE + (1 - alpha) EPG
    g      = grad L                              (no gradient to the running statistics bs)
    v      = m v + g + wd params;  params -= lr_t v      (torch SGD = optax.sgd(momentum=m))

`lr_t` is piecewise constant in steps (milestones in epochs x steps per epoch). Under `jax.jit`
with the batch sharded over devices and the state replicated, the BatchNorm mean and variance
are reductions over the global batch: synchronised BatchNorm, the same numbers as one device.
The step also returns the sums that make the epoch's train accuracy and mean entropy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import chex
import flax
import jax
import jax.numpy as jnp
import optax

from aepg_jax import losses
from aepg_jax.data import augment

Params = Any


@flax.struct.dataclass
class TrainState:
    """Everything a train step changes (one seed)."""

    params: Params
    batch_stats: Params
    opt_state: optax.OptState
    step: jax.Array  # optimizer steps taken
    rng: jax.Array  # per-step keys are fold_in(rng, step)


@dataclasses.dataclass(frozen=True)
class AugmentConfig:
    """Static data-augmentation settings."""

    pad: int
    flip_prob: float
    mean: tuple[float, ...]
    std: tuple[float, ...]


def make_optimizer(
    learning_rate: float,
    momentum: float,
    nesterov: bool,
    weight_decay: float,
    milestones: tuple[int, ...],
    lr_decay: float,
    steps_per_epoch: int,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """torch `SGD(lr, momentum, weight_decay)` + `MultiStepLR(milestones, gamma=lr_decay)`.

    The schedule is `lr * lr_decay^k` after `k` milestones, counted in steps
    (`epoch * steps_per_epoch`): epoch `e` (0-based) runs at `lr * lr_decay^#{m <= e}`.
    """
    schedule = optax.piecewise_constant_schedule(
        learning_rate, {int(e) * steps_per_epoch: lr_decay for e in milestones}
    )
    sgd = optax.sgd(schedule, momentum=momentum or None, nesterov=nesterov)
    tx = optax.chain(optax.add_decayed_weights(weight_decay), sgd) if weight_decay else sgd
    return tx, schedule


def make_train_step(
    apply_fn: Callable[..., Any],
    loss_fn: Callable[..., jax.Array],
    annealed: bool,
    alpha_schedule: optax.Schedule,
    optimizer: optax.GradientTransformation,
    lr_schedule: optax.Schedule,
    aug: AugmentConfig,
) -> Callable[[TrainState, dict[str, jax.Array]], tuple[TrainState, dict[str, jax.Array]]]:
    """`step(state, batch) -> (state, metrics)`, pure and not jitted.

    `apply_fn(variables, x, train=..., mutable=...)` is the ResNet's `apply`. Metrics: `loss`,
    `alpha`, `lr` (of this step), `correct` and `entropy_sum` (sums over the batch).
    """

    def loss_and_aux(params, batch_stats, x, labels, alpha):
        logits, updated = apply_fn(
            {"params": params, "batch_stats": batch_stats}, x, train=True, mutable=["batch_stats"]
        )
        per_example = loss_fn(logits, labels, alpha=alpha) if annealed else loss_fn(logits, labels)
        return jnp.mean(per_example), (logits, updated["batch_stats"])

    def step(state: TrainState, batch: dict[str, jax.Array]):
        images, labels = batch["image"], batch["label"]
        chex.assert_rank(images, 4)
        chex.assert_shape(labels, images.shape[:1])
        key = jax.random.fold_in(state.rng, state.step)
        x = augment.cifar_train_augment(
            key, images, pad=aug.pad, flip_prob=aug.flip_prob, mean=aug.mean, std=aug.std
        )
        alpha = jnp.asarray(alpha_schedule(state.step), jnp.float32)
        (loss, (logits, batch_stats)), grads = jax.value_and_grad(loss_and_aux, has_aux=True)(
            state.params, state.batch_stats, x, labels, alpha
        )
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        new_state = TrainState(
            params=optax.apply_updates(state.params, updates),
            batch_stats=batch_stats,
            opt_state=opt_state,
            step=state.step + 1,
            rng=state.rng,
        )
        metrics = {
            "loss": loss,
            "alpha": alpha,
            "lr": jnp.asarray(lr_schedule(state.step), jnp.float32),
            "correct": jnp.sum(jnp.argmax(logits, -1) == labels),
            "entropy_sum": jnp.sum(losses.entropy(logits)),
        }
        return new_state, metrics

    return step


def make_eval_step(
    apply_fn: Callable[..., Any], mean: tuple[float, ...], std: tuple[float, ...]
) -> Callable[[Params, Params, dict[str, jax.Array]], dict[str, jax.Array]]:
    """`eval(params, batch_stats, batch) -> {correct, entropy_sum, count}` over valid rows.

    Eval mode: BatchNorm uses the running statistics; images are only standardised.
    """

    def eval_step(params, batch_stats, batch):
        x = augment.standardize(batch["image"], mean, std)
        logits = apply_fn({"params": params, "batch_stats": batch_stats}, x, train=False)
        mask = batch["mask"]
        return {
            "correct": jnp.sum((jnp.argmax(logits, -1) == batch["label"]) & mask),
            "entropy_sum": jnp.sum(jnp.where(mask, losses.entropy(logits), 0.0)),
            "count": jnp.sum(mask),
        }

    return eval_step
