"""Image-folder datasets: `root/<class>/*.{jpg,jpeg,png,...}` (CLRS25, raw ImageNet-R).

`dataset_root` finds the folder of dataset NAME inside a data root (`root/NAME/`, as
`python -m aepg_jax.prepare` writes it), so one `data.data_dir` serves a sweep over TFDS and
folder datasets. Classes are the sub-directory names in sorted order. If `root/train/` and
`root/test/` exist, they are the splits (same class directories in both); otherwise every class
is split 80/20 (stratified) from `split_seed`. Images are decoded with Pillow and converted to RGB.

A split file (`split_file`, JSON `{"train": [...], "test": [...]}` of paths `<class>/<file>`
relative to `root`, such as the `l2p_split.json` that `python -m aepg_jax.prepare imagenet_r`
writes) fixes both splits instead, in its order: classes are then the sorted class directories
named in it. For ImageNet-R this is TFDS's `test[:80%]` / `test[80%:]` (L2P's split) with the
same labels (sorted WordNet ids) and the same example order as `data.source=tfds`.
"""

from __future__ import annotations

import dataclasses
import json
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


def dataset_root(data_dir: str, name: str | None, split_file: str | None = None) -> str:
    """The image folder of dataset `name` given `data.data_dir`: `data_dir/<name>` when that is
    a directory (a data root as `python -m aepg_jax.prepare NAME --data_dir=ROOT` writes it,
    which a whole sweep can share with TFDS datasets), else `data_dir` itself (the folder named
    directly). With a split file, `data_dir` is the folder whose `<class>/<file>` paths it lists."""
    if name and not split_file:
        inside = os.path.join(data_dir, name)
        if os.path.isdir(inside):
            return inside
    return data_dir


def load_split_file(root: str, split_file: str) -> tuple[FileSource, FileSource, tuple]:
    """The train and test `FileSource`s a split file lists (see the module docstring)."""
    try:
        with open(split_file) as f:
            listing = json.load(f)
        lists = {split: [str(p) for p in listing[split]] for split in ("train", "test")}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(
            f"data.split_file={split_file}: not a JSON split file with 'train' and 'test' "
            f"lists ({type(err).__name__}: {err})."
        ) from err
    names = tuple(sorted({p.split("/")[0] for paths in lists.values() for p in paths}))
    label_of = {c: i for i, c in enumerate(names)}
    sources = []
    for paths in lists.values():
        missing = [p for p in paths if not os.path.isfile(os.path.join(root, p))]
        if missing:
            raise FileNotFoundError(
                f"data.split_file={split_file} lists {len(missing)} images missing from "
                f"data.data_dir={root} (e.g. {missing[0]}): point data.data_dir at the "
                "unpacked folder whose <class>/<file> paths the split file lists."
            )
        labels = np.asarray([label_of[p.split("/")[0]] for p in paths], np.int64)
        sources.append(FileSource(tuple(os.path.join(root, p) for p in paths), labels))
    return sources[0], sources[1], names


def load_folder(
    root: str,
    name: str | None = None,
    split_seed: int = 0,
    test_fraction: float = 0.2,
    split_file: str | None = None,
) -> Dataset:
    """A `Dataset` from an image folder (a split file, explicit train/test sub-folders or a
    stratified split)."""
    name = name or os.path.basename(os.path.normpath(root))
    if split_file:
        if not os.path.isdir(root):
            raise FileNotFoundError(f"Image folder {root!r} does not exist.")
        train, test, class_names = load_split_file(root, split_file)
        return Dataset(name, train, test, class_names)
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
