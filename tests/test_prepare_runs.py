"""Prepared datasets run end to end: a 2-task continual run (the tiny ViT of tests/tiny.py) on
ImageNet-R, Food-101, CUB-200 and CLRS25, and the scratch trainer on CIFAR, each on the data
`python -m aepg_jax.prepare` wrote from a tiny archive with the official layout, offline.
ImageNet-R's run is in CI; the others are slow (the same code path, other builders)."""

import json

import numpy as np
import pytest
from test_prepare import offline, prepare  # noqa: F401 (fixture)
from test_scratch import tiny_config as scratch_tiny_config
from tiny import tiny_config

from aepg_jax.continual import trainer as continual_trainer
from aepg_jax.prepare import tfds_build
from aepg_jax.scratch import trainer

CONTINUAL = [
    "imagenet_r",
    pytest.param("food101", marks=pytest.mark.slow),
    pytest.param("caltech_birds2011", marks=pytest.mark.slow),
    pytest.param("clrs25", marks=pytest.mark.slow),
    pytest.param("imagenet_r_folder", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name", CONTINUAL)
def test_two_task_continual_run_on_prepared_data(tmp_path, offline, name):  # noqa: F811
    dataset = name.removesuffix("_folder")
    paths = prepare(dataset, tmp_path)
    data = {"data.source": "tfds", "data.name": dataset, "data.data_dir": str(tmp_path / "data")}
    if dataset == "clrs25":
        data = {"data.source": "folder", "data.data_dir": str(tmp_path / "data" / "clrs25")}
    if name == "imagenet_r_folder":  # L2P's split through the split file
        import tarfile

        with tarfile.open(paths[0]) as tar:
            tar.extractall(tmp_path / "folder", filter="data")
        data = {
            "data.source": "folder",
            "data.name": "imagenet_r",
            "data.data_dir": str(tmp_path / "folder" / "imagenet-r"),
            "data.split_file": str(
                tmp_path / "data" / "imagenet_r" / "0.2.0" / tfds_build.SPLIT_FILE
            ),
        }
    cfg = tiny_config(
        tmp_path / "cache",
        **data,
        **{"data.num_tasks": 2, "max_steps_per_task": 2, "optim.batch_size": 2},
        # The CI run takes the cheapest method to compile; the slow ones LAE.
        **{"eval.batch_size": 8, "loss.name": "aepg"},
        **{"method.name": "plain" if name == "imagenet_r" else "lae"},
    )
    results = continual_trainer.run(cfg, str(tmp_path / "run"))
    saved = json.load(open(tmp_path / "run" / "results.json"))
    matrix = np.array(saved["accuracy_matrix"], dtype=float)
    assert matrix.shape == (2, 2) and np.all(np.isfinite(matrix[np.triu_indices(2)]))
    assert saved["A_T"] == pytest.approx(results["A_T"])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_scratch_run_on_prepared_cifar(tmp_path, offline, name):  # noqa: F811
    prepare(name, tmp_path)
    cfg = scratch_tiny_config(
        tmp_path / "cache",
        **{
            "data.source": "tfds",
            "data.name": name,
            "data.data_dir": str(tmp_path / "data"),
            "data.image_size": 32,
            "data.pad": 4,
            "optim.batch_size": 8,
            "optim.epochs": 1,
            "max_steps_per_epoch": 2,
        },
    )
    results = trainer.run(cfg, str(tmp_path / "run"))
    assert results["num_classes"] == (10 if name == "cifar10" else 100)
    assert len(results["test_acc"]) == 1 and np.isfinite(results["test_acc"][0])
