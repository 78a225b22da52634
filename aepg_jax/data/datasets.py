"""Every dataset source, registered by name: `REGISTRY[source]` is a `SourceSpec` (its loader
and what the config checks, the caches, the trainers and the planner need to know of it), and
`load_dataset(source, name=..., data_dir=..., ...)` loads one.

* `digits`: scikit-learn's 8x8 digits, offline (in its wheel); `name`, `data_dir` ignored.
* `digits_domains`: the same digits in four domains (original, inverted, rotated, noisy),
  offline: the multi-domain demo of the domain-incremental scenario (`data.scenario=domain`).
* `fashion_mnist`: Debian's `dataset-fashion-mnist` IDX files; `data_dir` = another IDX dir.
* `folder`: `data_dir/<class>/*.jpg` (CLRS25, raw ImageNet-R) or `data_dir/{train,test}/<class>/*`
  (PILOT's ImageNet-A, ObjectNet, OmniBenchmark, VTAB); `data_dir` may also be a data root that
  holds the folder as `data_dir/<name>/` (what `aepg_jax.prepare` writes: one `data_dir` for a
  whole sweep, TFDS datasets beside the folders); `name` labels the caches and keys the
  planner's sizes (`folder:<name>`); `split_file` (JSON train/test lists, e.g. ImageNet-R's from
  `aepg_jax.prepare`) fixes the split.
* `tfds`: TFDS `array_record` data (`name` in imagenet_r, food101, caltech_birds2011, cifar10,
  cifar100, fashion_mnist, domainnet: its six domains as one multi-domain dataset); `data_dir` =
  the TFDS data dir (default: TFDS's own), which may hold prepared folder datasets too.

`split_seed` draws the stratified 80/20 split of `digits`, of each domain of `digits_domains`
and of folders without
`train/`/`test/` sub-folders.

How to add a source: write its loader (a module of `data/`), add a `SourceSpec` to `REGISTRY`
below. Code outside `data/` asks the functions at the end of this module (`config_problems`,
`run_name`, `size_key`, `shipped_labels`, `takes_split_file`) and names no source.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping

import numpy as np

from aepg_jax.data import embedded, folder, tfds_sources
from aepg_jax.data.source import Dataset

TRAINERS = ("continual", "scratch")


def _digits(name, data_dir, split_seed, split_file) -> Dataset:
    return embedded.load_digits(split_seed)


def _digits_domains(name, data_dir, split_seed, split_file) -> Dataset:
    return embedded.load_digits_domains(split_seed)


def _fashion_mnist(name, data_dir, split_seed, split_file) -> Dataset:
    return embedded.load_fashion_mnist(data_dir)


def _folder(name, data_dir, split_seed, split_file) -> Dataset:
    if not data_dir:
        raise ValueError("source='folder' needs data_dir: the image folder's root.")
    return folder.load_folder(
        folder.dataset_root(data_dir, name, split_file), name, split_seed, split_file=split_file
    )


def _tfds(name, data_dir, split_seed, split_file) -> Dataset:
    if not name:
        raise ValueError(
            f"source='tfds' needs name, one of: {', '.join(sorted(tfds_sources.TFDS_DATASETS))}."
        )
    return tfds_sources.load_tfds(name, data_dir)


@functools.cache
def _digits_labels(split_seed: int) -> tuple[np.ndarray, np.ndarray, int]:
    ds = embedded.load_digits(split_seed)
    return np.asarray(ds.train.labels), np.asarray(ds.test.labels), len(ds.class_names)


@functools.cache
def _digits_domains_labels(split_seed: int) -> tuple[np.ndarray, np.ndarray, int]:
    ds = embedded.load_digits_domains(split_seed)
    return np.asarray(ds.train.labels), np.asarray(ds.test.labels), len(ds.class_names)


@functools.cache
def _digits_domains_ids(split_seed: int) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    ds = embedded.load_digits_domains(split_seed)
    return np.asarray(ds.train.domains), np.asarray(ds.test.domains), ds.domain_names


@dataclasses.dataclass(frozen=True)
class SourceSpec:
    """One data source: how it loads and the facts about it that code outside `data/` needs."""

    name: str  # the value of `data.source`
    # (name, data_dir, split_seed, split_file) -> the train/test Dataset
    load: Callable[[str | None, str | None, int, str | None], Dataset]
    # config field of the `data` block it cannot do without -> the one-line problem if unset
    requires: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # the dataset's name in caches and records, from the loaded Dataset and the `data` block
    # (None: the Dataset's own name)
    run_name: Callable[[Dataset, object], str] | None = None
    # the key of its sizes in the planner's table (`plan/shapes.py` SIZES), from the `data`
    # block (None: the source's name)
    size_key: Callable[[object], str | None] | None = None
    # (train labels, test labels, classes) read on the host without prepared data (a source
    # that ships with the package's dependencies), from `split_seed`; None: none ships
    shipped_labels: Callable[[int], tuple[np.ndarray, np.ndarray, int]] | None = None
    # (train domain ids, test domain ids, domain names) of a shipped multi-domain source, from
    # `split_seed`; None: none ships (or one domain)
    shipped_domains: Callable[[int], tuple[np.ndarray, np.ndarray, tuple[str, ...]]] | None = None
    takes_split_file: bool = False  # whether `data.split_file` applies
    trainers: tuple[str, ...] = TRAINERS  # the trainers that read it


REGISTRY: dict[str, SourceSpec] = {
    s.name: s
    for s in (
        SourceSpec(
            "digits",
            _digits,
            run_name=lambda ds, d: f"digits-split{d.split_seed}",
            shipped_labels=_digits_labels,
        ),
        SourceSpec(
            "digits_domains",
            _digits_domains,
            run_name=lambda ds, d: f"digits_domains-split{d.split_seed}",
            shipped_labels=_digits_domains_labels,
            shipped_domains=_digits_domains_ids,
            trainers=("continual",),
        ),
        SourceSpec("fashion_mnist", _fashion_mnist),
        SourceSpec(
            "folder",
            _folder,
            requires={"data_dir": "data.source=folder needs data.data_dir=<image folder root>."},
            size_key=lambda d: f"folder:{d.name}" if d.name else "folder",
            takes_split_file=True,
            trainers=("continual",),
        ),
        SourceSpec(
            "tfds",
            _tfds,
            requires={"name": "data.source=tfds needs data.name=<tfds name>."},
            size_key=lambda d: d.name,
        ),
    )
}
SOURCES = tuple(REGISTRY)


def get(source: str) -> SourceSpec:
    """The `SourceSpec` registered under `source`."""
    if source not in REGISTRY:
        raise ValueError(f"Unknown data source {source!r}; valid: {', '.join(SOURCES)}.")
    return REGISTRY[source]


def load_dataset(
    source: str,
    *,
    name: str | None = None,
    data_dir: str | None = None,
    split_seed: int = 0,
    split_file: str | None = None,
) -> Dataset:
    """The train/test `Dataset` of `source` (see the module table)."""
    return get(source).load(name, data_dir, split_seed, split_file)


def load_configured(d) -> Dataset:
    """`load_dataset` with the fields of a config's `data` block (both trainers' loader)."""
    return load_dataset(
        d.source,
        name=d.name,
        data_dir=d.data_dir,
        split_seed=d.split_seed,
        split_file=d.get("split_file"),
    )


# What code outside data/ asks of a config's `data` block `d`.


def sources_for(trainer: str = "continual") -> tuple[str, ...]:
    """The sources `trainer` reads."""
    return tuple(s.name for s in REGISTRY.values() if trainer in s.trainers)


def config_problems(d, trainer: str = "continual") -> list[str]:
    """One line per problem of `d.source` and the fields it requires (config validation)."""
    valid = sources_for(trainer)
    if d.source not in valid:
        return [f"data.source={d.source!r} is unknown; use one of {', '.join(valid)}."]
    return [line for field, line in REGISTRY[d.source].requires.items() if not d.get(field)]


def run_name(d, ds: Dataset) -> str:
    """The name of the loaded dataset `ds` of `d` in the caches and a run's records."""
    spec = get(d.source)
    return ds.name if spec.run_name is None else spec.run_name(ds, d)


def size_key(d) -> str | None:
    """The key of `d`'s dataset in the planner's size table (an unknown source: its name,
    which the table does not hold)."""
    spec = REGISTRY.get(d.source)
    return d.source if spec is None or spec.size_key is None else spec.size_key(d)


def shipped_labels(d) -> tuple[np.ndarray, np.ndarray, int] | None:
    """(train labels, test labels, classes) of `d`'s dataset where its source ships with the
    package's dependencies (read, no prepared data needed); None for the others."""
    spec = REGISTRY.get(d.source)
    if spec is None or spec.shipped_labels is None:
        return None
    train, test, classes = spec.shipped_labels(d.split_seed)
    return train.copy(), test.copy(), classes


def shipped_domains(d) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]] | None:
    """(train domain ids, test domain ids, domain names) of `d`'s dataset where its source
    ships with the package's dependencies and has several domains; None for the others."""
    spec = REGISTRY.get(d.source)
    if spec is None or spec.shipped_domains is None:
        return None
    train, test, names = spec.shipped_domains(d.split_seed)
    return train.copy(), test.copy(), names


def takes_split_file(d) -> bool:
    """Whether `data.split_file` applies to `d.source`."""
    return get(d.source).takes_split_file
