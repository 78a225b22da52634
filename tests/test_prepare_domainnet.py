"""`python -m aepg_jax.prepare domainnet` from a tiny fake release (tests/fake_archives.py),
offline and without TensorFlow, and `load_tfds('domainnet')` of what it writes: six domains
in one `Dataset`, records in TFDS's key-hash order holding the zips' bytes; one-line refusals
that leave nothing a run reads."""

import os
import zipfile

import fake_archives
import numpy as np
import pytest
import tensorflow_datasets as tfds
import test_prepare
from tensorflow_datasets.core import hashing
from test_prepare import _run_main, visible

from aepg_jax.data import datasets, source, tfds_sources
from aepg_jax.prepare import __main__ as prepare_main
from aepg_jax.prepare import domainnet

DOMAINS = fake_archives.DOMAINNET_DOMAINS
offline = test_prepare.offline  # no network, no TensorFlow: every test here
pytestmark = pytest.mark.usefixtures("offline")


def _make(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    fake_archives.make_domainnet(src)
    return src


def _args(tmp_path, src, checksums=True):
    args = ["domainnet", f"--source={src}", f"--data_dir={tmp_path / 'data'}"]
    if checksums:
        args.append(f"--checksums={fake_archives.domainnet_checksums(src, tmp_path / 'sums.tsv')}")
    return args


def _listed(src, domain, split):
    """`(key, member, label)` of each line of a list, as TFDS's generator keys it."""
    lines = (src / f"{domain}_{split}.txt").read_text().split("\n")
    return [(f"{domain}_{split}_{i:08d}", *line.split(" ")) for i, line in enumerate(lines) if line]


def test_domainnet_is_prepared_offline_into_one_six_domain_dataset(tmp_path):
    src = _make(tmp_path)
    assert prepare_main.main(_args(tmp_path, src)) == 0
    data_dir = tmp_path / "data"
    assert visible(data_dir) == ["domainnet"]  # the staging dir is gone
    assert sorted(os.listdir(data_dir / "domainnet")) == sorted(DOMAINS)

    ds = datasets.load_dataset("tfds", name="domainnet", data_dir=str(data_dir))
    assert ds.domain_names == DOMAINS == domainnet.DOMAINS
    names = tfds.builder("domainnet/real").info.features["label"].names
    assert ds.class_names == tuple(names) == domainnet.CLASS_NAMES and len(names) == 345
    for name in fake_archives.DOMAINNET_CLASSES:  # the lists' labels name their folders
        assert f" {names.index(name)}\n" in (src / "clipart_train.txt").read_text()
    for split in ("train", "test"):
        split_source = getattr(ds, split)
        listed = {d: _listed(src, d, split) for d in DOMAINS}
        counts = [len(listed[d]) for d in DOMAINS]
        assert len(split_source) == sum(counts)
        np.testing.assert_array_equal(
            source.domains_of(split_source), np.repeat(np.arange(6), counts)
        )
        # Each domain's records: the list's lines ordered by TFDS's hash of their keys (the
        # order `tfds build` writes), holding the zip member's bytes and the line's label.
        hasher = hashing.Hasher(split)
        position = 0
        for d, domain in enumerate(DOMAINS):
            expected = sorted(listed[domain], key=lambda line: hasher.hash_key(line[0]))
            part = split_source.parts[d]
            with zipfile.ZipFile(src / f"{domain}.zip") as zf:
                for k, (_, member, label) in enumerate(expected):
                    record = part.data_source[k]
                    assert record["image"] == zf.read(member)
                    assert int(record["label"]) == int(label)
                    assert ds.class_names[int(label)] == member.split("/")[1]
            labels = split_source.labels[position : position + len(expected)]
            np.testing.assert_array_equal(labels, [int(line[2]) for line in expected])
            position += len(expected)
        image = split_source.image(len(split_source) - 1)  # sketch's last: a JPEG, RGB
        assert image.dtype == np.uint8 and image.shape == (12, 14, 3)
        first_quickdraw = sum(counts[:3])
        gray = split_source.image(first_quickdraw)  # a grayscale PNG, replicated
        assert gray.shape == (12, 14, 3) and (gray[..., 0] == gray[..., 2]).all()

    # A second run keeps every domain; a run without --checksums says none is published.
    code = prepare_main.main(_args(tmp_path, src, checksums=False))
    assert code == 0 and visible(data_dir) == ["domainnet"]


def test_a_killed_run_resumes_at_the_first_domain_not_in_place(tmp_path, capsys):
    src = _make(tmp_path)
    assert prepare_main.main(_args(tmp_path, src)) == 0
    data = tmp_path / "data" / "domainnet"
    shard = next((data / "clipart" / "1.0.0").glob("*train.array_record*"))
    before = shard.stat().st_mtime_ns
    os.rename(data / "real", tmp_path / "real_before")  # as if killed while writing real
    (tmp_path / "data" / ".domainnet.preparing" / "x").mkdir(parents=True)
    capsys.readouterr()
    assert prepare_main.main(_args(tmp_path, src)) == 0
    out = capsys.readouterr().out
    assert "removed " in out and "domainnet/clipart is already prepared" in out
    assert "domainnet/real: 6 train, 3 test images written" in out
    assert shard.stat().st_mtime_ns == before  # kept, not rewritten
    for f in os.listdir(tmp_path / "real_before" / "1.0.0"):  # the same bytes again
        if "array_record" in f:
            again = (data / "real" / "1.0.0" / f).read_bytes()
            assert again == (tmp_path / "real_before" / "1.0.0" / f).read_bytes()
    assert visible(tmp_path / "data") == ["domainnet"]


def _damage_missing_file(src):
    os.remove(src / "sketch_test.txt")
    return "lacks sketch_test.txt", "domainnet/txt/sketch_test.txt"


def _damage_list_line(src):
    with open(src / "painting_train.txt", "a") as f:
        f.write("painting/cat/painting_1.jpg\n")  # no label
    lines = (src / "painting_train.txt").read_text().splitlines()
    return f"painting_train.txt: line {len(lines)} ('painting/cat/painting_1.jpg')", "<label"


def _damage_binary_list(src):
    (src / "clipart_test.txt").write_bytes(b"\xff\xfe\x00garbage")
    return "clipart_test.txt: not a text list", "download clipart_test.txt again"


def _damage_wrong_label(src):
    path = src / "real_test.txt"
    path.write_text(path.read_text().replace(" 308\n", " 309\n", 1))
    return "real_test.txt: line ", f"which is {domainnet.CLASS_NAMES[309]}, not The_Eiffel_Tower"


def _damage_member(src):
    with open(src / "infograph_test.txt", "a") as f:
        f.write("infograph/t-shirt/infograph_327_999999.jpg 327\n")
    return "infograph.zip: lacks infograph/t-shirt/infograph_327_999999.jpg", "line 4 of"


def _damage_digest(src):
    data = bytearray((src / "quickdraw.zip").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (src / "quickdraw.zip").write_bytes(bytes(data))
    return "quickdraw.zip: ", "expected "


@pytest.mark.parametrize(
    "damage",
    [
        _damage_missing_file,
        _damage_list_line,
        _damage_binary_list,
        _damage_wrong_label,
        _damage_member,
        _damage_digest,
    ],
)
def test_a_wrong_release_is_one_line_and_nothing_is_written(tmp_path, capsys, damage):
    src = _make(tmp_path)
    args = ["domainnet", f"--source={src}", f"--data_dir={tmp_path / 'data'}"]
    if damage is _damage_digest:  # the digests of the files as they were
        args.append(f"--checksums={fake_archives.domainnet_checksums(src, tmp_path / 's.tsv')}")
    named, said = damage(src)
    code, err = _run_main(args, capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert named in err[0] and said in err[0], err
    assert visible(tmp_path / "data") == []
    with pytest.raises(tfds_sources.DatasetNotPreparedError):
        tfds_sources.load_tfds("domainnet", str(tmp_path / "data"))


def test_checksums_must_cover_all_eighteen_files_and_one_source_dir(tmp_path, capsys):
    src = _make(tmp_path)
    sums = tmp_path / "sums.tsv"
    fake_archives.domainnet_checksums(src, sums)
    lines = sums.read_text().splitlines()
    sums.write_text("\n".join(lines[:-1]) + "\n")
    args = ["domainnet", f"--source={src}", f"--data_dir={tmp_path / 'data'}"]
    code, err = _run_main([*args, f"--checksums={sums}"], capsys)
    assert code == 2 and len(err) == 1 and "has no line for sketch_test.txt" in err[0], err
    code, err = _run_main([*args, f"--source={src}"], capsys)
    assert code == 2 and len(err) == 1 and "domainnet takes one --source" in err[0], err
    zip_path = src / "clipart.zip"
    code, err = _run_main(["domainnet", f"--source={zip_path}", f"--data_dir={tmp_path}"], capsys)
    assert code == 2 and len(err) == 1 and "directory holding its six zips" in err[0], err


def test_a_partly_prepared_domainnet_names_what_prepares_it(tmp_path):
    src = _make(tmp_path)
    assert prepare_main.main(_args(tmp_path, src)) == 0
    import shutil

    shutil.rmtree(tmp_path / "data" / "domainnet" / "quickdraw")
    with pytest.raises(tfds_sources.DatasetNotPreparedError) as info:
        tfds_sources.load_tfds("domainnet", str(tmp_path / "data"))
    message = str(info.value)
    assert "\n" not in message and "domainnet/quickdraw/1.0.0" in message
    assert f"python -m aepg_jax.prepare domainnet --source=DIR --data_dir={tmp_path}" in message
    assert "tfds build domainnet --file_format=array_record" in message
