"""The run of a config without its data or weights: the task split from the dataset's sizes and
the parameters as shapes, built by the run's own code (`continual/setup.py`).

Dataset sizes (`SIZES`: train / test examples and classes of the splits that
`data/tfds_sources.py` makes) stand in for the data; the classes are taken as equally frequent
(`n // C` or `n // C + 1` examples each), so per-task counts match the real split's up to a
few images. `digits` is read (it ships with scikit-learn). The prepared image folders are keyed
by `data.name` (`folder:vtab`); other sources (an image folder of your own) need `--num_train`,
`--num_test` and `--num_classes`. With `data.scenario=domain` the task split is one task per
domain: a shipped source's own domains (`digits_domains`), otherwise `data.num_tasks` equal
domains holding every class (a real dataset's domains differ in size: the plan's per-task step
counts are then estimates).

The backbone is whatever `model.*` describes, as shapes only: `model.init=augreg` and
`pretrained` are planned as `random` (a checkpoint that loads has the model's shapes, which
loading checks), so `model.checkpoint` is never opened. The trainable trees (PEFT, heads, the
method's own leaves) are small and built for real on the host by `setup.initial_trees` and
`state.trainable_for`, as a run builds them.
"""

from __future__ import annotations

import jax
import ml_collections
import numpy as np

from aepg_jax.config import schema
from aepg_jax.continual import setup
from aepg_jax.data import datasets, loader

# `datasets.size_key` (a TFDS name, `folder:<data.name>`, or a source) -> (train examples, test
# examples, classes) of our splits.
SIZES: dict[str, tuple[int, int, int]] = {
    "imagenet_r": (24_000, 6_000, 200),  # test[:80%] / test[80%:] of 30,000
    "food101": (75_750, 25_250, 101),
    "caltech_birds2011": (5_994, 5_794, 200),
    "cifar10": (50_000, 10_000, 10),
    "cifar100": (50_000, 10_000, 100),
    "fashion_mnist": (60_000, 10_000, 10),
    "domainnet": (409_832, 176_743, 345),  # six domains' train / test lists, concatenated
    # image folders by `data.name` (`python -m aepg_jax.prepare` writes them)
    "folder:clrs25": (12_000, 3_000, 25),  # the stratified 80/20 split of 600 per class
    "folder:imagenet_a": (5_981, 1_519, 200),  # PILOT's train/ and test/ folders
    "folder:objectnet": (26_509, 6_628, 200),
    "folder:omnibenchmark": (89_697, 5_985, 300),
    "folder:vtab": (1_796, 8_619, 50),
}


def dataset_labels(
    cfg: ml_collections.ConfigDict, sizes: tuple[int, int, int] | None = None
) -> tuple[np.ndarray, np.ndarray, int]:
    """`(train labels, test labels, classes)` of the config's dataset (see module docstring)."""
    d = cfg.data
    if sizes is None:
        shipped = datasets.shipped_labels(d)
        if shipped is not None:
            return shipped
        sizes = SIZES.get(datasets.size_key(d))
    if sizes is None:
        raise ValueError(
            f"data.source={d.source} (data.name={d.name}): the plan reads no data and knows no "
            f"size for it; give --num_train, --num_test and --num_classes."
        )
    n_train, n_test, classes = sizes
    return np.arange(n_train) % classes, np.arange(n_test) % classes, classes


def dataset_domains(
    cfg: ml_collections.ConfigDict, n_train: int, n_test: int, classes: int, sized: bool
) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """`(train domain ids, test domain ids, domain names)` for `data.scenario=domain`: the
    shipped source's own, else `data.num_tasks` equal domains, each with every class (example
    i, whose class is i mod C, in domain (i // C) mod T)."""
    d = cfg.data
    shipped = None if sized else datasets.shipped_domains(d)
    if shipped is not None:
        return shipped
    tasks = d.num_tasks
    names = tuple(f"domain{t}" for t in range(tasks))
    return (np.arange(n_train) // classes) % tasks, (np.arange(n_test) // classes) % tasks, names


def run_data(cfg: ml_collections.ConfigDict, sizes=None) -> setup.RunData:
    """The run's `RunData` with its real task split and no images (`train`/`test` None)."""
    train, test, classes = dataset_labels(cfg, sizes)
    d = cfg.data
    domains = None
    if d.scenario == "domain":
        domains = dataset_domains(cfg, len(train), len(test), classes, sizes is not None)
    schema.validate_against_dataset(cfg, classes, domains[2] if domains else (), d.name or d.source)
    tasks = setup.task_split(d, train, test, classes, domains)  # indices: as the run's
    names = tuple(str(c) for c in range(classes))
    return setup.RunData(d.name or d.source, names, None, None, tasks)  # type: ignore[arg-type]


def random_init(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`cfg` with `model.init=random` (same shapes; no checkpoint to read, nothing to pretrain)."""
    out = ml_collections.ConfigDict(cfg.to_dict())
    out.model.init = "random"
    return out


def shape_run(cfg: ml_collections.ConfigDict, sizes=None) -> setup.Run:
    """The `Run` of `cfg` on the host's CPU with its backbone as `ShapeDtypeStruct`s."""
    random_cfg = random_init(cfg)
    _, keys, frozen_axis = setup.seed_axis(cfg)
    peft_of = jax.jit(lambda k: setup.initial_trees(random_cfg, k, None)[0])  # backbone DCE'd
    initial_peft = tuple(peft_of(k) for k in keys)
    backbone = jax.eval_shape(lambda k: setup.initial_trees(random_cfg, k, None)[1], keys[0])
    if frozen_axis == 0:
        backbone = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct((len(keys), *x.shape), x.dtype), backbone
        )
    mesh = loader.data_mesh(jax.devices("cpu")[:1])
    return setup.assemble(cfg, "", mesh, run_data(cfg, sizes), initial_peft, backbone, "")
