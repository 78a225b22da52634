"""Tests for the embedded (digits, Fashion-MNIST) and image-folder sources."""

import gzip
import os
import struct

import numpy as np
import pytest
from PIL import Image

from aepg_jax.data import embedded, folder
from aepg_jax.data.source import ArraySource, Dataset, Source, to_rgb


def test_digits_real_data():
    ds = embedded.load_digits(split_seed=0)
    assert len(ds.train) + len(ds.test) == 1797
    assert len(ds.test) == 360
    assert isinstance(ds.train, Source)
    image = ds.train.image(0)
    assert image.shape == (8, 8, 3) and image.dtype == np.uint8
    np.testing.assert_array_equal(image[..., 0], image[..., 2])
    # Stratified: every class keeps ~20% of its examples in the test split.
    per_class = np.bincount(ds.test.labels, minlength=10) / (
        np.bincount(ds.test.labels, minlength=10) + np.bincount(ds.train.labels, minlength=10)
    )
    np.testing.assert_allclose(per_class, 0.2, atol=0.02)
    again = embedded.load_digits(split_seed=0)
    np.testing.assert_array_equal(again.test.labels, ds.test.labels)
    assert not np.array_equal(embedded.load_digits(split_seed=1).test.labels, ds.test.labels)


def _write_idx(path, array):
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_fashion_mnist_idx_reader(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {
        "train-images-idx3-ubyte.gz": rng.integers(0, 256, (12, 28, 28)),
        "train-labels-idx1-ubyte.gz": rng.integers(0, 10, 12),
        "t10k-images-idx3-ubyte.gz": rng.integers(0, 256, (5, 28, 28)),
        "t10k-labels-idx1-ubyte.gz": rng.integers(0, 10, 5),
    }
    for name, array in arrays.items():
        _write_idx(tmp_path / name, array)
    ds = embedded.load_fashion_mnist(str(tmp_path))
    assert (len(ds.train), len(ds.test)) == (12, 5)
    assert len(ds.class_names) == 10
    np.testing.assert_array_equal(ds.train.labels, arrays["train-labels-idx1-ubyte.gz"])
    image = ds.test.image(4)
    assert image.shape == (28, 28, 3)
    np.testing.assert_array_equal(image[..., 1], arrays["t10k-images-idx3-ubyte.gz"][4])


def test_fashion_mnist_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        embedded.load_fashion_mnist(str(tmp_path))
    bad = tmp_path / "x.gz"
    with gzip.open(bad, "wb") as f:
        f.write(bytes([0, 0, 0x08, 1]) + struct.pack(">I", 10) + b"\x00" * 3)
    with pytest.raises(ValueError, match="truncated"):
        embedded.read_idx(str(bad))


@pytest.mark.skipif(
    not os.path.exists(embedded.FASHION_MNIST_DIR),
    reason="Debian's dataset-fashion-mnist is not installed",
)
def test_fashion_mnist_real_files():
    ds = embedded.load_fashion_mnist()
    assert (len(ds.train), len(ds.test)) == (60000, 10000)
    assert ds.train.image(0).shape == (28, 28, 3)
    np.testing.assert_array_equal(np.bincount(ds.test.labels), [1000] * 10)


def _make_folder(root, classes, per_class, size=(12, 9), mode="RGB"):
    rng = np.random.default_rng(0)
    for name in classes:
        os.makedirs(root / name, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
            Image.fromarray(pixels).convert(mode).save(root / name / f"{i:03d}.png")


def test_image_folder_stratified_split(tmp_path):
    _make_folder(tmp_path, ["b_cls", "a_cls", "c_cls"], per_class=10, mode="L")
    (tmp_path / "a_cls" / "notes.txt").write_text("not an image")
    ds = folder.load_folder(str(tmp_path), split_seed=3)
    assert ds.class_names == ("a_cls", "b_cls", "c_cls")
    assert (len(ds.train), len(ds.test)) == (24, 6)
    np.testing.assert_array_equal(np.bincount(ds.test.labels), [2, 2, 2])
    image = ds.test.image(0)
    assert image.shape == (12, 9, 3) and image.dtype == np.uint8  # grayscale -> RGB
    train_paths = {ds.train.base.paths[i] for i in ds.train.indices}
    test_paths = {ds.test.base.paths[i] for i in ds.test.indices}
    assert not train_paths & test_paths and len(train_paths | test_paths) == 30


def test_image_folder_explicit_splits(tmp_path):
    _make_folder(tmp_path / "train", ["x", "y"], per_class=3)
    _make_folder(tmp_path / "test", ["x", "y"], per_class=2)
    ds = folder.load_folder(str(tmp_path))
    assert (len(ds.train), len(ds.test)) == (6, 4)
    np.testing.assert_array_equal(ds.test.labels, [0, 0, 1, 1])
    expected = np.asarray(Image.open(tmp_path / "test" / "y" / "001.png").convert("RGB"))
    np.testing.assert_array_equal(ds.test.image(3), expected)


def test_image_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        folder.load_folder(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="no class sub-directories"):
        folder.load_folder(str(tmp_path))
    os.makedirs(tmp_path / "empty_class")
    with pytest.raises(FileNotFoundError, match="holds no images"):
        folder.load_folder(str(tmp_path))


def test_dataset_rejects_out_of_range_labels():
    source = ArraySource(np.zeros((2, 4, 4), np.uint8), np.array([0, 3]))
    with pytest.raises(ValueError, match="labels span"):
        Dataset("bad", source, source, ("a", "b"))


def test_to_rgb():
    gray = np.arange(6, dtype=np.uint8).reshape(2, 3)
    assert to_rgb(gray).shape == (2, 3, 3)
    rgba = np.zeros((2, 2, 4), np.uint8)
    assert to_rgb(rgba).shape == (2, 2, 3)
    with pytest.raises(TypeError, match="uint8"):
        to_rgb(np.zeros((2, 2), np.float32))


def test_load_dataset_dispatches_every_source(tmp_path):
    from aepg_jax.data import datasets

    assert datasets.load_dataset("digits", split_seed=2).name == "digits"
    _make_folder(tmp_path / "imgs", ["a", "b"], per_class=5)
    ds = datasets.load_dataset("folder", name="clrs", data_dir=str(tmp_path / "imgs"))
    assert ds.name == "clrs" and ds.class_names == ("a", "b")
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        datasets.load_dataset("fashion_mnist", data_dir=str(tmp_path))
    with pytest.raises(ValueError, match="needs data_dir"):
        datasets.load_dataset("folder")
    with pytest.raises(ValueError, match="needs name, one of: caltech_birds2011"):
        datasets.load_dataset("tfds")
    with pytest.raises(ValueError, match="Unknown data source 'cifar'; valid: digits"):
        datasets.load_dataset("cifar")


def test_the_registry_answers_what_code_outside_data_asks():
    """Every source is one `SourceSpec`; the config checks, the caches' names, the planner's
    size key and the split-file rule come from it (nothing outside data/ names a source)."""
    import ml_collections

    from aepg_jax.data import datasets

    assert datasets.SOURCES == ("digits", "digits_domains", "fashion_mnist", "folder", "tfds")
    assert datasets.sources_for("scratch") == ("digits", "fashion_mnist", "tfds")

    def block(**kw):
        fields = dict(source="digits", name=None, data_dir=None, split_seed=3, split_file=None)
        return ml_collections.ConfigDict({**fields, **kw})

    assert datasets.config_problems(block()) == []
    assert datasets.config_problems(block(source="cifar")) == [
        "data.source='cifar' is unknown; use one of digits, digits_domains, fashion_mnist, "
        "folder, tfds."
    ]
    assert datasets.config_problems(block(source="folder")) == [
        "data.source=folder needs data.data_dir=<image folder root>."
    ]
    assert datasets.config_problems(block(source="folder", data_dir="x")) == []
    assert datasets.config_problems(block(source="tfds")) == [
        "data.source=tfds needs data.name=<tfds name>."
    ]
    assert datasets.config_problems(block(source="folder", data_dir="x"), "scratch") == [
        "data.source='folder' is unknown; use one of digits, fashion_mnist, tfds."
    ]

    digits = datasets.load_configured(block())
    assert datasets.run_name(block(), digits) == "digits-split3"
    cifar = Dataset("cifar10", digits.train, digits.test, digits.class_names)
    assert datasets.run_name(block(source="tfds", name="cifar10"), cifar) == "cifar10"
    assert datasets.size_key(block(source="tfds", name="cifar10")) == "cifar10"
    assert datasets.size_key(block(source="fashion_mnist")) == "fashion_mnist"
    assert datasets.size_key(block(source="folder", name="clrs25")) == "folder:clrs25"
    assert datasets.size_key(block(source="folder", name=None)) == "folder"
    train, test, classes = datasets.shipped_labels(block())
    np.testing.assert_array_equal(train, digits.train.labels)
    np.testing.assert_array_equal(test, digits.test.labels)
    assert classes == 10
    assert datasets.shipped_labels(block(source="tfds", name="cifar10")) is None
    assert datasets.shipped_domains(block()) is None  # one domain
    domains = datasets.load_configured(block(source="digits_domains"))
    assert datasets.run_name(block(source="digits_domains"), domains) == "digits_domains-split3"
    train_ids, test_ids, names = datasets.shipped_domains(block(source="digits_domains"))
    np.testing.assert_array_equal(train_ids, domains.train.domains)
    np.testing.assert_array_equal(test_ids, domains.test.domains)
    assert names == domains.domain_names
    assert [s for s in datasets.SOURCES if datasets.takes_split_file(block(source=s))] == ["folder"]


def test_domains_pass_through_subsets_and_are_checked():
    from aepg_jax.data.source import ArraySource, Dataset, SubsetSource, domains_of

    images = np.zeros((4, 2, 2), np.uint8)
    both = ArraySource(images, [0, 1, 0, 1], domains=[0, 0, 1, 1])
    ds = Dataset("x", both, SubsetSource(both, [1, 2]), ("a", "b"), ("d0", "d1"))
    np.testing.assert_array_equal(domains_of(ds.test), [0, 1])
    assert domains_of(ArraySource(images, [0, 1, 0, 1])) is None
    with pytest.raises(ValueError, match="no domain id per example"):
        Dataset("x", ArraySource(images, [0, 1, 0, 1]), both, ("a", "b"), ("d0", "d1"))
    with pytest.raises(ValueError, match="domain ids span"):
        Dataset("x", both, both, ("a", "b"), ("d0",))
