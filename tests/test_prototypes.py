"""Class-wise feature statistics (methods/prototypes.py) on hand-made features."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from aepg_jax.methods import TaskContext, prototypes
from aepg_jax.models import head

_CFG = ml_collections.ConfigDict({"model": {"image_size": 4}, "input": {"normalize": "none"}})


def test_class_sums_add_masked_rows_by_label_and_means_leave_unseen_classes_zero():
    features = jnp.asarray([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [100.0, 100.0]])
    labels = jnp.asarray([0, 2, 0, 1])
    mask = jnp.asarray([True, True, True, False])  # the padding row counts nowhere
    sums = prototypes.ClassSums.zeros(4, 2).add(features, labels, mask)
    np.testing.assert_array_equal(sums.sums, [[6, 8], [0, 0], [3, 4], [0, 0]])
    np.testing.assert_array_equal(sums.counts, [2, 0, 1, 0])
    # A second batch adds to the first: the means are over both.
    sums = sums.add(jnp.asarray([[0.0, 2.0]]), jnp.asarray([2]), jnp.asarray([True]))
    np.testing.assert_array_equal(sums.means(), [[3, 4], [0, 0], [1.5, 3], [0, 0]])


def test_accumulate_runs_the_program_over_every_batch():
    step = jax.jit(prototypes.sums_step(lambda p, images: p * images.mean((1, 2)), _CFG))
    images = np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3)
    batches = [
        {"image": images, "label": jnp.asarray([0, 1]), "mask": jnp.asarray([True, True])},
        {"image": images, "label": jnp.asarray([1, 1]), "mask": jnp.asarray([True, False])},
    ]

    def ctx(batches):
        return TaskContext(net=None, frozen={}, train_batches=lambda: iter(batches))

    sums = prototypes.accumulate(step, 2.0, ctx(batches), prototypes.ClassSums.zeros(2, 3))
    np.testing.assert_array_equal(sums.counts, [1, 2])
    one = prototypes.accumulate(step, 2.0, ctx(batches[:1]), prototypes.ClassSums.zeros(2, 3))
    # Class 1 got image 1 twice (the second batch's second row is padding) and image 0 once.
    np.testing.assert_allclose(sums.sums[1], one.sums[1] + one.sums[0], rtol=1e-6)


def test_cosine_logits_are_cosines_and_zero_for_an_empty_prototype():
    f = jnp.asarray([[3.0, 4.0], [1.0, 0.0]])
    p = jnp.asarray([[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]])
    np.testing.assert_allclose(
        head.cosine_logits(f, p), [[0.6, 0.8, 0.0], [1.0, 0.0, 0.0]], atol=1e-7
    )
    with pytest.raises(AssertionError):
        head.cosine_logits(f[0], p)
