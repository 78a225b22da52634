"""`python -m aepg_jax.prepare {imagenet_a,objectnet,omnibenchmark,vtab}`: PILOT's image folders
(`ROOT/{train,test}/<class>/*`) checked and copied byte for byte, read back by
`data.source=folder` with `ImageFolder`'s class ids and example order; one-line refusals that
leave nothing a run would read."""

import os
import pathlib
import shutil
import types

import fake_archives
import numpy as np
import pytest

from aepg_jax.data import datasets, splits
from aepg_jax.prepare import __main__ as prepare_main
from aepg_jax.prepare import folder_build

PILOT = tuple(fake_archives.PILOT_FOLDERS)
# torchvision's IMG_EXTENSIONS: the files `ImageFolder` lists.
TORCHVISION_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def image_folder_samples(root):
    """`ImageFolder(root).samples` as torchvision builds them (`find_classes`: sorted class
    folders; `make_dataset`: per class, `sorted(os.walk)` and sorted file names)."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    samples = []
    for index, c in enumerate(classes):
        for folder, _, names in sorted(os.walk(os.path.join(root, c), followlinks=True)):
            for f in sorted(names):
                if f.lower().endswith(TORCHVISION_EXTENSIONS):
                    samples.append((os.path.join(folder, f), index))
    return classes, samples


def run(name, source, data_dir, capsys):
    """`prepare_main.main`: (exit status, stdout, stderr lines)."""
    try:
        code = prepare_main.main([name, f"--source={source}", f"--data_dir={data_dir}"])
    except SystemExit as exit_info:
        code = exit_info.code
    out, err = capsys.readouterr()
    return code, out, err.strip().splitlines()


@pytest.mark.parametrize("name", PILOT)
def test_pilot_folder_is_copied_and_read_as_image_folder_reads_it(tmp_path, capsys, name):
    (src,) = fake_archives.make_pilot(str(tmp_path / "src"), name)
    wrapper, classes = fake_archives.PILOT_FOLDERS[name]
    code, out, err = run(name, src, tmp_path / "data", capsys)
    assert code == 0, err
    prepared = tmp_path / "data" / name
    assert f"run with --config.data.data_dir={prepared}" in out
    published = folder_build.FOLDERS[name].images
    assert f"holds {2 * classes:,} train, {classes:,} test images" in out
    assert f"published set holds {published['train']:,} train, {published['test']:,} test" in out
    assert "left out 1 file(s) that are not images" in out  # the stray Thumbs.db
    assert sorted(os.listdir(tmp_path / "data")) == [f".{name}.lock", name]  # no staging dir
    assert sorted(os.listdir(prepared)) == ["test", "train"]

    ds = datasets.load_dataset("folder", name=name, data_dir=str(prepared))
    assert len(ds.class_names) == classes and (len(ds.train), len(ds.test)) == (
        2 * classes,
        classes,
    )
    for split in ("train", "test"):
        source = getattr(ds, split)
        class_names, samples = image_folder_samples(os.path.join(src, wrapper, split))
        assert ds.class_names == tuple(class_names)
        assert ds.class_names != tuple(sorted(class_names, key=int))  # "10" before "2"
        np.testing.assert_array_equal(source.labels, [label for _, label in samples])
        for path, (original, _) in zip(source.paths, samples, strict=True):
            assert os.path.relpath(path, prepared / split) == os.path.relpath(
                original, os.path.join(src, wrapper, split)
            )
            assert open(path, "rb").read() == open(original, "rb").read()  # byte for byte
    assert source.image(0).shape == (8, 10, 3)


def test_imagenet_a_with_pilots_class_order_gives_its_ten_tasks(tmp_path, capsys):
    (src,) = fake_archives.make_pilot(str(tmp_path / "src"), "imagenet_a")
    assert run("imagenet_a", src, tmp_path / "data", capsys)[0] == 0
    ds = datasets.load_dataset(
        "folder", name="imagenet_a", data_dir=str(tmp_path / "data/imagenet_a")
    )
    tasks = splits.make_class_incremental(
        ds.train.labels,
        ds.test.labels,
        len(ds.class_names),
        10,
        class_order_seed=1993,
        class_order_rng="numpy_legacy",
    )
    assert tasks.head_sizes == (20,) * 10
    order = np.random.RandomState(1993).permutation(200)
    assert tasks.tasks[0].original_classes.tolist() == order[:20].tolist()
    assert order[:3].tolist() == [168, 136, 51]  # PILOT's logged order
    first = {ds.class_names[c] for c in order[:20]}
    assert {
        os.path.basename(os.path.dirname(ds.train.paths[i])) for i in tasks.tasks[0].train_indices
    } == first


def _vtab(tmp_path):
    (src,) = fake_archives.make_pilot(str(tmp_path / "src"), "vtab")
    return src, os.path.join(src, "vtab-cil", "vtab")


def _refused(tmp_path, capsys, src, *needles):
    code, _, err = run("vtab", src, tmp_path / "data", capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    for needle in needles:
        assert needle in err[0], err[0]
    assert sorted(os.listdir(tmp_path / "data")) == [".vtab.lock"]  # nothing a run reads


def test_missing_split_folder_is_one_line(tmp_path, capsys):
    src, root = _vtab(tmp_path)
    shutil.rmtree(os.path.join(root, "test"))
    _refused(tmp_path, capsys, src, "has no test/ folder", "{train,test}/<class>")


def test_train_and_test_with_different_classes_is_one_line(tmp_path, capsys):
    src, root = _vtab(tmp_path)
    os.rename(os.path.join(root, "test", "7"), os.path.join(root, "test", "seven"))
    _refused(
        tmp_path, capsys, src, "different classes", "only in train/: 7", "only in test/: seven"
    )


def test_wrong_class_count_is_one_line(tmp_path, capsys):
    src, root = _vtab(tmp_path)
    for split in ("train", "test"):
        shutil.rmtree(os.path.join(root, split, "7"))
    _refused(tmp_path, capsys, src, "49 class directories", "vtab has 50")


def test_unreadable_image_is_one_line(tmp_path, capsys):
    src, root = _vtab(tmp_path)
    bad = os.path.join(root, "test", "3", "img_0.jpg")
    with open(bad, "wb") as f:
        f.write(b"\xff\xd8 truncated")
    _refused(tmp_path, capsys, src, bad, "not a readable image")


def test_a_class_folder_with_sub_folders_is_one_line(tmp_path, capsys):
    src, root = _vtab(tmp_path)
    os.makedirs(os.path.join(root, "train", "3", "more"))
    _refused(tmp_path, capsys, src, "holds the folder more")


def test_real_counts_give_no_note(tmp_path, capsys, monkeypatch):
    """A folder with the published counts (classes scaled down) prints no count note."""
    monkeypatch.setitem(
        folder_build.FOLDERS,
        "vtab",
        folder_build.FolderSet(("train", "test"), 3, {"train": 7, "test": 4}),
    )
    root = tmp_path / "src"
    fake_archives.write_pilot_folder(root, ["a", "b", "c"], {"train": [3, 2, 2], "test": [2, 1, 1]})
    code, out, err = run("vtab", root, tmp_path / "data", capsys)
    assert code == 0, err
    assert "note:" not in out


def test_too_little_disk_is_one_line_before_copying(tmp_path, capsys, monkeypatch):
    src, _ = _vtab(tmp_path)
    need = sum(f.stat().st_size for f in pathlib.Path(src).rglob("*.jpg"))
    monkeypatch.setattr(
        folder_build.shutil, "disk_usage", lambda path: types.SimpleNamespace(free=need - 1)
    )
    _refused(tmp_path, capsys, src, f"vtab needs {need / 2**20:.1f} MiB free under", "MiB are")


def test_synthetic_pilot_folders_have_the_real_counts(monkeypatch):
    """benchmarks/make_synthetic_archives.py spreads each split's real count over the classes."""
    monkeypatch.syspath_prepend(str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
    import make_synthetic_archives

    for name in PILOT:
        _, per_split, _, _ = make_synthetic_archives.LAYOUTS[name]
        spec = folder_build.FOLDERS[name]
        counts = [make_synthetic_archives.spread(n, spec.classes) for n in per_split]
        assert [sum(c) for c in counts] == [spec.images["train"], spec.images["test"]]
        assert all(max(c) - min(c) <= 1 for c in counts)


def test_a_runs_data_from_a_prepared_pilot_folder_in_pilots_order(tmp_path, capsys):
    """`setup.prepare_data` of a config with data.source=folder and PILOT's class order."""
    import tiny

    from aepg_jax.continual import setup

    (src,) = fake_archives.make_pilot(str(tmp_path / "src"), "vtab")
    assert run("vtab", src, tmp_path / "data", capsys)[0] == 0
    cfg = tiny.tiny_config(
        tmp_path / "cache",
        **{
            "data.source": "folder",
            "data.name": "vtab",
            "data.data_dir": str(tmp_path / "data" / "vtab"),
            "data.num_tasks": 5,
            "data.class_order_seed": 1993,
            "data.class_order_rng": "numpy_legacy",
        },
    )
    data = setup.prepare_data(cfg)
    order = np.random.RandomState(1993).permutation(50)
    np.testing.assert_array_equal(data.tasks.class_order, order)
    assert data.tasks.head_sizes == (10,) * 5
    assert (len(data.train.labels), len(data.test.labels)) == (100, 50)
    relabelled = np.argsort(order)[data.test.labels]  # class c -> its position in the order
    np.testing.assert_array_equal(data.tasks.test_labels, relabelled)
