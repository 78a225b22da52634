"""Image-folder datasets: `root/<class>/*.{jpg,jpeg,png,...}` (CLRS25, raw ImageNet-R).

Classes are the sub-directory names in sorted order. If `root/train/` and `root/test/` exist,
they are the splits (same class directories in both); otherwise every class is split 80/20
(stratified) from `split_seed`. Images are decoded with Pillow and converted to RGB.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
from PIL import Image

from aepg_jax.data.embedded import stratified_split
from aepg_jax.data.source import Dataset, SubsetSource

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp")


@dataclasses.dataclass(frozen=True)
class FileSource:
    """Images on disk: `paths[i]` has label `labels[i]`."""

    paths: tuple[str, ...]
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.paths)

    def image(self, index: int) -> np.ndarray:
        try:
            with Image.open(self.paths[index]) as img:
                return np.asarray(img.convert("RGB"))
        except OSError as err:
            raise OSError(f"Cannot decode image {self.paths[index]!r}: {err}") from err


def _scan(root: str, class_names: tuple[str, ...] | None = None) -> tuple[FileSource, tuple]:
    if not os.path.isdir(root):
        raise FileNotFoundError(f"Image folder {root!r} does not exist.")
    names = class_names or tuple(
        sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    )
    if not names:
        raise FileNotFoundError(
            f"Image folder {root!r} has no class sub-directories; expected root/<class>/*.jpg."
        )
    paths, labels = [], []
    for label, name in enumerate(names):
        class_dir = os.path.join(root, name)
        if not os.path.isdir(class_dir):
            raise FileNotFoundError(f"Class directory {class_dir!r} is missing.")
        files = sorted(f for f in os.listdir(class_dir) if f.lower().endswith(IMAGE_EXTENSIONS))
        if not files:
            raise FileNotFoundError(f"Class directory {class_dir!r} holds no images.")
        paths += [os.path.join(class_dir, f) for f in files]
        labels += [label] * len(files)
    return FileSource(tuple(paths), np.asarray(labels, np.int64)), names


def load_folder(
    root: str, name: str | None = None, split_seed: int = 0, test_fraction: float = 0.2
) -> Dataset:
    """A `Dataset` from an image folder (explicit train/test sub-folders or a stratified split)."""
    name = name or os.path.basename(os.path.normpath(root))
    train_dir, test_dir = os.path.join(root, "train"), os.path.join(root, "test")
    if os.path.isdir(train_dir) and os.path.isdir(test_dir):
        train, class_names = _scan(train_dir)
        test, _ = _scan(test_dir, class_names)
        return Dataset(name, train, test, class_names)
    everything, class_names = _scan(root)
    train_idx, test_idx = stratified_split(everything.labels, test_fraction, split_seed)
    return Dataset(
        name, SubsetSource(everything, train_idx), SubsetSource(everything, test_idx), class_names
    )
