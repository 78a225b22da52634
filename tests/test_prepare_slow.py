"""Slow checks of `python -m aepg_jax.prepare` (run with `-m slow`):

* a SIGKILLed preparation leaves nothing a run reads, and its re-run writes the same bytes as
  an uninterrupted one;
* the records equal, in the same order, those TFDS's own unmodified builder writes from the
  same archive. That needs TensorFlow, which the project's venv never has: set
  `AEPG_TF_PYTHON` to the python of a separate venv with `tensorflow-cpu tensorflow-datasets
  array_record importlib_resources` (and `opencv-python-headless` for CUB); skipped otherwise.
"""

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import fake_archives
import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image
from test_prepare import visible

from aepg_jax.prepare import tfds_build

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def _prepare_cmd(name, paths, data_dir, sums):
    return [
        sys.executable,
        "-m",
        "aepg_jax.prepare",
        name,
        *(f"--source={p}" for p in paths),
        f"--data_dir={data_dir}",
        f"--checksums={sums}",
    ]


def _tree(directory):
    return {
        os.path.relpath(os.path.join(d, f), directory): open(os.path.join(d, f), "rb").read()
        for d, _, files in os.walk(directory)
        for f in files
    }


def test_a_killed_preparation_reruns_to_the_same_bytes(tmp_path):
    paths = fake_archives.make_imagenet_r(str(tmp_path), per_class=1500)
    sums = fake_archives.checksums_tsv(paths, tmp_path / "sums.tsv")
    reference = tmp_path / "reference"
    subprocess.run(_prepare_cmd("imagenet_r", paths, reference, sums), check=True, cwd=ROOT)
    data_dir = tmp_path / "data"
    staging = Path(tfds_build.staging_dir(str(data_dir), "imagenet_r"))
    kills = 0
    for delay in (0.0, 0.3, 0.6, 0.9):
        proc = subprocess.Popen(
            _prepare_cmd("imagenet_r", paths, data_dir, sums),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        while not staging.exists() and proc.poll() is None:
            time.sleep(0.01)
        time.sleep(delay)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            kills += 1
            assert not (data_dir / "imagenet_r").exists()  # nothing a run would read
        else:
            break
    assert kills >= 2
    subprocess.run(_prepare_cmd("imagenet_r", paths, data_dir, sums), check=True, cwd=ROOT)
    assert visible(data_dir) == ["imagenet_r"]  # the killed runs' staging is gone
    ours, theirs = _tree(data_dir / "imagenet_r"), _tree(reference / "imagenet_r")
    assert ours.keys() == theirs.keys() and len(ours) >= 4
    for name in ours:
        assert ours[name] == theirs[name], name


TF_PYTHON = os.environ.get("AEPG_TF_PYTHON")
REFERENCE = [
    ("imagenet_r", "tar"),
    ("cifar10", "binary"),
    ("cifar10", "python"),
    ("cifar100", "binary"),
    ("cifar100", "python"),
    ("food101", "tar"),
    ("caltech_birds2011", "tar"),
]


def _open(version_dir, split):
    builder = tfds.builder_from_directory(os.fspath(version_dir))
    images = [k for k, f in builder.info.features.items() if isinstance(f, tfds.features.Image)]
    decoders = {k: tfds.decode.SkipDecoding() for k in images}
    return builder.as_data_source(split=split, decoders=decoders), images


def _pixels(data):
    return np.asarray(Image.open(io.BytesIO(data)))


@pytest.mark.skipif(not TF_PYTHON, reason="AEPG_TF_PYTHON (a venv with TensorFlow) not set")
@pytest.mark.parametrize(("name", "fmt"), REFERENCE)
def test_records_and_order_equal_tfds_own_builder(tmp_path, name, fmt):
    src = tmp_path / "src"
    src.mkdir()
    if name.startswith("cifar"):
        tfds_paths = fake_archives.make_cifar(str(src), name, "binary")
        paths = fake_archives.make_cifar(str(src), name, fmt)  # same images and labels
    else:
        paths = tfds_paths = fake_archives.MAKERS[name](str(src))
    subprocess.run(
        [
            TF_PYTHON,
            str(ROOT / "tests" / "tfds_reference_build.py"),
            name,
            str(tmp_path / "tfds"),
            *tfds_paths,
        ],
        check=True,
        cwd=ROOT,
        capture_output=True,
    )
    sums = fake_archives.checksums_tsv(paths, tmp_path / "sums.tsv")
    subprocess.run(_prepare_cmd(name, paths, tmp_path / "ours", sums), check=True, cwd=ROOT)
    (version,) = os.listdir(tmp_path / "ours" / name)
    ours_dir, tfds_dir = tmp_path / "ours" / name / version, tmp_path / "tfds" / name / version
    splits = tfds.builder_from_directory(os.fspath(tfds_dir)).info.splits
    assert set(splits) == set(tfds.builder_from_directory(os.fspath(ours_dir)).info.splits)
    for split in splits:
        ours, images = _open(ours_dir, split)
        theirs, _ = _open(tfds_dir, split)
        assert len(ours) == len(theirs) == splits[split].num_examples > 0
        for i in range(len(theirs)):
            a, b = ours[i], theirs[i]
            assert a.keys() == b.keys()
            for key in a:
                if key in images and (name.startswith("cifar") or key == "segmentation_mask"):
                    # PNGs: Pillow's encoder here, TensorFlow's there: same pixels.
                    np.testing.assert_array_equal(_pixels(a[key]), _pixels(b[key]))
                else:  # JPEGs byte for byte; ids, labels, file names, boxes exactly
                    np.testing.assert_array_equal(a[key], b[key], err_msg=f"{split}[{i}] {key}")
        if name.startswith("cifar"):
            for label in ("label", "coarse_label") if name == "cifar100" else ("label",):
                ours_info = tfds.builder_from_directory(os.fspath(ours_dir)).info.features
                tfds_info = tfds.builder_from_directory(os.fspath(tfds_dir)).info.features
                assert ours_info[label].names == tfds_info[label].names
