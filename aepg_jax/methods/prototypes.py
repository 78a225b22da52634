"""Class-wise feature statistics: per-class sums and counts of a model's features over a task's
training images, their means (class prototypes) and the cosine classifier over them.

The methods that classify by prototypes (docs/methods.md) share this module. A method builds its
pass once (`sums_program`: its feature function, jitted, one compilation for the run) and runs it
over `TaskContext.train_batches()` (the task's training images in order, unaugmented, with the
test transform applied here) with `accumulate`. The statistics live in the method state, whose
shapes cover every class of the run from task 0: they are checkpointed and vmapped like any
other state, so a resumed run continues from the same sums.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import chex
import flax
import jax
import jax.numpy as jnp
import ml_collections

from aepg_jax.data import augment
from aepg_jax.system import progress

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


def sums_program(features: FeatureFn, cfg: ml_collections.ConfigDict) -> SumsStep:
    """`class_sums_step(sums, params, batch)`, jitted: the batch's uint8 images through the test
    transform (`model.image_size`, `input.normalize`) and `features`, added to `sums` by label."""

    # Named apart from the training step: the compile report counts programs by name.
    def class_sums_step(sums: ClassSums, params: Any, batch: Batch) -> ClassSums:
        images = augment.test_transform(batch["image"], cfg.model.image_size, cfg.input.normalize)
        return sums.add(features(params, images), batch["label"], batch["mask"])

    return jax.jit(class_sums_step)


def accumulate(
    step: SumsStep, params: Any, batches: Iterable[Batch], sums: ClassSums, desc: str = ""
) -> ClassSums:
    """`sums` plus every batch's features (`step` from `sums_program`), on the host loop."""
    for batch in progress.new(
        batches, desc=desc, unit="batch", leave=False, disable=jax.process_index() != 0
    ):
        sums = step(sums, params, batch)
    return sums


def cosine_logits(features: jax.Array, prototypes: jax.Array, eps: float = 1e-12) -> jax.Array:
    """(B, C) `cos(f_b, p_c) = <f_b, p_c> / (max(|f_b|, eps) max(|p_c|, eps))`; a zero prototype
    (a class not seen yet) gives 0; `eps` as torch's `F.normalize`."""
    chex.assert_rank((features, prototypes), 2)

    def unit(x: jax.Array) -> jax.Array:
        x = x.astype(jnp.float32)
        return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)

    return jnp.matmul(unit(features), unit(prototypes).T, precision=jax.lax.Precision.HIGHEST)
