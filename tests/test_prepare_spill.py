"""`prepare`'s shuffle above the in-memory limit: the spill path, cheaply, without TensorFlow.

TFDS's own shuffler spills to disk through `tf.io.gfile` above 1 GB (and dies without
TensorFlow); ours (`prepare/shuffler.py`) spills to local run files above `MEM_LIMIT`. Here the
limit is lowered to a few KiB so a tiny archive takes the spill path; the records must come out
in the order of the in-memory path and of TFDS's own shuffler (both its paths: its spill path is
run with `tf.io.gfile` replaced by local files). The TFDS internals the swap relies on are
pinned, so a TFDS upgrade that changes them fails here rather than at a user's 5 GB archive.
"""

import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
import types
from pathlib import Path

import fake_archives
import numpy as np
import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.core import hashing, shuffle, writer

from aepg_jax.prepare import __main__ as prepare_main
from aepg_jax.prepare import domainnet, shuffler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_prepare
import make_synthetic_archives
from no_tensorflow import hidden_meta_path


@pytest.fixture
def no_tensorflow(monkeypatch):
    assert "tensorflow" not in sys.modules
    monkeypatch.setattr(sys, "meta_path", hidden_meta_path())
    assert importlib.util.find_spec("tensorflow") is None
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("tensorflow")


def _gfile_shim():
    """The corner of `tf` TFDS's bucket files use, on local files (for TFDS's spill path)."""
    gfile = types.SimpleNamespace(
        GFile=open, exists=os.path.exists, remove=os.remove, makedirs=os.makedirs
    )
    errors = types.SimpleNamespace(ResourceExhaustedError=type("Exhausted", (Exception,), {}))
    return types.SimpleNamespace(io=types.SimpleNamespace(gfile=gfile), errors=errors)


def _examples(n: int, seed: int = 0):
    """ImageNet-R-like keys (`<wnid>_<file>`) with records of varying sizes."""
    rng = np.random.default_rng(seed)
    return [
        (f"n{c:08d}_art_{i}.jpg", rng.bytes(int(rng.integers(50, 400))))
        for c in range(20)
        for i in range(n // 20)
    ]


def _shuffled(make, examples):
    s = make()
    for key, data in examples:
        s.add(key, data)
    return s, list(s)


def test_spilled_order_equals_in_memory_and_tfds_both_paths(tmp_path, monkeypatch):
    examples = _examples(400)
    salt = "test"
    ours, spilled = _shuffled(
        lambda: shuffler.SpillingShuffler(tmp_path / "a", salt, mem_limit=4096), examples
    )
    assert ours.num_runs > 10  # the merge really ran, over many runs
    assert not os.path.exists(ours._dir)  # runs deleted once the split is written
    _, in_memory = _shuffled(lambda: shuffler.SpillingShuffler(tmp_path / "b", salt), examples)
    tfds_mem, tfds_in_memory = _shuffled(lambda: shuffle.Shuffler(tmp_path / "c", salt), examples)
    monkeypatch.setattr(shuffle, "tf", _gfile_shim())
    monkeypatch.setattr(shuffle, "MAX_MEM_BUFFER_SIZE", 4096)
    tfds_spill, tfds_spilled = _shuffled(lambda: shuffle.Shuffler(tmp_path / "d", salt), examples)
    assert len(tfds_spill.bucket_lengths) == shuffle.BUCKETS_NUMBER  # TFDS did spill
    assert spilled == in_memory == tfds_in_memory == tfds_spilled
    assert len(spilled) == len(examples)
    assert [h for h, _ in spilled] == sorted(hashing.Hasher(salt).hash_key(k) for k, _ in examples)
    assert (ours.size, ours.num_examples) == (tfds_mem.size, tfds_mem.num_examples)


@pytest.mark.parametrize("mem_limit", [1000, 1 << 30])
def test_duplicates_as_tfds(tmp_path, mem_limit):
    examples = _examples(60)
    dup = [*examples, (examples[5][0], b"other bytes")]
    with pytest.raises(shuffle.DuplicatedKeysError):
        _shuffled(lambda: shuffler.SpillingShuffler(tmp_path, "s", mem_limit=mem_limit), dup)
    ours = _shuffled(
        lambda: shuffler.SpillingShuffler(
            tmp_path, "s", ignore_duplicates=True, mem_limit=mem_limit
        ),
        dup,
    )[1]
    theirs = _shuffled(lambda: shuffle.Shuffler(tmp_path, "s", ignore_duplicates=True), dup)[1]
    assert ours == theirs and len(ours) == len(examples)  # the first of a key is kept
    ordered = [(i, data) for i, (_, data) in enumerate(examples)]
    ours = _shuffled(
        lambda: shuffler.SpillingShuffler(
            tmp_path, "s", disable_shuffling=True, mem_limit=mem_limit
        ),
        ordered,
    )[1]
    assert [data for _, data in ours] == [data for _, data in examples]


def test_pinned_tfds_internals():
    """What `shuffler.installed` and `SpillingShuffler` rely on in TFDS (private API)."""
    # The writer looks the class up as `shuffle.Shuffler` when a split is written...
    assert "shuffle.Shuffler(" in inspect.getsource(writer.Writer.__init__)
    # ...with these arguments...
    params = list(inspect.signature(shuffle.Shuffler.__init__).parameters)
    assert params == ["self", "dirpath", "hash_salt", "disable_shuffling", "ignore_duplicates"]
    # ...and reads only these of it (besides iterating it).
    used = set(re.findall(r"self\._shuffler\.(\w+)", inspect.getsource(writer.Writer)))
    assert used == {"add", "num_examples", "size", "bucket_lengths"}
    # bucket_lengths only feeds the shards' file_instructions, not their sizes.
    specs = inspect.getsource(writer._get_shard_specs)
    assert "get_number_shards(total_size, num_examples)" in specs
    assert "get_shard_boundaries(num_examples, num_shards)" in specs
    # The order key: md5(salt, key) as a 128-bit int; DuplicatedKeysError(item1, item2).
    expected = int(hashlib.md5(b"train" + b"apple_pie/1005").hexdigest(), 16)
    assert hashing.Hasher("train").hash_key("apple_pie/1005") == expected
    assert list(inspect.signature(shuffle.DuplicatedKeysError.__init__).parameters) == [
        "self",
        "item1",
        "item2",
    ]
    # TFDS's own shuffler still spills via TensorFlow at this size (what ours replaces).
    assert shuffle.MAX_MEM_BUFFER_SIZE == 1000 << 20
    assert "tf.io.gfile" in inspect.getsource(shuffle._Bucket)


def test_installed_swaps_and_restores():
    original = shuffle.Shuffler
    with shuffler.installed(mem_limit=123):
        made = shuffle.Shuffler("/nonexistent", "train")
        assert isinstance(made, shuffler.SpillingShuffler) and made._mem_limit == 123
    assert shuffle.Shuffler is original


def _prepare(tmp_path, archive, data):
    sums = fake_archives.checksums_tsv([archive], tmp_path / "sums.tsv")
    args = ["imagenet_r", f"--source={archive}", f"--data_dir={data}", f"--checksums={sums}"]
    return prepare_main.main(args)


def _records(data):
    source = tfds.builder_from_directory(str(data / "imagenet_r" / "0.2.0")).as_data_source(
        split="test", decoders={"image": tfds.decode.SkipDecoding()}
    )
    return [(source[i]["file_name"], source[i]["image"]) for i in range(len(source))]


def test_prepare_spills_without_tensorflow_in_tfds_order(tmp_path, monkeypatch, no_tensorflow):
    src = tmp_path / "src"
    src.mkdir()
    (archive,) = fake_archives.make_imagenet_r(str(src), per_class=30)
    assert _prepare(tmp_path, archive, tmp_path / "memory") == 0
    spills = []
    real_spill = shuffler.SpillingShuffler._spill
    monkeypatch.setattr(shuffler, "MEM_LIMIT", 4096)
    monkeypatch.setattr(
        shuffler.SpillingShuffler, "_spill", lambda self: spills.append(1) or real_spill(self)
    )
    assert _prepare(tmp_path, archive, tmp_path / "spilled") == 0
    assert len(spills) > 3
    in_memory, spilled = _records(tmp_path / "memory"), _records(tmp_path / "spilled")
    assert spilled == in_memory and len(spilled) == 60
    split_file = os.path.join("imagenet_r", "0.2.0", "l2p_split.json")
    with open(tmp_path / "memory" / split_file) as a, open(tmp_path / "spilled" / split_file) as b:
        assert a.read() == b.read()
    leftovers = [f for _, dirs, files in os.walk(tmp_path / "spilled") for f in dirs + files]
    assert not [f for f in leftovers if f.startswith((".shuffle", "run_"))]
    assert not os.path.exists(tmp_path / "spilled" / ".imagenet_r.preparing")


def test_interrupted_while_spilling_leaves_nothing(tmp_path, monkeypatch, no_tensorflow):
    src = tmp_path / "src"
    src.mkdir()
    (archive,) = fake_archives.make_imagenet_r(str(src), per_class=30)
    real_spill = shuffler.SpillingShuffler._spill
    calls = []

    def spill_then_interrupt(self):
        real_spill(self)
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(shuffler, "MEM_LIMIT", 4096)
    monkeypatch.setattr(shuffler.SpillingShuffler, "_spill", spill_then_interrupt)
    data = tmp_path / "data"
    assert _prepare(tmp_path, archive, data) == 130
    assert [e for e in os.listdir(data) if not e.endswith(".lock")] == []


@pytest.mark.parametrize(
    ("name", "records"),
    [
        ("imagenet_r", {"test": 12}),
        ("food101", {"train": 6, "validation": 2}),
        ("caltech_birds2011", {"train": 4, "test": 4}),  # 4 per class, half of each is train
        ("cifar10", {"train": 50, "test": 10}),
        ("cifar100", {"train": 50, "test": 10}),
        ("clrs25", {"images": 100}),  # all 25 classes (prepare checks them), 4 each
        (  # each list: its real line count x 0.001, at least one per class
            "domainnet",
            {
                f"{domain}/{split}": max(2, round(n * 0.001))
                for domain, counts in domainnet.COUNTS.items()
                for split, n in zip(("train", "test"), counts, strict=True)
            },
        ),
        ("vtab", {"train": 50, "test": 50}),  # all 50 classes (prepare checks them), 1 each
    ],
)
def test_rehearsal_scripts_on_tiny_synthetic_archives(tmp_path, name, records):
    """make_synthetic_archives' layouts are what prepare reads; bench_prepare measures it
    in a child where TensorFlow cannot be imported."""
    classes = {"imagenet_r": 3, "clrs25": None, "vtab": None}.get(name, 2)
    make_synthetic_archives.make(name, str(tmp_path / "a"), scale=0.001, classes=classes)
    sources = [str(tmp_path / "a" / f) for f in bench_prepare.ARCHIVES[name]]
    result = bench_prepare.run_prepare(name, sources, str(tmp_path / "data"))
    assert result["exit"] == 0 and result["records"] == records
    assert 0 < result["peak_rss_gib"] < 2 and 0 < result["prepared_gib"] <= result["peak_disk_gib"]
