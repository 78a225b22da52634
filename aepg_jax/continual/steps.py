"""The pure programs of a continual run: the train step, the evaluation step and the optimizer
(docs/algorithm.md §4, §6), generic over the continual method. Nothing here is jitted: the
trainer (`trainer.py`) lifts them over the seed axis and jits each once per run.

State is explicit: `TrainState` (trainable PEFT + heads, optimizer state, the method's state,
the task step, the RNG, the first non-finite step) goes in and out of the step; the frozen
backbone is a separate, non-differentiated argument. One compilation per run: the model has every
task's head from the start and the task (index, class offset and count, freeze steps, steps per
epoch, schedule length) is a traced argument, so the same program trains every task.

A train step, for a uint8 batch `(image, label)`:
  1. `x = train_augment(fold_in(rng, global_step), image)` on the device;
  2. `logits, extra = method.forward(x)` over every class of the run; `z = logits[:, offset:
     offset + K]` (the task's local logits, a dynamic slice), `y = label - offset`: the later
     tasks' heads get exactly zero gradient, so Adam leaves them at their initial values;
  3. `L = mean(loss(z, y[, alpha_t])) (+ extra)`, `alpha_t = schedule(task_step)`;
  4. gradients w.r.t. the trainable leaves only; while `task_step < freeze_steps` only the
     heads' (a `lax.cond` branch that back-propagates through the head alone) and the PEFT
     updates and Adam state are gated off (`partition.make_optimizer`);
  5. Adam update; `method_state = method.after_step(trainable, method_state)`.
Metrics out: loss, alpha, local entropy, gradient norm, the phase flag, and `lr_<label>`, the
learning rate Adam applies to each trainable label's leaves at this step (`applied_rates`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax

from aepg_jax import losses, schedules
from aepg_jax.data import augment
from aepg_jax.methods import Method, Network, TaskSpec
from aepg_jax.methods.base import NEG
from aepg_jax.models import partition
from aepg_jax.runs import predictions

Params = dict[str, Any]


@flax.struct.dataclass
class TrainState:
    """Everything a train step changes."""

    trainable: Params  # PEFT + heads (the online model's trainable leaves)
    opt_state: optax.OptState
    method_state: Params  # the continual method's own state ({} for plain)
    task_step: jax.Array  # optimizer steps taken in the current task
    global_step: jax.Array  # optimizer steps since the start of the run
    rng: jax.Array  # the run's base key; per-step keys are fold_in(rng, global_step)
    first_bad_step: jax.Array  # global step of the first non-finite loss, -1 if none


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """Static run settings of the input pipeline."""

    image_size: int
    crop_scale: tuple[float, float]
    crop_ratio: tuple[float, float]
    flip_prob: float
    normalize: str


def local_logits(
    logits: jax.Array, labels: jax.Array, task: TaskSpec
) -> tuple[jax.Array, jax.Array]:
    """`(z, y)`: the task's own logits (B, K) and labels in [0, K), K = the widest task.

    With equal task sizes `z = logits[:, offset:offset + K]` (a dynamic slice: `offset` may be
    traced); otherwise the columns past the task's `num_classes` are masked (`NEG`)."""
    width = max(task.head_sizes)
    if len(set(task.head_sizes)) == 1:
        local = jax.lax.dynamic_slice_in_dim(logits, task.offset, width, axis=1)
    else:
        pad = jnp.full((logits.shape[0], width), NEG, logits.dtype)
        wide = jnp.concatenate([logits, pad], axis=1)
        local = jax.lax.dynamic_slice_in_dim(wide, task.offset, width, axis=1)
        own = jnp.arange(width) < task.num_classes
        local = jnp.where(own[None], local, jnp.asarray(NEG, logits.dtype))
    return local, labels - task.offset


def _gradient_fns(
    method: Method,
    net: Network,
    loss_fn: Callable[..., jax.Array],
    annealed: bool,
    trainable_labels: Params,
) -> tuple[Callable, Callable]:
    """`(grads_all, grads_head_only)`: `f(trainable, frozen, method_state, images, labels,
    alpha, task) -> ((loss, local entropy), grads)`; the second back-propagates through the
    heads only (zero PEFT gradients), for the head-only epochs."""

    def loss_and_metrics(trainable, frozen, method_state, images, labels, alpha, task):
        logits, extra = method.forward(net, trainable, frozen, method_state, images, task)
        local, y = local_logits(logits, labels, task)
        per_example = loss_fn(local, y, alpha=alpha) if annealed else loss_fn(local, y)
        loss = jnp.mean(per_example)
        if extra is not None:
            loss = loss + extra
        return loss, losses.mean_entropy(local)

    def grads_all(trainable, *args):
        return jax.value_and_grad(loss_and_metrics, has_aux=True)(trainable, *args)

    def grads_head_only(trainable, frozen, *args):
        head, peft = partition.split(trainable, trainable_labels, (partition.HEAD,))
        (loss, ent), g_head = jax.value_and_grad(
            lambda h: loss_and_metrics(partition.merge(h, peft), frozen, *args), has_aux=True
        )(head)
        return (loss, ent), partition.merge(g_head, jax.tree.map(jnp.zeros_like, peft))

    return grads_all, grads_head_only


def make_train_step(
    method: Method,
    net: Network,
    loss_fn: Callable[..., jax.Array],
    annealed: bool,
    make_schedule: Callable[[jax.Array], optax.Schedule],
    optimizer: optax.GradientTransformationExtraArgs,
    trainable_labels: Params,
    head_only_phase: bool,
    cfg: StepConfig,
    rate: float | optax.Schedule,
    lr_scales: dict[str, float] | None = None,
) -> Callable[..., tuple[TrainState, dict[str, jax.Array]]]:
    """`step(state, frozen, batch, task, total_steps[, train_peft]) -> (state, metrics)`, not
    jitted; `task` (a `TaskSpec` of int32 scalars) and the task's `total_steps` are traced.
    `rate` is the learning rate `optimizer` was built with (`learning_rate`), and `lr_scales`
    its labels' scales, for the metrics.

    `frozen` holds the backbone leaves. `make_schedule(T)` is the alpha schedule of a task of
    T steps. `head_only_phase` (static: the run has head-only epochs and PEFT leaves) makes the
    gradient a `lax.cond` on the phase flag `state.task_step >= task.freeze_steps`;
    `train_peft` (a bool scalar) overrides the flag: a vmapped multi-seed step passes it
    unbatched so that the cond stays a branch instead of becoming a select of both branches.
    """
    grads_all, grads_head_only = _gradient_fns(method, net, loss_fn, annealed, trainable_labels)

    def step(
        state: TrainState,
        frozen: Params,
        batch: dict,
        task: TaskSpec,
        total_steps: jax.Array,
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
        alpha = jnp.asarray(make_schedule(total_steps)(state.task_step), jnp.float32)
        if train_peft is None:
            train_peft = state.task_step >= task.freeze_steps
        args = (state.trainable, frozen, state.method_state, images, batch["label"], alpha, task)
        if head_only_phase:
            (loss, entropy), grads = jax.lax.cond(train_peft, grads_all, grads_head_only, *args)
        else:
            (loss, entropy), grads = grads_all(*args)
        rates = applied_rates(state.opt_state, rate, lr_scales)  # at this update's counts
        updates, opt_state = optimizer.update(
            grads, state.opt_state, state.trainable, train_peft=train_peft
        )
        trainable = optax.apply_updates(state.trainable, updates)
        finite = jnp.isfinite(loss)
        first_bad = jnp.where(
            (state.first_bad_step < 0) & ~finite, state.global_step, state.first_bad_step
        )
        new_state = TrainState(
            trainable=trainable,
            opt_state=opt_state,
            method_state=method.after_step(trainable, state.method_state, task),
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
            **{f"lr_{label}": r for label, r in rates.items()},
        }
        return new_state, metrics

    return step


def make_eval_step(method: Method, net: Network, cfg: StepConfig) -> Callable[..., tuple]:
    """`eval(trainable, method_state, frozen, batch, task, evaluated) -> (sums, rows)` over the
    valid rows of a batch of task `evaluated`'s test set after task `task` (both traced `TaskSpec`s:
    one program for every pair). Sums: per predictor `p`, `sums[p]` counts the rows whose
    argmax over the seen classes is the label (class-incremental: no task identity) and
    `sums["task_incremental"][p]` those whose argmax over `evaluated`'s own classes
    `[offset, stop)` is (task-incremental: the task is given); `count`, the valid rows; and
    `entropy_sum`, the summed entropy of the softmax over the seen classes (of the logits
    `method.predict` names). One forward pass gives both counts. `rows`: every row's kept
    predictions (`predictions.per_example`; padding rows included, the host drops them)."""

    def eval_step(
        trainable: Params,
        method_state: Params,
        frozen: Params,
        batch: dict,
        task: TaskSpec,
        evaluated: TaskSpec,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        images = augment.test_transform(batch["image"], cfg.image_size, cfg.normalize)
        mask, labels = batch["mask"], batch["label"]
        probs, logits = method.predict(net, trainable, frozen, method_state, images, task)
        entropy = losses.entropy(logits)
        rows = predictions.per_example(probs, entropy, labels, evaluated.offset, evaluated.stop)
        out: dict[str, Any] = {
            "count": jnp.sum(mask),
            "entropy_sum": jnp.sum(jnp.where(mask, entropy, 0.0)),
            "task_incremental": {},
        }
        for name in probs:
            kept = rows[name]  # the counts are of the kept predictions: evaluate.py's inputs
            out[name] = jnp.sum((kept["top_classes"][:, 0] == labels) & mask)
            out["task_incremental"][name] = jnp.sum((kept["task_pred"] == labels) & mask)
        return out, rows

    return eval_step


def learning_rate(cfg, steps_per_epoch: int | jax.Array) -> float | optax.Schedule:
    """`optim.learning_rate`, constant or decayed per epoch: `cosine_epochs` as CODA-P's and
    InfLoRA's code (below), `cosine_annealing` as torch's `CosineAnnealingLR` (`cosine_annealing`).
    `steps_per_epoch` may be traced (the train step passes its task's: one program for tasks of
    any size).

    With `lr(k) = lr * cos(99 pi k / (200 (E - 1)))`, epoch `e = count // steps_per_epoch` of
    E trains at `lr(max(e - 1, 0))`: the reference's `CosineSchedule` sets lr(0) in its
    constructor, then resets its epoch counter to -1, so its first `step()` (at the start of
    epoch 1 in CODA-Prompt, at the end of epoch 0 in InfLoRA) sets lr(0) again. Epochs 0 and
    1 both train at lr; the last trains at lr(E - 2) (4.7e-5 for lr 1e-3, E = 50)."""
    o = cfg.optim
    if o.lr_schedule == "constant":
        return o.learning_rate  # a float keeps Adam's state free of a schedule count
    if o.lr_schedule == "cosine_annealing":
        return cosine_annealing(o.learning_rate, o.epochs, steps_per_epoch)
    if o.lr_schedule == "multistep":
        return multistep(o.learning_rate, tuple(o.lr_milestones), o.lr_decay, steps_per_epoch)
    span = 200.0 * max(o.epochs - 1, 1)

    def schedule(count: jax.Array) -> jax.Array:
        epoch = jnp.minimum(count // steps_per_epoch, o.epochs - 1)
        k = jnp.maximum(epoch - 1, 0)  # the reference's one-epoch lag (docstring)
        return o.learning_rate * jnp.cos(99.0 * jnp.pi * k / span)

    return schedule


def cosine_annealing(lr: float, epochs: int, steps_per_epoch: int | jax.Array) -> optax.Schedule:
    """torch's `CosineAnnealingLR(T_max=epochs, eta_min=0)` stepped once per epoch (APER's,
    RanPAC's and EASE's code): epoch `e` trains at `lr (1 + cos(pi e / E)) / 2`."""

    def schedule(count: jax.Array) -> jax.Array:
        return schedules.epoch_cosine(lr, jnp.minimum(count // steps_per_epoch, epochs - 1), epochs)

    return schedule


def multistep(
    lr: float, milestones: tuple[int, ...], decay: float, steps_per_epoch: int | jax.Array
) -> optax.Schedule:
    """torch's `MultiStepLR(milestones, gamma=decay)` stepped once per epoch (SLCA's code):
    epoch `e` trains at `lr decay^|{m in milestones: m <= e}|`."""
    marks = jnp.asarray(sorted(milestones) or [2**30], jnp.int32)

    def schedule(count: jax.Array) -> jax.Array:
        passed = jnp.sum(marks <= count // steps_per_epoch)
        return lr * jnp.asarray(decay, jnp.float32) ** passed

    return schedule


def applied_rates(
    opt_state: optax.OptState,
    rate: float | optax.Schedule,
    lr_scales: dict[str, float] | None = None,
) -> dict[str, jax.Array]:
    """`{label: rate(count)}` for each trainable label of `optimizer`'s state: the learning
    rate of that label's next Adam update, at the label's own update count (a gated label's
    count stands still while it is gated off, so after the head-only epochs PEFT's schedule
    runs that many steps behind the head's)."""
    rates = {}
    for path, count in optax.tree_utils.tree_get_all_with_path(opt_state, "count"):
        # Adam's count, or SGD's schedule count (`optim.optimizer=sgd`).
        if getattr(path[-1], "tuple_name", None) not in (
            "ScaleByAdamState",
            "ScaleByScheduleState",
        ):
            continue
        # An unpartitioned Adam (benchmarks' ablation) has one count for every leaf.
        label = next((k.key for k in path if isinstance(k, jax.tree_util.DictKey)), "all")
        value = rate(count) if callable(rate) else rate
        value = value * (lr_scales or {}).get(str(label), 1.0)
        rates[str(label)] = jnp.asarray(value, jnp.float32)
    return rates


def optimizer(
    cfg,
    trainable: Params,
    steps_per_epoch: int | jax.Array = 1,
    lr_scales: dict[str, float] | None = None,
) -> optax.GradientTransformationExtraArgs:
    """Adam, or SGD with momentum (`optim.optimizer`), on the PEFT and head leaves; PEFT
    updates gated by the phase flag. `optim.weight_decay > 0` adds `wd * param` to each gradient
    first (torch's coupled `weight_decay` of `SGD` and `Adam`); SGD's momentum is torch's
    (`buf = m buf + g`, first `buf = g`, no dampening).

    With `optim.clip_norm > 0` the gradient's global norm over every trainable leaf is clipped
    first (torch's `clip_grad_norm_` over the parameters that train; in a head-only phase the
    PEFT gradients, which are then discarded, still count in the norm). `lr_scales`: a
    label's learning rate relative to `optim.learning_rate` (`Method.lr_scales`)."""
    o = cfg.optim
    rate = learning_rate(cfg, steps_per_epoch)
    if o.get("optimizer", "adam") == "sgd":
        # A schedule even when constant: its count gives `applied_rates` the label's rate.
        schedule = rate if callable(rate) else optax.constant_schedule(rate)
        base = optax.sgd(schedule, momentum=o.momentum or None)
    else:
        base = optax.adam(rate, o.b1, o.b2, o.eps)
    if o.get("weight_decay", 0.0) > 0:
        base = optax.chain(optax.add_decayed_weights(o.weight_decay), base)
    tx = partition.make_optimizer(partition.label_params(trainable), base, lr_scales=lr_scales)
    if o.clip_norm > 0:
        tx = optax.chain(optax.clip_by_global_norm(o.clip_norm), tx)
    return tx
