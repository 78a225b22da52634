"""The data-source contract: an indexable split of `(image uint8 HWC, label int)` pairs.

Every dataset (TFDS, image folder, embedded) is loaded as `Dataset(train, test, class_names)`
where `train` and `test` are `Source`s. Labels are integers in `[0, len(class_names))`; images
are uint8 arrays of shape (H, W, C) whose size may vary from one example to the next (the
decode-once cache brings them to a common storage resolution). Grayscale sources return C = 3
(the channel replicated) so every model sees RGB.

A dataset whose examples come from several domains (DomainNet's clipart, painting, ...) names
them in `Dataset.domain_names`, and each of its splits also has `domains`: int64 (N,), the
domain id of every example in index order, read without decoding an image (`domains_of`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Source(Protocol):
    """Random access to one split; `labels` is available without decoding any image."""

    @property
    def labels(self) -> np.ndarray:
        """int64 (N,) labels of every example, in index order."""
        ...

    def __len__(self) -> int: ...

    def image(self, index: int) -> np.ndarray:
        """Decoded image `index`: uint8 (H, W, 3)."""
        ...


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A dataset's train and test splits and its class names (label i is class_names[i])."""

    name: str
    train: Source
    test: Source
    class_names: tuple[str, ...]
    domain_names: tuple[str, ...] = ()  # empty: one domain, the splits have no `domains`

    def __post_init__(self):
        for split in ("train", "test"):
            source = getattr(self, split)
            labels = source.labels
            if len(labels) and (labels.min() < 0 or labels.max() >= len(self.class_names)):
                raise ValueError(
                    f"{self.name} {split}: labels span [{labels.min()}, {labels.max()}] but "
                    f"there are {len(self.class_names)} classes."
                )
            if not self.domain_names:
                continue
            domains = domains_of(source)
            if domains is None or len(domains) != len(labels):
                raise ValueError(
                    f"{self.name} {split}: {len(self.domain_names)} domains are named but the "
                    "split has no domain id per example."
                )
            if len(domains) and (domains.min() < 0 or domains.max() >= len(self.domain_names)):
                raise ValueError(
                    f"{self.name} {split}: domain ids span [{domains.min()}, {domains.max()}] "
                    f"but there are {len(self.domain_names)} domains."
                )


def domains_of(source: Source) -> np.ndarray | None:
    """int64 (N,) domain id of every example of `source`, or None for a one-domain source."""
    domains = getattr(source, "domains", None)
    return None if domains is None else np.asarray(domains, np.int64)


def to_rgb(image: np.ndarray) -> np.ndarray:
    """uint8 (H, W), (H, W, 1) or (H, W, 3) -> (H, W, 3); RGBA drops alpha."""
    image = np.asarray(image)
    if image.dtype != np.uint8:
        raise TypeError(f"Images must be uint8; got {image.dtype}.")
    if image.ndim == 2:
        image = image[..., None]
    if image.ndim != 3 or image.shape[-1] not in (1, 3, 4):
        raise ValueError(f"Expected an (H, W[, 1|3|4]) image; got shape {image.shape}.")
    if image.shape[-1] == 1:
        return np.repeat(image, 3, axis=-1)
    return image[..., :3]


@dataclasses.dataclass(frozen=True)
class ArraySource:
    """A split held in memory: `images` (N, H, W[, C]) uint8, `labels` (N,) and, for a
    multi-domain dataset, `domains` (N,)."""

    images: np.ndarray
    labels: np.ndarray
    domains: np.ndarray | None = None

    def __post_init__(self):
        if len(self.images) != len(self.labels):
            raise ValueError(f"{len(self.images)} images but {len(self.labels)} labels.")
        object.__setattr__(self, "labels", np.asarray(self.labels, np.int64))
        if self.domains is not None:
            if len(self.domains) != len(self.labels):
                raise ValueError(f"{len(self.domains)} domain ids but {len(self.labels)} labels.")
            object.__setattr__(self, "domains", np.asarray(self.domains, np.int64))

    def __len__(self) -> int:
        return len(self.labels)

    def image(self, index: int) -> np.ndarray:
        return to_rgb(self.images[index])


@dataclasses.dataclass(frozen=True)
class SubsetSource:
    """The examples `indices` of `base`, in that order."""

    base: Source
    indices: Sequence[int]

    @property
    def labels(self) -> np.ndarray:
        return np.asarray(self.base.labels)[np.asarray(self.indices, np.int64)]

    @property
    def domains(self) -> np.ndarray | None:
        domains = domains_of(self.base)
        return None if domains is None else domains[np.asarray(self.indices, np.int64)]

    def __len__(self) -> int:
        return len(self.indices)

    def image(self, index: int) -> np.ndarray:
        return self.base.image(int(self.indices[index]))
