"""`python -m aepg_jax.prepare`: each dataset from a tiny archive with the official member
layout, offline (sockets refused) and without TensorFlow (its import made to fail); what a
run reads afterwards; one-line refusals of wrong archives that leave nothing a run would read.

The slower end-to-end runs, the SIGKILL re-run and the comparison with TFDS's own builder are
in test_prepare_slow.py.
"""

import importlib.util
import io
import os
import socket
import tarfile

import fake_archives
import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

from aepg_jax.data import datasets, folder, tfds_sources
from aepg_jax.prepare import __main__ as prepare_main
from aepg_jax.prepare import archives, tfds_build


@pytest.fixture
def offline(monkeypatch):
    """No network; TensorFlow is not installed (the project's venv never has it)."""
    assert importlib.util.find_spec("tensorflow") is None, "TensorFlow must be absent here"

    def refuse(*args, **kwargs):
        raise OSError("network access in a test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def visible(data_dir):
    """Entries of a data dir other than the preparation lock files (`.<name>.lock`)."""
    return sorted(e for e in os.listdir(data_dir) if not e.endswith(".lock"))


def prepare(name, tmp_path, *extra):
    """Makes the fake archive(s) of `name`, prepares them into tmp_path/data; returns paths."""
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    paths = fake_archives.MAKERS[name](str(src))
    args = [name, *(f"--source={p}" for p in paths), f"--data_dir={tmp_path / 'data'}", *extra]
    if name != "clrs25":
        args.append("--checksums=" + fake_archives.checksums_tsv(paths, tmp_path / "sums.tsv"))
    assert prepare_main.main(args) == 0
    return paths


def _jpegs(path, prefix):
    with tarfile.open(path) as tar:
        return {
            m.name[len(prefix) :]: tar.extractfile(m).read()
            for m in tar.getmembers()
            if m.name.startswith(prefix) and m.name.endswith(".jpg") and "/._" not in m.name
        }


def _decode(data):
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _records(split_source):
    """The raw TFDS records behind a split of `load_tfds` (subsets resolved)."""
    base = getattr(split_source, "base", split_source)
    base = getattr(base, "base", base)  # RelabeledSource -> TfdsSource
    indices = getattr(split_source, "indices", range(len(split_source)))
    return [base.data_source[int(i)] for i in indices]


@pytest.mark.parametrize(
    "name", ["imagenet_r", "food101", "caltech_birds2011", "cifar10", "cifar100", "clrs25"]
)
def test_each_dataset_is_prepared_offline_into_what_a_run_reads(tmp_path, offline, name):
    (path, *_) = prepare(name, tmp_path)
    data_dir = str(tmp_path / "data")
    if name == "clrs25":
        ds = datasets.load_dataset("folder", name=name, data_dir=f"{data_dir}/clrs25")
        assert len(ds.class_names) == 25 and (len(ds.train), len(ds.test)) == (100, 25)
        assert not os.path.exists(f"{data_dir}/.clrs25.preparing")
        return
    ds = datasets.load_dataset("tfds", name=name, data_dir=data_dir)
    assert visible(data_dir) == [name]  # the staging dir is gone
    splits = {"train": _records(ds.train), "test": _records(ds.test)}
    if name == "imagenet_r":
        jpegs = _jpegs(path, "imagenet-r/")
        records = splits["train"] + splits["test"]
        assert (len(splits["train"]), len(splits["test"])) == (11, 3)  # test[:80%] / test[80%:]
        assert sorted(r["file_name"].decode() for r in records) == sorted(jpegs)
        for r in records:  # JPEG bytes stored as they are in the archive
            assert r["image"] == jpegs[r["file_name"].decode()]
        assert ds.class_names == fake_archives.IMAGENET_R_CLASSES
        labels = np.concatenate([ds.train.labels, ds.test.labels])
        wnids = [r["file_name"].decode().split("/")[0] for r in records]
        np.testing.assert_array_equal(labels, [ds.class_names.index(w) for w in wnids])
    elif name in ("food101", "caltech_birds2011"):
        first, last = (0, 100)
        assert {s: len(r) for s, r in splits.items()} == {"train": 6, "test": 2}
        assert set(ds.train.labels) == set(ds.test.labels) == {first, last}
        prefix = "food-101/images/" if name == "food101" else "CUB_200_2011/images/"
        jpegs = _jpegs(path, prefix)
        for r in splits["train"] + splits["test"]:
            key = r["image/filename"].decode()[len(prefix) :] if "bbox" in r else None
            assert r["image"] in jpegs.values() and (key is None or r["image"] == jpegs[key])
        if name == "caltech_birds2011":
            mask = _decode(splits["test"][0]["segmentation_mask"])
            assert mask.shape[:2] == _decode(splits["test"][0]["image"]).shape[:2]
    else:  # CIFAR: pixels and labels by the record's id
        arrays = fake_archives.cifar_arrays(name)
        for split, records in splits.items():
            data, fine, coarse = arrays[split]
            assert len(records) == len(data)
            for r, label in zip(records, getattr(ds, split).labels, strict=True):
                index = int(r["id"].decode().split("_")[1])
                expected = data[index].reshape(3, 32, 32).transpose(1, 2, 0)
                np.testing.assert_array_equal(_decode(r["image"]), expected)
                assert label == fine[index] == r["label"]
                if name == "cifar100":
                    assert r["coarse_label"] == coarse[index]
        assert ds.class_names[:2] == ("class0", "class1")


def test_imagenet_r_split_file_gives_an_image_folder_the_same_split(tmp_path, offline):
    (path,) = prepare("imagenet_r", tmp_path)
    tfds_data = tfds_sources.load_tfds("imagenet_r", str(tmp_path / "data"))
    with tarfile.open(path) as tar:
        tar.extractall(tmp_path / "folder", filter="data")
    split_file = tmp_path / "data" / "imagenet_r" / "0.2.0" / tfds_build.SPLIT_FILE
    root = str(tmp_path / "folder" / "imagenet-r")
    ours = folder.load_folder(root, "imagenet_r", split_file=str(split_file))
    # TFDS numbers ImageNet's wnids in sorted order, as the folder loader sorts class dirs.
    wnids = tfds.builder("imagenet_r").info.features["label"].names
    assert wnids == sorted(wnids) and ours.class_names == tfds_data.class_names
    for split in ("train", "test"):
        a, b = getattr(ours, split), getattr(tfds_data, split)
        np.testing.assert_array_equal(a.labels, b.labels)
        for i in range(len(a)):
            np.testing.assert_array_equal(a.image(i), b.image(i))
    # The config route: data.source=folder + data.split_file.
    again = datasets.load_dataset(
        "folder", name="imagenet_r", data_dir=root, split_file=str(split_file)
    )
    np.testing.assert_array_equal(again.test.labels, tfds_data.test.labels)


def _run_main(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        prepare_main.main(args)
    err = capsys.readouterr().err.strip().splitlines()
    return exit_info.value.code, err


@pytest.mark.parametrize("damage", ["flipped", "truncated", "renamed"])
def test_a_wrong_archive_is_one_line_and_nothing_is_written(tmp_path, offline, capsys, damage):
    src = tmp_path / "src"
    src.mkdir()
    (path,) = fake_archives.make_imagenet_r(str(src))
    sums = fake_archives.checksums_tsv([path], tmp_path / "sums.tsv")
    good = open(path, "rb").read()
    if damage == "flipped":
        bad = bytearray(good)
        bad[len(bad) // 2] ^= 0xFF
        open(path, "wb").write(bytes(bad))
    elif damage == "truncated":
        open(path, "wb").write(good[: len(good) // 2])
    else:  # another dataset's archive under this name
        (other,) = fake_archives.make_food101(str(src))
        os.replace(other, path)
    data_dir = tmp_path / "data"
    code, err = _run_main(
        ["imagenet_r", f"--source={path}", f"--data_dir={data_dir}", f"--checksums={sums}"],
        capsys,
    )
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    size, digest = len(good), fake_archives.checksums_tsv([path], tmp_path / "now.tsv")
    assert path in err[0] and f"expected {size} bytes" in err[0]
    assert open(digest).read().split()[2] in err[0]  # the actual sha256
    assert "imagenet-r.tar from" in err[0]  # where to get the right one
    assert not (data_dir / "imagenet_r").exists()
    with pytest.raises(tfds_sources.DatasetNotPreparedError):
        tfds_sources.load_tfds("imagenet_r", str(data_dir))


def test_official_digests_are_tfds_own_and_a_missing_file_is_named_with_its_url(
    tmp_path, offline, capsys
):
    (official,) = archives.official_archives("imagenet_r")
    assert (official.filename, official.size) == ("imagenet-r.tar", 2191079936)
    assert official.sha256.startswith("18c6bf493b39") and "berkeley.edu" in official.url
    names = {a.filename for a in archives.official_archives("cifar10")}
    assert names == {"cifar-10-binary.tar.gz", "cifar-10-python.tar.gz"}
    paths = fake_archives.make_cub(str(tmp_path))
    code, err = _run_main(
        ["caltech_birds2011", f"--source={paths[0]}", f"--data_dir={tmp_path / 'd'}"], capsys
    )
    assert code == 2 and len(err) == 1
    assert "segmentations.tgz" in err[0] and "https://data.caltech.edu/" in err[0]
    # The fake archive against the official digest: refused, the expected values named.
    code, err = _run_main(
        ["caltech_birds2011", *(f"--source={p}" for p in paths), f"--data_dir={tmp_path}/d"],
        capsys,
    )
    assert code == 2 and len(err) == 1 and "expected 1150585339 bytes" in err[0], err
    assert not (tmp_path / "d" / "caltech_birds2011").exists()
    code, err = _run_main(["imagenet", "--source=x", f"--data_dir={tmp_path}"], capsys)
    assert code == 2 and len(err) == 1 and "invalid choice: 'imagenet'" in err[0]


def test_a_prepared_dataset_is_kept_unless_forced(tmp_path, offline, capsys):
    prepare("cifar10", tmp_path)
    shard = next((tmp_path / "data" / "cifar10" / "3.0.2").glob("*train.array_record*"))
    before, content = shard.stat().st_mtime_ns, shard.read_bytes()
    prepare("cifar10", tmp_path)
    assert "already prepared" in capsys.readouterr().out
    assert shard.stat().st_mtime_ns == before
    prepare("cifar10", tmp_path, "--force")
    assert shard.stat().st_mtime_ns != before and shard.read_bytes() == content
    assert visible(tmp_path / "data") == ["cifar10"]


def test_a_second_preparation_of_the_same_dataset_is_refused(tmp_path, offline, capsys):
    import fcntl

    (tmp_path / "data").mkdir()
    with open(tmp_path / "data" / ".cifar10.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(SystemExit):
            prepare("cifar10", tmp_path)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "another preparation of cifar10" in err[0]
    assert visible(tmp_path / "data") == []
    prepare("cifar10", tmp_path)  # the lock released: it goes through


def test_a_disk_that_fills_while_shards_are_written_is_one_line_naming_the_space(
    tmp_path, offline, capsys, monkeypatch
):
    """ENOSPC from the writer (simulated: the builder writes part of a shard, then the disk is
    full): one line with the space needed and free, and no staging dir left behind."""
    import errno

    def full(self, *args, **kwargs):
        os.makedirs(self.data_dir, exist_ok=True)
        (tmp_path / "data" / ".cifar10.preparing" / "part").write_bytes(b"x" * 1000)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", full)
    with pytest.raises(SystemExit):
        prepare("cifar10", tmp_path)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"the disk under {tmp_path / 'data'} filled while cifar10 was written" in err[0]
    assert "GiB free there (twice its archives)" in err[0] and " GiB are; free space" in err[0]
    assert visible(tmp_path / "data") == []


def test_a_killed_preparations_staging_dir_is_removed_with_one_line(tmp_path, offline, capsys):
    import fcntl

    data = tmp_path / "data"
    for name in ("cifar100", "food101"):
        (data / f".{name}.preparing" / "x").mkdir(parents=True)
        (data / f".{name}.preparing" / "x" / "shard").write_bytes(b"x" * 2**20)
    with open(data / ".food101.lock", "w") as held:  # food101 is being prepared right now
        fcntl.flock(held, fcntl.LOCK_EX)
        prepare("cifar10", tmp_path)
    out = capsys.readouterr().out
    assert f"removed {data / '.cifar100.preparing'} (1 MiB), left by a preparation of " in out
    assert "food101" not in out
    assert visible(data) == [".food101.preparing", "cifar10"]
