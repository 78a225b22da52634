"""HiDe-Prompt's task-identity model and the alignment of its two classifiers on class Gaussians
(docs/algorithm.md §25; thu-ml/HiDe-Prompt `engines/hide_tii_engine.py`,
`engines/hide_promtp_wtp_and_tap_engine.py`). Plain functions over (params, features, labels,
rate); `hide_prompt.py` jits each once and runs the host loops below.

- The model (`init`, `logits`): `head(LN(q + fc2(GELU(fc1 q))))`, `MlpMapping` then a linear
  classifier over every class, on the frozen backbone's cls feature q (D,).
- Its training (`train_step`, `train`): Adam with the gradient norm clipped at 1, CE over the
  task's own classes, batches of the task's features in a given order per epoch.
- Its alignment (`align_step`, `align`): SGD (momentum 0.9, no weight decay) at a per-epoch
  cosine rate on draws from the seen classes' Gaussians, unseen classes masked.
- The prompted model's heads' alignment (`align_heads`, `tap_align`): the same SGD on every
  epoch's draws, one scanned program (`class_gaussians.align_classifier`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from aepg_jax import schedules
from aepg_jax.methods import class_gaussians as cg
from aepg_jax.methods.base import Params, TaskSpec
from aepg_jax.models import head as head_lib

HI = jax.lax.Precision.HIGHEST
SGD = optax.sgd(1.0, momentum=0.9)  # the alignments' (their rate multiplies its updates)


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float = 1e-5) -> jax.Array:
    """torch's `nn.LayerNorm` (biased variance, eps 1e-5)."""
    mu = jnp.mean(x, -1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), -1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + eps) * scale + bias


def init(key: jax.Array, width: int, hidden: int, num_classes: int) -> Params:
    """The MLP and classifier: Linear kernels ~ trunc N(0, 0.02^2) on [-2, 2] (timm's
    `trunc_normal_`, whose bounds are absolute), biases 0, LayerNorm (1, 0)."""
    k1, k2, k3 = jax.random.split(key, 3)

    def trunc(k, shape):
        return jax.random.truncated_normal(k, -100.0, 100.0, shape, jnp.float32) * 0.02

    return {
        "fc1": {"kernel": trunc(k1, (width, hidden * width)), "bias": jnp.zeros(hidden * width)},
        "fc2": {"kernel": trunc(k2, (hidden * width, width)), "bias": jnp.zeros(width)},
        "norm": {"scale": jnp.ones(width), "bias": jnp.zeros(width)},
        "head": {"kernel": trunc(k3, (width, num_classes)), "bias": jnp.zeros(num_classes)},
    }


def logits(tii: Params, q: jax.Array) -> jax.Array:
    """`head(LN(q + fc2(GELU(fc1 q))))` (B, C): `MlpMapping` then the classifier."""
    h = jax.nn.gelu(jnp.matmul(q, tii["fc1"]["kernel"], precision=HI) + tii["fc1"]["bias"], False)
    h = jnp.matmul(h, tii["fc2"]["kernel"], precision=HI) + tii["fc2"]["bias"]
    h = layer_norm(h + q, tii["norm"]["scale"], tii["norm"]["bias"])
    return jnp.matmul(h, tii["head"]["kernel"], precision=HI) + tii["head"]["bias"]


def masked_ce(logits: jax.Array, labels: jax.Array, keep: jax.Array, rows: jax.Array) -> jax.Array:
    """Cross-entropy of `logits` (B, C) with the classes outside `keep` (C,) at -inf, averaged
    over the rows where `rows` (B,) is True (torch's `index_fill(-inf)` then `CrossEntropyLoss`)."""
    logits = jnp.where(keep, logits, -jnp.inf)
    per = -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1)[:, 0]
    w = rows.astype(jnp.float32)
    return jnp.sum(jnp.where(rows, per, 0.0)) / jnp.maximum(jnp.sum(w), 1.0)


def optimizer(lr: float) -> optax.GradientTransformation:
    """The training's: Adam at `lr`, the gradient norm clipped at 1."""
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adam(lr))


def train_step(tii, opt_state, feats, labels, rows, task: TaskSpec, *, lr: float):
    """One Adam step of CE over the task's own classes on `feats` (B, D), the `rows` (B,) that
    are real: (params, opt_state, loss)."""
    cls = jnp.arange(tii["head"]["bias"].shape[0])
    keep = (cls >= task.offset) & (cls < task.stop)
    loss, g = jax.value_and_grad(lambda p: masked_ce(logits(p, feats), labels, keep, rows))(tii)
    updates, opt_state = optimizer(lr).update(g, opt_state, tii)
    return optax.apply_updates(tii, updates), opt_state, loss


def train(
    step: Callable, tii: Params, opt_state, feats: np.ndarray, labels: np.ndarray, task: TaskSpec,
    orders: Sequence[np.ndarray], batch_size: int,
) -> tuple[Params, list[jax.Array]]:  # fmt: skip
    """`step` (a jitted `train_step`) over each epoch's order of the features, batches of
    `batch_size` (the last one short, padded): the params and each step's loss."""
    t, losses = task.traced(), []
    for order in orders:
        for s in range(0, len(order), batch_size):
            idx = order[s : s + batch_size]
            pad = batch_size - len(idx)
            f = np.concatenate([feats[idx], np.zeros((pad, feats.shape[1]), feats.dtype)])
            y = np.concatenate([labels[idx], np.zeros(pad, labels.dtype)])
            rows = np.arange(batch_size) < len(idx)
            tii, opt_state, loss = step(tii, opt_state, f, y, rows, t)
            losses.append(loss)
    return tii, losses


def align_step(params, opt_state, feats, labels, i, rate, task: TaskSpec):
    """One SGD step of the model on batch `i` of `feats` (S, n, D), `labels` (S, n), the
    classes after the task masked, at `rate`: (params, opt_state, loss)."""
    f, y = feats[i], labels[i]

    def loss_fn(p):
        out = logits(p, f)
        keep = jnp.arange(out.shape[-1]) < task.stop
        return masked_ce(out, y, keep, jnp.ones(y.shape[0], bool))

    loss, g = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = SGD.update(g, opt_state, params)
    updates = jax.tree.map(lambda u: rate * u, updates)
    return optax.apply_updates(params, updates), opt_state, loss


def align(
    step: Callable, draw: Callable, params: Params, opt_state, stats: Params, task: TaskSpec,
    key: jax.Array, lr: float, epochs: int,
) -> Params:  # fmt: skip
    """`epochs` epochs of `step` (a jitted `align_step`) on a fresh `draw(key, mean, cov, task)`
    per epoch, the first `task.offset` batches of each, at the per-epoch cosine rate from `lr`."""
    t = task.traced()
    for epoch, k in enumerate(jax.random.split(key, epochs)):
        feats, labels = draw(k, stats["mean"], stats["cov"], t)
        rate = jnp.float32(schedules.epoch_cosine(lr, epoch, epochs))
        for i in range(int(task.offset)):
            params, opt_state, _ = step(params, opt_state, feats, labels, i, rate, t)
    return params


def draws(
    key: jax.Array, mean: jax.Array, cov: jax.Array, per_class: int, seen, diagonal: bool
) -> tuple[jax.Array, jax.Array]:
    """One epoch's alignment data: `per_class` draws of every class, from N(mean_c, cov_c)
    (`class_gaussians.sample`) or, `diagonal`, N(mean_c, diag(var_c)) (`cov` (C, D)), shuffled
    with the seen classes' first and cut into C batches: (C, n, D) features, (C, n) labels."""
    k_s, k_p = jax.random.split(key)
    if diagonal:
        eps = jax.random.normal(k_s, (mean.shape[0], per_class, mean.shape[1]), jnp.float32)
        x = mean[:, None] + eps * jnp.sqrt(cov)[:, None]
    else:
        x = cg.sample(mean, cov, per_class, k_s)
    return cg.shuffled_batches(x, seen, k_p)


def align_heads(heads: Params, x: jax.Array, y: jax.Array, task: TaskSpec, *, lr: float):
    """The task heads after SGD (no weight decay) on given draws x (E, S, n, D), y (E, S, n):
    the first `task.offset` batches of each epoch train. (heads, losses (E, S))."""
    sizes = head_lib.head_sizes({"head": heads})
    kernel, bias = head_lib.stack(heads, sizes)
    kernel, bias, losses = cg.align_classifier(
        kernel, bias, x, y, task.offset, task.stop, task.index + 1,
        head_sizes=sizes, learning_rate=lr, weight_decay=0.0,
    )  # fmt: skip
    return head_lib.unstack(kernel, bias, sizes), losses


def tap_align(heads, key, mean, cov, task: TaskSpec, *, epochs, per_class, diagonal, lr):
    """The heads aligned (`align_heads`) on `epochs` epochs of `draws`, `per_class` per class."""
    keys = jax.random.split(key, epochs)
    x, y = jax.vmap(lambda k: draws(k, mean, cov, per_class, task.stop, diagonal))(keys)
    return align_heads(heads, x, y, task, lr=lr)
