"""Growing classifier (docs/algorithm.md §3): one `Dense(D, n_t)` per task, logits in task order.

`grow(params, rng, n, init=...)` adds the next task's head to an existing parameter tree
without touching the earlier heads or anything else. The heads' shared maths lives here: the
tasks' sizes and class count (`head_sizes`, `num_classes`: the `task_*` leaves under `head/`
only, so a method may keep its own leaves there), the class -> task map (`class_tasks`), the
heads as one classifier and back (`stack`, `unstack`), and the cosine head `sigma cos(f, w_c)`
(`cosine_head`: APER's, EASE's and RanPAC's; w_c the task heads' kernel columns, their biases
unused, sigma the top-level leaf `cosine_scale`). Its initialisations (`INITS`):
  normal   kernel ~ N(0, 0.001^2), bias 0 (gqk/LAE's `SimpleHead.weights_init`; `TaskHeads`'s)
  uniform  kernel and bias ~ U(-1/sqrt(D), 1/sqrt(D)) (torch's `nn.Linear` default: the head of
           GT-RIPL/CODA-Prompt's `ViTZoo`, CODA-P's default)
  linear   kernel ~ U(-sqrt(3/D), sqrt(3/D)), bias 0 (LAMDA-PILOT's `SimpleLinear`:
           kaiming_uniform with the linear gain; SD-LoRA's classifier)
  trunc_normal  kernel ~ N(0, 0.02^2) truncated to [-2, 2], bias 0 (timm's
           `init_weights_vit_timm` of an `nn.Linear`, torch's `trunc_normal_(std=.02)` with its
           absolute bounds: dualprompt-pytorch's, HiDe-Prompt's and SLCA's heads)
"""

from __future__ import annotations

import math
from typing import Any

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

KERNEL_INIT = nn.initializers.normal(stddev=1e-3)
# The cosine head's scale sigma: a top-level trainable leaf, labelled `peft` (it trains with
# the method's own modules: EASE's adapter, APER's and RanPAC's first-session PEFT).
COSINE_SCALE = "cosine_scale"
# `Method.layout` of the methods with the cosine head: their checkpoints from before it kept
# sigma and the weights elsewhere (APER `head/aper_cosine`, EASE `ease/adapter/sigma`, RanPAC
# `logit_scale`).
COSINE_LAYOUT = "the cosine head's scale at cosine_scale and its weights in the task heads"
INITS = ("normal", "uniform", "linear", "trunc_normal")
TRUNC_STD = 0.02


def task_name(task: int) -> str:
    """Parameter name of task `task`'s head under `head/`."""
    return f"task_{task}"


class TaskHeads(nn.Module):
    """`concat_t (features W_t + b_t)` over the tasks' heads; (B, 0) logits with no head."""

    head_sizes: tuple[int, ...]

    @nn.compact
    def __call__(self, features: jax.Array) -> jax.Array:
        if not self.head_sizes:
            return jnp.zeros((*features.shape[:-1], 0), features.dtype)
        logits = [
            nn.Dense(
                n, kernel_init=KERNEL_INIT, bias_init=nn.initializers.zeros, name=task_name(t)
            )(features)
            for t, n in enumerate(self.head_sizes)
        ]
        return jnp.concatenate(logits, axis=-1)


def head_sizes(params: dict[str, Any]) -> tuple[int, ...]:
    """Classes per task head present in `params`, in task order (the `task_*` leaves of
    `head/`; a method's own leaves there do not count)."""
    heads = params.get("head", {})
    count = sum(1 for name in heads if name.startswith("task_"))
    return tuple(heads[task_name(t)]["bias"].shape[0] for t in range(count))


def num_classes(params: dict[str, Any]) -> int:
    """Every class of the run: the summed sizes of the task heads (there from the start)."""
    return sum(head_sizes(params))


def class_tasks(sizes: tuple[int, ...]) -> np.ndarray:
    """(C,) int32: the task of each class, from the task heads' sizes."""
    return np.repeat(np.arange(len(sizes)), sizes).astype(np.int32)


def stack(heads: dict[str, Any], sizes: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """The task heads `heads` (the tree under `head/`) of `sizes` as one classifier: kernel
    (D, C) and bias (C,), classes in task order."""
    names = [task_name(t) for t in range(len(sizes))]
    kernel = jnp.concatenate([heads[n]["kernel"] for n in names], axis=-1)
    return kernel, jnp.concatenate([heads[n]["bias"] for n in names], axis=-1)


def unstack(kernel: jax.Array, bias: jax.Array, sizes: tuple[int, ...]) -> dict[str, Any]:
    """`stack`'s inverse: one classifier (D, C), (C,) cut back into the task heads."""
    cuts = np.cumsum(sizes)[:-1]
    kernels, biases = jnp.split(kernel, cuts, axis=1), jnp.split(bias, cuts)
    return {
        task_name(t): {"kernel": w, "bias": b}
        for t, (w, b) in enumerate(zip(kernels, biases, strict=True))
    }


def cosine_logits(features: jax.Array, weight: jax.Array, eps: float = 1e-12) -> jax.Array:
    """(B, C) `cos(f_b, w_c) = <f_b, w_c> / (max(|f_b|, eps) max(|w_c|, eps))` for the rows w_c
    of `weight` (C, D); a zero row (a class not seen yet) gives 0. `eps` as torch's
    `F.normalize`; scaled by a trained sigma it is the cosine head of APER, EASE and RanPAC
    (`CosineLinear`, whose weights start U(+-1/sqrt(D)): the `uniform` init)."""
    chex.assert_rank((features, weight), 2)

    def unit(x: jax.Array) -> jax.Array:
        x = x.astype(jnp.float32)
        return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)

    return jnp.matmul(unit(features), unit(weight).T, precision=jax.lax.Precision.HIGHEST)


def with_cosine_scale(trainable: dict[str, Any]) -> dict[str, Any]:
    """`trainable` with the cosine head's scale at its start, sigma = 1 (`CosineLinear`)."""
    return {**trainable, COSINE_SCALE: jnp.ones((), jnp.float32)}


def cosine_head(trainable: dict[str, Any], features: jax.Array) -> jax.Array:
    """`sigma cos(f, w_c)` (B, C) over every class: w_c the task heads' kernel columns (the
    official init is `uniform`, `CosineLinear.reset_parameters`' U(+-1/sqrt(D))), sigma the
    leaf `cosine_scale`; the heads' biases are unused."""
    kernel = stack(trainable["head"], head_sizes(trainable))[0]
    return trainable[COSINE_SCALE] * cosine_logits(features, kernel.T)


def init_head(rng: jax.Array, width: int, num_classes: int, init: str = "normal") -> dict:
    """One head's `{"kernel": (D, n), "bias": (n,)}` (float32) under `init` (see `INITS`)."""
    if init == "normal":
        return {
            "kernel": KERNEL_INIT(rng, (width, num_classes), jnp.float32),
            "bias": jnp.zeros((num_classes,), jnp.float32),
        }
    if init == "uniform":  # torch's nn.Linear: kaiming_uniform(a=sqrt 5) = U(+-1/sqrt(fan_in))
        bound = 1.0 / math.sqrt(width)
        k_kernel, k_bias = jax.random.split(rng)
        return {
            "kernel": jax.random.uniform(
                k_kernel, (width, num_classes), jnp.float32, -bound, bound
            ),
            "bias": jax.random.uniform(k_bias, (num_classes,), jnp.float32, -bound, bound),
        }
    if init == "linear":  # kaiming_uniform(nonlinearity="linear") = U(+-sqrt(3 / fan_in))
        bound = math.sqrt(3.0 / width)
        return {
            "kernel": jax.random.uniform(rng, (width, num_classes), jnp.float32, -bound, bound),
            "bias": jnp.zeros((num_classes,), jnp.float32),
        }
    if init == "trunc_normal":  # torch's trunc_normal_(std=.02, a=-2, b=2): its bounds are
        # absolute, 100 std away, so it is a normal (jax's inverse-erf sampler over that
        # range is float32-inexact in the tails: it widens the std by ~2%)
        kernel = TRUNC_STD * jax.random.normal(rng, (width, num_classes), jnp.float32)
        return {
            "kernel": jnp.clip(kernel, -2.0, 2.0),
            "bias": jnp.zeros((num_classes,), jnp.float32),
        }
    raise ValueError(f"Unknown head init {init!r}; use one of {INITS}.")


def grow(
    params: dict[str, Any],
    rng: jax.Array,
    num_classes: int,
    width: int | None = None,
    init: str = "normal",
) -> dict[str, Any]:
    """`params` plus a fresh head for the next task, kernel (D, n) and bias (n,) drawn by
    `init_head(rng, D, n, init)`.

    `width` (D) defaults to the `cls` token's width; give it for a tree without the backbone.
    """
    if num_classes < 1:
        raise ValueError(f"A task head needs at least one class; got {num_classes}.")
    width = width or params["cls"].shape[-1]
    heads = dict(params.get("head", {}))
    new = task_name(len(heads))
    chex.assert_equal(new in heads, False)
    heads[new] = init_head(rng, width, num_classes, init)
    return {**params, "head": heads}
