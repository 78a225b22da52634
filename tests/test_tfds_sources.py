"""Tests for aepg_jax.data.tfds_sources: TFDS datasets read without TensorFlow, offline.

Two kinds of data, neither needing TensorFlow nor the network:
* `tfds.testing.mock_data`: random examples from each builder's code (every split has
  `num_examples` examples, slicing ignored; image decoding cannot be skipped, see the module).
* a real array_record `fashion_mnist` written to a temporary data_dir by a builder that yields
  PNG bytes (preparing needs no TensorFlow then), read through the real skip-decoding path.
"""

import io
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

from aepg_jax.data.source import Dataset, SubsetSource
from aepg_jax.data.tfds_sources import (
    TFDS_DATASETS,
    DatasetNotPreparedError,
    TfdsSource,
    load_tfds,
    prepare_command,
)

NUM_MOCK = 47  # 80% of 47 is 37.6: checks the rounding of the ImageNet-R cut too.
REAL_SIZES = {"train": 30, "test": 12}


def _tfds_names(name):
    return tuple(tfds.builder(name).info.features[TFDS_DATASETS[name].label_feature].names)


def _check_split(source, num_classes, expected_len):
    assert len(source) == expected_len
    labels = source.labels
    assert labels.dtype == np.int64 and labels.shape == (expected_len,)
    assert labels.min() >= 0 and labels.max() < num_classes
    for index in (0, expected_len - 1):
        image = source.image(index)
        assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[-1] == 3


@pytest.fixture
def valid_mock_bboxes(monkeypatch):
    """TFDS 4.9.10's random mock draws bounding boxes with min > max, which BBoxFeature's own
    encoder then rejects (caltech_birds2011 has a bbox feature); order the coordinates."""
    encode = tfds.features.BBoxFeature.encode_example

    def ordered(self, bbox):
        y0, x0, y1, x1 = np.asarray(bbox, np.float64)
        return encode(self, np.array([min(y0, y1), min(x0, x1), max(y0, y1), max(x0, x1)]))

    monkeypatch.setattr(tfds.features.BBoxFeature, "encode_example", ordered)


@pytest.mark.parametrize("name", sorted(TFDS_DATASETS))
def test_each_registered_dataset_loads_from_the_mock(name, valid_mock_bboxes):
    with tfds.testing.mock_data(num_examples=NUM_MOCK):
        data = load_tfds(name)
    assert isinstance(data, Dataset) and data.name == name
    num_classes = len(data.class_names)
    if name == "imagenet_r":
        _check_split(data.train, num_classes, round(0.8 * NUM_MOCK))
        _check_split(data.test, num_classes, NUM_MOCK - round(0.8 * NUM_MOCK))
    else:
        assert data.class_names == _tfds_names(name)
        assert num_classes == TFDS_DATASETS[name].num_classes
        domains = TFDS_DATASETS[name].domains  # one config per domain, each mocked
        assert data.domain_names == domains
        _check_split(data.train, num_classes, NUM_MOCK * max(1, len(domains)))
        _check_split(data.test, num_classes, NUM_MOCK * max(1, len(domains)))


def test_imagenet_r_is_the_80_20_cut_of_the_whole_test_split():
    with tfds.testing.mock_data(num_examples=NUM_MOCK):
        data = load_tfds("imagenet_r")
        raw = tfds.data_source("imagenet_r", split="test", download=False)
        raw_labels = np.array([int(raw[i]["label"]) for i in range(len(raw))])
        raw_image = raw[NUM_MOCK - 1]["image"]
    cut = 38  # TFDS's `test[:80%]` of 47 examples (closest rounding).
    assert isinstance(data.train, SubsetSource) and isinstance(data.test, SubsetSource)
    assert data.train.base is data.test.base
    assert list(data.train.indices) == list(range(cut))
    assert list(data.test.indices) == list(range(cut, NUM_MOCK))
    assert len(data.train) + len(data.test) == len(raw) == NUM_MOCK
    # Index order is the TFDS record order: last test image is the split's last record.
    np.testing.assert_array_equal(data.test.image(len(data.test) - 1), raw_image)

    # Labels: the ids used anywhere in `test`, sorted, -> 0..K-1; one mapping for both splits.
    used = np.unique(raw_labels)
    names = _tfds_names("imagenet_r")
    assert len(names) == 1000
    assert data.class_names == tuple(names[i] for i in used)
    np.testing.assert_array_equal(data.train.labels, np.searchsorted(used, raw_labels[:cut]))
    np.testing.assert_array_equal(data.test.labels, np.searchsorted(used, raw_labels[cut:]))
    all_labels = np.concatenate([data.train.labels, data.test.labels])
    np.testing.assert_array_equal(np.unique(all_labels), np.arange(len(used)))
    np.testing.assert_array_equal(used[all_labels], raw_labels)  # Order-preserving, invertible.


def test_fashion_mnist_from_the_mock_has_three_identical_channels():
    with tfds.testing.mock_data(num_examples=4):
        data = load_tfds("fashion_mnist")
    image = data.test.image(2)
    assert image.shape == (28, 28, 3) and image.dtype == np.uint8
    np.testing.assert_array_equal(image[..., 0], image[..., 1])
    np.testing.assert_array_equal(image[..., 0], image[..., 2])


def _build_real_fashion_mnist(data_dir):
    """A tiny real `fashion_mnist` in array_record format; returns the images and labels."""
    written = {}
    for split, n in REAL_SIZES.items():
        rng = np.random.default_rng(len(split))
        written[split] = (
            rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
            rng.integers(0, 10, n),
        )

    def examples(split):
        for i, (image, label) in enumerate(zip(*written[split], strict=True)):
            buffer = io.BytesIO()
            Image.fromarray(image).save(buffer, format="png")
            yield i, {"image": buffer.getvalue(), "label": int(label)}

    class Builder(tfds.image_classification.FashionMNIST, skip_registration=True):
        name = "fashion_mnist"

        def _split_generators(self, dl_manager):
            return {split: examples(split) for split in REAL_SIZES}

    Builder(data_dir=os.fspath(data_dir), file_format="array_record").download_and_prepare()
    return written


@pytest.fixture(scope="module")
def real_fashion_mnist(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("tfds")
    return data_dir, _build_real_fashion_mnist(data_dir)


def test_real_array_record_data_reads_without_decoding_for_labels(real_fashion_mnist):
    data_dir, written = real_fashion_mnist
    data = load_tfds("fashion_mnist", data_dir=data_dir)
    assert data.class_names == _tfds_names("fashion_mnist")
    for split in ("train", "test"):
        source = getattr(data, split)
        images, labels = written[split]
        assert isinstance(source, TfdsSource) and len(source) == REAL_SIZES[split]
        # Records come with the image still encoded: the label scan decodes no image.
        assert isinstance(source.data_source[0]["image"], bytes)
        # TFDS shuffles records when preparing: match each record to what was written.
        order = [
            int(np.flatnonzero((images == source.image(i)[..., 0]).all(axis=(1, 2)))[0])
            for i in range(len(source))
        ]
        assert sorted(order) == list(range(len(images)))
        np.testing.assert_array_equal(source.labels, labels[order])
        assert source.labels is source.labels  # Computed once, cached.
        image = source.image(0)
        assert image.shape == (28, 28, 3) and image.dtype == np.uint8
        np.testing.assert_array_equal(image[..., 0], image[..., 2])


def test_not_prepared_error_gives_the_build_command(tmp_path):
    for name in TFDS_DATASETS:
        with pytest.raises(DatasetNotPreparedError) as info:
            load_tfds(name, data_dir=tmp_path)
        message = str(info.value)
        command = f"tfds build {name} --file_format=array_record --data_dir={tmp_path}"
        assert command in message and command == prepare_command(name, tmp_path)
        assert "\n" not in message and f"is not prepared in {tmp_path}" in message
        assert f"(data.data_dir={tmp_path})" in message
        source = "DIR" if TFDS_DATASETS[name].domains else "ARCHIVE"
        assert f"python -m aepg_jax.prepare {name} --source={source}" in message
        assert "manual_dir" not in message
        assert isinstance(info.value, FileNotFoundError)


def test_a_missing_dataset_in_the_default_data_dir_says_so_in_one_line(capsys):
    """data.data_dir unset: the line names TFDS's default directory as the default, and TFDS's
    own warnings about its missing dataset_info.json are not shown."""
    with pytest.raises(DatasetNotPreparedError) as info:
        load_tfds("cifar100", data_dir=None)
    message = str(info.value)
    assert "\n" not in message and "TFDS's default: data.data_dir is not set" in message
    assert "--config.data.data_dir=" in message
    assert capsys.readouterr().err == ""  # no TFDS warnings before it


def test_wrong_file_format_error_gives_the_build_command(real_fashion_mnist, tmp_path):
    data_dir, _ = real_fashion_mnist
    shutil.copytree(data_dir / "fashion_mnist", tmp_path / "fashion_mnist")
    (info_path,) = (tmp_path / "fashion_mnist").glob("*/dataset_info.json")
    info = json.loads(info_path.read_text())
    info["fileFormat"] = "tfrecord"
    info_path.write_text(json.dumps(info))
    with pytest.raises(DatasetNotPreparedError, match="as tfrecord") as error:
        load_tfds("fashion_mnist", data_dir=tmp_path)
    assert prepare_command("fashion_mnist", tmp_path) in str(error.value)


def test_unknown_name_lists_the_supported_ones():
    with pytest.raises(ValueError, match="Unknown TFDS dataset 'mnist'") as error:
        load_tfds("mnist")
    for name in TFDS_DATASETS:
        assert name in str(error.value)
