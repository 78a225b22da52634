"""docs/data.md's "Your own dataset", followed as a user would: a tiny image folder of one's own
(a few classes of 8x8 PNGs) in each documented layout gives the documented classes, class order
and splits, and the section's own `aepg_jax.main` command, run on it, writes results.json."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from aepg_jax.data import datasets

ROOT = pathlib.Path(__file__).resolve().parents[1]
SECTION = "## Your own dataset"
# Sorted by name, "10" comes before "2": the documented class order, not the numeric one.
CLASSES = ("owl", "10", "cat", "2")
PER_CLASS = 5


def _images(folder: pathlib.Path, seed: int, count: int = PER_CLASS) -> None:
    """`count` 8x8 PNGs in `folder`, each class a different grey level plus noise."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for i in range(count):
        pixels = np.full((8, 8, 3), 50 * seed, np.uint8) + rng.integers(0, 40, (8, 8, 3), np.uint8)
        Image.fromarray(pixels).save(folder / f"{i:02d}.png")


def make_folder(root: pathlib.Path, splits: tuple[str, ...] = ()) -> pathlib.Path:
    """An image folder `root/<class>/*.png`, or `root/<split>/<class>/*.png` per split; also a
    file that is not an image, which the source skips."""
    for seed, name in enumerate(CLASSES):
        for split in splits or ("",):
            _images(root / split / name, seed)
    (root / (splits[0] if splits else "") / "cat" / "notes.txt").write_text("not an image")
    return root


def section() -> str:
    text = (ROOT / "docs/data.md").read_text()
    start = text.index(SECTION)
    return text[start : text.index("\n## ", start + 1)]


def test_the_layouts_give_the_documented_classes_and_splits(tmp_path):
    flat = make_folder(tmp_path / "data" / "mine")
    names = tuple(sorted(CLASSES))  # "10", "2", "cat", "owl"
    # A data root holding the folder as <data_dir>/<name>, or the folder named directly.
    for data_dir in (tmp_path / "data", flat):
        d = datasets.load_dataset("folder", name="mine", data_dir=str(data_dir))
        assert d.class_names == names
        # Stratified 80/20 of every class, from data.split_seed; the text file left out.
        assert (len(d.train), len(d.test)) == (4 * 4, 4 * 1)
        assert np.bincount(d.test.labels).tolist() == [1, 1, 1, 1]
        assert all(p.endswith(".png") for p in d.train.base.paths)
        # Label k is the k-th class folder in sorted name order; files in sorted order.
        first_owl = d.train.base.paths[list(d.train.base.labels).index(names.index("owl"))]
        assert first_owl == str(flat / "owl" / "00.png")
    other_seed = datasets.load_dataset("folder", name="mine", data_dir=str(flat), split_seed=1)
    assert not np.array_equal(other_seed.test.indices, d.test.indices)

    # train/ and test/ sub-folders are the splits as they are.
    fixed = make_folder(tmp_path / "fixed", splits=("train", "test"))
    d = datasets.load_dataset("folder", name="fixed", data_dir=str(fixed))
    assert d.class_names == names and (len(d.train), len(d.test)) == (20, 20)

    # A split file lists <class>/<file> paths under data_dir, in its order.
    split = tmp_path / "split.json"
    split.write_text(json.dumps({"train": ["owl/01.png", "2/00.png"], "test": ["owl/00.png"]}))
    d = datasets.load_dataset("folder", data_dir=str(flat), split_file=str(split))
    assert d.class_names == ("2", "owl")
    assert d.train.labels.tolist() == [1, 0] and d.test.labels.tolist() == [1]


def test_the_section_names_what_the_test_checks():
    """The section documents the layouts, the three fields and the sorted class order that the
    tests here follow, and names this file."""
    text = section()
    for needed in (
        "mine/train/<class>/*",
        "--config.data.source=folder",
        "--config.data.data_dir=path/to/mine",
        "--config.data.name=mine",
        '`"10"` before `"2"`',
        "data.split_seed",
        "data.split_file",
        "tests/test_own_dataset.py",
    ):
        assert needed in text, needed


def documented_command(folder: pathlib.Path, workdir: pathlib.Path) -> list[str]:
    """The section's `aepg_jax.main` command with the user's paths filled in."""
    block = re.search(r"```bash\n(.*?)```", section(), re.S)[1]
    argv = shlex.split(block.replace("\\\n", " "))
    assert argv[:3] == [".venv/bin/python", "-m", "aepg_jax.main"], argv
    argv = [sys.executable, *argv[1:]]
    mine = {"--config.data.data_dir=path/to/mine": f"--config.data.data_dir={folder}"}
    mine["--workdir=runs/mine"] = f"--workdir={workdir}"
    return [mine.get(a, a) for a in argv]


@pytest.mark.slow  # one run of the embedded default's model on the folder (~40 s on 2 cores)
def test_the_documented_command_runs_on_a_folder_of_ones_own(tmp_path):
    folder = make_folder(tmp_path / "mine")
    workdir = tmp_path / "runs" / "mine"
    command = [
        *documented_command(folder, workdir),
        # Shorter than the default's 20 epochs, and the caches kept out of the user's.
        "--config.optim.epochs=2",
        "--config.optim.peft_freeze_epochs=1",
        f"--config.data.cache_dir={tmp_path / 'cache'}",
    ]
    out = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=900, env=dict(os.environ)
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((workdir / "results.json").read_text())
    assert results["num_tasks"] == 2 and sorted(results["class_order"]) == [0, 1, 2, 3]
    assert len(results["accuracy_matrix"]) == 2
    assert (tmp_path / "cache" / "mine" / "train-28px" / "manifest.json").exists()
