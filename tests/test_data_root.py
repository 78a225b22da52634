"""One data root for a whole sweep: `data.data_dir=ROOT`, where ROOT holds what
`python -m aepg_jax.prepare` wrote for every dataset (TFDS's layout for TFDS datasets,
`ROOT/<name>/` for image folders), serves TFDS and folder runs alike; a folder named directly
still works. The sweep over such a root runs both kinds with no per-dataset flag, and its
output captured to files holds no carriage-return progress bars."""

from __future__ import annotations

import os
import pathlib
import textwrap

import fake_archives
import numpy as np
import pytest

from aepg_jax.data import datasets, folder
from aepg_jax.prepare import __main__ as prepare_main

TESTS = pathlib.Path(__file__).resolve().parent


def _prepare_clrs(src, root) -> None:
    paths = fake_archives.make_clrs(str(src))
    assert (
        prepare_main.main(["clrs25", *(f"--source={p}" for p in paths), f"--data_dir={root}"]) == 0
    )


def _prepare_cifar10(src, root) -> None:
    # 100 / 50 examples: every one of the 10 classes has test images in the fixed draw.
    paths = fake_archives.make_cifar(str(src), "cifar10", sizes=(("train", 100), ("test", 50)))
    sums = fake_archives.checksums_tsv(paths, src / "sums.tsv")
    args = ["cifar10", *(f"--source={p}" for p in paths), f"--data_dir={root}"]
    assert prepare_main.main([*args, f"--checksums={sums}"]) == 0


def test_a_folder_dataset_is_found_inside_a_data_root_and_named_directly(tmp_path):
    root = tmp_path / "data"
    _prepare_clrs(tmp_path / "src", root)
    assert folder.dataset_root(str(root), "clrs25") == str(root / "clrs25")
    assert folder.dataset_root(str(root / "clrs25"), "clrs25") == str(root / "clrs25")
    # A split file's paths are relative to the folder named, never to a sub-directory.
    assert folder.dataset_root(str(root), "clrs25", "split.json") == str(root)
    via_root = datasets.load_dataset("folder", name="clrs25", data_dir=str(root))
    direct = datasets.load_dataset("folder", name="clrs25", data_dir=str(root / "clrs25"))
    assert len(via_root.class_names) == 25
    assert (len(via_root.train), len(via_root.test)) == (100, 25)
    assert via_root.train.base.paths == direct.train.base.paths
    np.testing.assert_array_equal(via_root.test.labels, direct.test.labels)


CONFIG = """
import pathlib, sys
sys.path.insert(0, {tests!r})
import tiny

def get_config(arg=None):
    return tiny.tiny_config(pathlib.Path({cache!r}), **{{
        "data.source": {source!r}, "data.name": {name!r}, "data.num_tasks": {tasks},
        "optim.epochs": 1, "optim.peft_freeze_epochs": 0, "optim.batch_size": 8,
        "max_steps_per_task": 2, "eval.batch_size": 32}})
"""

EXPERIMENT = """
from aepg_jax.experiments import Experiment, Grid

EXPERIMENT = Experiment("root", "TFDS and folder runs on one data root",
                        [Grid({tfds!r}, ""), Grid({folder!r}, "")])
"""


@pytest.mark.slow
def test_a_sweep_over_one_data_root_runs_tfds_and_folder_runs(tmp_path, capfd):
    from aepg_jax.sweep import sweep

    root, src = tmp_path / "data", tmp_path / "src"
    src.mkdir()
    _prepare_clrs(src, root)
    _prepare_cifar10(src, root)
    assert sorted(e for e in os.listdir(root) if not e.startswith(".")) == ["cifar10", "clrs25"]
    configs = {}
    for source, name, tasks in (("tfds", "cifar10", 2), ("folder", "clrs25", 5)):
        path = tmp_path / f"{name}_run.py"
        text = CONFIG.format(
            tests=str(TESTS), cache=str(tmp_path / "cache"), source=source, name=name, tasks=tasks
        )
        path.write_text(text)
        configs[source] = str(path)
    experiment = tmp_path / "root_experiment.py"
    experiment.write_text(
        textwrap.dedent(EXPERIMENT.format(tfds=configs["tfds"], folder=configs["folder"]))
    )
    work = tmp_path / "runs"
    capfd.readouterr()
    code = sweep.main(
        [
            f"--experiment={experiment}",
            f"--workdir={work}",
            f"--config.data.data_dir={root}",
            "--compile_cache=",
        ]
    )
    out, err = capfd.readouterr()
    assert code == 0, out + err
    done = sorted(p.parent.parent.name for p in work.glob("*/*/results.json"))
    assert done == ["cifar10_run", "clrs25_run"]
    logs = list(work.glob("*/*/sweep.log"))
    assert len(logs) == 2
    for text in (out, err, *(p.read_text() for p in logs)):
        assert "\r" not in text
    assert all("task 1/" in p.read_text() for p in logs)  # the progress lines are there
