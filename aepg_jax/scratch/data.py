"""Data of a from-scratch run: a whole dataset (no tasks), decode-once cached, plus its
per-channel normalisation statistics.

CIFAR-10/100 come from TFDS's array_record files (`tfds build cifar10 --file_format=array_record`,
read without TensorFlow, `data/tfds_sources.py`); Fashion-MNIST also from Debian's IDX files.
Images are cached once at `data.image_size` (`data/cache.py`; 32x32 CIFAR is stored as is).
"""

from __future__ import annotations

import dataclasses
import os

import jax
import ml_collections
import numpy as np

from aepg_jax.data import cache, datasets


@dataclasses.dataclass(frozen=True)
class ScratchData:
    """The cached splits, the training rows used, and the normalisation statistics."""

    name: str
    class_names: tuple[str, ...]
    train: cache.CachedSplit
    test: cache.CachedSplit
    train_indices: np.ndarray  # rows of `train` used for training (all, or the first N)
    mean: tuple[float, float, float]  # per channel, in [0, 1] units
    std: tuple[float, float, float]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def channel_stats(images: np.ndarray, chunk: int = 4096) -> tuple[tuple[float, ...], ...]:
    """Per-channel mean and (population) std of uint8 `(N, H, W, C)` images, in [0, 1] units.

    Summed in float64 over chunks, so a memory-mapped split is read once without a float copy.
    """
    n = len(images)
    if n == 0:
        raise ValueError("No training images: cannot compute the normalisation statistics.")
    total = np.zeros(images.shape[-1])
    squares = np.zeros(images.shape[-1])
    for start in range(0, n, chunk):
        x = np.asarray(images[start : start + chunk], np.float64) / 255.0
        total += x.sum(axis=(0, 1, 2))
        squares += np.square(x).sum(axis=(0, 1, 2))
    count = n * images.shape[1] * images.shape[2]
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean**2, 0.0))
    return tuple(float(v) for v in mean), tuple(float(v) for v in std)


def prepare_data(cfg: ml_collections.ConfigDict) -> ScratchData:
    """Loads and caches the dataset of `cfg.data`; computes mean/std unless they are set."""
    d = cfg.data
    ds = datasets.load_configured(d)
    name = datasets.run_name(d, ds)
    built = {
        split: cache.load_or_build(
            getattr(ds, split),
            os.path.expanduser(d.cache_dir),
            name,
            split,
            d.image_size,
            class_names=ds.class_names,
            verify=d.verify_cache,
            progress=jax.process_index() == 0,
        )
        for split in ("train", "test")
    }
    indices = np.arange(len(built["train"]))
    if d.max_train_examples:
        indices = indices[: d.max_train_examples]
    if d.mean is None or d.std is None:
        mean, std = channel_stats(built["train"].images[: len(indices)])
    if d.mean is not None:
        mean = tuple(float(v) for v in d.mean)
    if d.std is not None:
        std = tuple(float(v) for v in d.std)
    return ScratchData(ds.name, ds.class_names, built["train"], built["test"], indices, mean, std)
