"""Class-wise feature statistics: per-class sums and counts of a model's features over a task's
training images and their means (class prototypes).

The methods that classify by prototypes (docs/methods.md) share this module. A method jits its
pass once (`sums_step` of its feature function, under `Method.compiled`) and runs it over the
task's training images (in order, unaugmented, with the test transform applied here) with
`accumulate`; the cosine classifier over the means is `models/head.py`'s `cosine_logits`. The
statistics live in the method state, whose shapes cover every class of the run from task 0:
they are checkpointed and vmapped like any other state, so a resumed run continues from the
same sums.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import chex
import flax
import jax
import jax.numpy as jnp
import ml_collections

from aepg_jax.data import augment
from aepg_jax.methods import base

Batch = dict[str, jax.Array]
# features(params, images (B, S, S, C) normalised) -> (B, D)
FeatureFn = Callable[[Any, jax.Array], jax.Array]
# step(sums, params, batch) -> sums
SumsStep = Callable[["ClassSums", Any, Batch], "ClassSums"]


@flax.struct.dataclass
class ClassSums:
    """`sums[c] = sum_{i: y_i = c} f(x_i)` (C, D) and `counts[c] = |{i: y_i = c}|` (C,), float32."""

    sums: jax.Array
    counts: jax.Array

    @classmethod
    def zeros(cls, num_classes: int, dim: int) -> ClassSums:
        return cls(jnp.zeros((num_classes, dim), jnp.float32), jnp.zeros((num_classes,)))

    def add(self, features: jax.Array, labels: jax.Array, mask: jax.Array) -> ClassSums:
        """The sums with the rows of `features` (B, D) whose `mask` (B,) is True added to their
        class `labels` (B,). Pure: one matrix product, no per-example loop."""
        num_classes, dim = self.sums.shape
        chex.assert_shape(features, (None, dim))
        chex.assert_equal_shape_prefix((features, labels, mask), 1)
        weights = jax.nn.one_hot(labels, num_classes) * mask.astype(jnp.float32)[:, None]
        sums = self.sums + jnp.matmul(
            weights.T, features.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST
        )
        return ClassSums(sums, self.counts + weights.sum(0))

    def means(self) -> jax.Array:
        """(C, D) class means `sums[c] / counts[c]`; rows of classes with no example are zero."""
        return self.sums / jnp.maximum(self.counts, 1.0)[:, None]


def sums_step(features: FeatureFn, cfg: ml_collections.ConfigDict) -> SumsStep:
    """`class_sums_step(sums, params, batch)`: the batch's uint8 images through the test
    transform (`model.image_size`, `input.normalize`) and `features`, added to `sums` by label
    (jit it once: `Method.compiled`)."""

    def class_sums_step(sums: ClassSums, params: Any, batch: Batch) -> ClassSums:
        images = augment.test_transform(batch["image"], cfg.model.image_size, cfg.input.normalize)
        return sums.add(features(params, images), batch["label"], batch["mask"])

    return class_sums_step


def accumulate(
    step: SumsStep, params: Any, ctx: base.TaskContext, sums: ClassSums, desc: str = ""
) -> ClassSums:
    """`sums` plus every training batch's features (`step`: a jitted `sums_step`), on the host."""
    sums = base.on_mesh(sums, params)
    for batch in base.task_batches(ctx, desc):
        sums = step(sums, params, batch)
    return sums
