"""Offline datasets that need no download: scikit-learn `digits` and Debian's Fashion-MNIST.

* `digits`: the 1,797 8x8 handwritten digits shipped inside scikit-learn's wheel (values 0-16,
  scaled to uint8 0-255), 10 classes; split 80/20 stratified by class from `split_seed`.
* `digits_domains`: the same digits as a multi-domain dataset (the domain-incremental demo).
  Example k of each class (in scikit-learn's order) goes to domain k mod 4, so the domains are
  disjoint and hold every class about equally; each domain is then a transform of its digits:
  `original`, `inverted` (255 - x), `rotated` (90 degrees counter-clockwise) and `noisy`
  (x + N(0, 48^2) per pixel from a fixed generator, clipped to [0, 255]). The domain
  assignment and the noise are fixed; each domain is split 80/20 stratified by class from
  `split_seed`.
* `fashion_mnist`: the 60,000 + 10,000 28x28 images of Zalando's Fashion-MNIST, read from the
  IDX files of Debian's `dataset-fashion-mnist` package (`/usr/share/datasets/fashion-mnist/`)
  or another directory holding the same four `*-ubyte.gz` files; 10 classes, official split.

Both are grayscale: `image(i)` returns the channel replicated to (H, W, 3).
"""

from __future__ import annotations

import gzip
import os
import struct

import numpy as np
from sklearn import datasets as sk_datasets
from sklearn import model_selection

from aepg_jax.data.source import ArraySource, Dataset

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_CLASSES = (
    "t-shirt/top",
    "trouser",
    "pullover",
    "dress",
    "coat",
    "sandal",
    "shirt",
    "sneaker",
    "bag",
    "ankle boot",
)
_IDX_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


def stratified_split(
    labels: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """(train_indices, test_indices): a per-class `test_fraction` split drawn from `seed`."""
    indices = np.arange(len(labels))
    train, test = model_selection.train_test_split(
        indices, test_size=test_fraction, stratify=labels, random_state=seed
    )
    return np.sort(train), np.sort(test)


def load_digits(split_seed: int = 0, test_fraction: float = 0.2) -> Dataset:
    """scikit-learn's 8x8 digits as uint8 images, 80/20 stratified train/test."""
    digits = sk_datasets.load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    labels = digits.target.astype(np.int64)
    train, test = stratified_split(labels, test_fraction, split_seed)
    return Dataset(
        name="digits",
        train=ArraySource(images[train], labels[train]),
        test=ArraySource(images[test], labels[test]),
        class_names=tuple(str(d) for d in range(10)),
    )


DIGIT_DOMAINS = ("original", "inverted", "rotated", "noisy")
_NOISE_STD = 48.0  # of the `noisy` domain, in uint8 levels: the digit stays legible


def _digit_domain(images: np.ndarray, domain: str) -> np.ndarray:
    """`images` (N, 8, 8) uint8 as domain `domain` shows them."""
    if domain == "original":
        return images
    if domain == "inverted":
        return 255 - images
    if domain == "rotated":
        return np.ascontiguousarray(np.rot90(images, k=1, axes=(1, 2)))
    noise = np.random.default_rng(0).normal(0.0, _NOISE_STD, images.shape)
    return np.clip(np.round(images + noise), 0, 255).astype(np.uint8)


def load_digits_domains(split_seed: int = 0, test_fraction: float = 0.2) -> Dataset:
    """scikit-learn's digits in the four domains of `DIGIT_DOMAINS` (module docstring), each
    split 80/20 stratified by class; `domains` of each split names every example's domain."""
    digits = sk_datasets.load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    labels = digits.target.astype(np.int64)
    # k-th example of its class -> domain k mod D: disjoint domains with every class.
    rank = np.empty(len(labels), np.int64)
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        rank[members] = np.arange(len(members))
    domain_of = rank % len(DIGIT_DOMAINS)
    parts: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {"train": [], "test": []}
    for d, domain in enumerate(DIGIT_DOMAINS):
        members = np.flatnonzero(domain_of == d)
        shown = _digit_domain(images[members], domain)
        train, test = stratified_split(labels[members], test_fraction, split_seed)
        for split, rows in (("train", train), ("test", test)):
            parts[split].append((shown[rows], labels[members][rows], np.full(len(rows), d)))
    sources = {
        split: ArraySource(*(np.concatenate(column) for column in zip(*chunks, strict=True)))
        for split, chunks in parts.items()
    }
    return Dataset(
        name="digits_domains",
        train=sources["train"],
        test=sources["test"],
        class_names=tuple(str(d) for d in range(10)),
        domain_names=DIGIT_DOMAINS,
    )


def read_idx(path: str) -> np.ndarray:
    """An IDX array (optionally gzip-compressed): magic 0x0000 dtype=0x08 (uint8), ndim, dims."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[:2] != b"\x00\x00" or data[2] != 0x08:
        raise ValueError(f"{path} is not an uint8 IDX file (bad magic {data[:4]!r}).")
    ndim = data[3]
    dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    body = np.frombuffer(data, np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise ValueError(f"{path} is truncated: {body.size} bytes for shape {dims}.")
    return body.reshape(dims)


def load_fashion_mnist(directory: str | None = None) -> Dataset:
    """Fashion-MNIST from the four IDX files in `directory` (default: Debian's location)."""
    directory = directory or FASHION_MNIST_DIR
    missing = [
        name
        for pair in _IDX_FILES.values()
        for name in pair
        if not os.path.exists(os.path.join(directory, name))
    ]
    if missing:
        raise FileNotFoundError(
            f"Fashion-MNIST files {', '.join(missing)} are not in {directory!r}. Install them "
            "with `apt-get install dataset-fashion-mnist` (Debian/Ubuntu), point "
            "`data.data_dir` (or `pretrain.data_dir` for pretraining) at a directory holding "
            "the four *-ubyte.gz files, or use "
            "`data.source=tfds` with `data.name=fashion_mnist`."
        )
    splits = {}
    for split, (images_file, labels_file) in _IDX_FILES.items():
        images = read_idx(os.path.join(directory, images_file))
        labels = read_idx(os.path.join(directory, labels_file)).astype(np.int64)
        splits[split] = ArraySource(images, labels)
    return Dataset("fashion_mnist", splits["train"], splits["test"], FASHION_MNIST_CLASSES)
