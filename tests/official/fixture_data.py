"""The images and batch orders the official-code fixture generators feed both sides.

Per class a random colour (seeded) plus Gaussian noise (std 40), clipped to uint8: `train_per`
training and `test_per` test images per class, then per task and epoch a permutation of the
task's training images. numpy only, so the generators' torch environments and the tests see the
same arrays.
"""

from __future__ import annotations

import numpy as np


def make_data(tasks: int, per_task: int, size: int, train_per: int, test_per: int, epochs: int):
    """`(x_train, y_train, x_test, y_test, orders)`; `orders` (tasks, epochs, per_task *
    train_per) indexes the training set, task t's images being `[t n, (t + 1) n)`."""
    rng = np.random.default_rng(0)
    classes = tasks * per_task
    colours = rng.integers(40, 216, (classes, 3))

    def images(n):
        x, y = [], []
        for c in range(classes):
            noise = rng.normal(0, 40, (n, size, size, 3))
            x.append(np.clip(colours[c] + noise, 0, 255).astype(np.uint8))
            y += [c] * n
        return np.concatenate(x), np.asarray(y, np.int32)

    xtr, ytr = images(train_per)
    xte, yte = images(test_per)
    n_task = per_task * train_per
    orders = np.stack(
        [
            np.stack([t * n_task + rng.permutation(n_task) for _ in range(epochs)])
            for t in range(tasks)
        ]
    )
    return xtr, ytr, xte, yte, orders
