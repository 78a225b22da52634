"""Prepares a TFDS dataset from its archives: verify, build in a hidden staging dir, rename.

    prepare(name, sources, data_dir)

1. Each archive in `sources` is matched to an official one (`archives.official_archives`, or
   a `--checksums` file) and its size and sha256 are checked before any other work.
2. `builders.BUILDERS[name]` writes the dataset with TFDS's writer into
   `<data_dir>/.<name>.preparing/` (a killed run's is removed, with one line, by the next
   preparation of any dataset in that directory), its shuffle done
   by `shuffler.SpillingShuffler` (TFDS's order; bounded memory, spills to local files; TFDS's
   own spills through TensorFlow above 1 GB).
3. Extras (ImageNet-R's split file) are written into the staged version directory, then that
   directory is renamed to `<data_dir>/<name>/<version>/`, where `tfds.data_source` reads it.

The rename is the only step a reader can see: a killed preparation leaves only the hidden
staging dir, and the next run starts over from the archives (the records, serialized with
sorted feature keys, are a deterministic function of the archive: it writes the same bytes).
An existing prepared version is kept unless `force=True`.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
from collections.abc import Sequence

import tensorflow_datasets as tfds
from tensorflow_datasets.core import example_serializer

from aepg_jax.data import tfds_sources
from aepg_jax.prepare import archives, builders, shuffler

SPLIT_FILE = "l2p_split.json"


def staging_dir(data_dir: str, name: str) -> str:
    return os.path.join(data_dir, f".{name}.preparing")


def match_sources(
    name: str, sources: Sequence[str], expected: tuple[archives.Archive, ...]
) -> dict[str, tuple[str, archives.Archive]]:
    """`{official file name: (local path, expected archive)}` for what `name` needs."""
    wanted = builders.REQUIRED[name]
    found: dict[str, tuple[str, archives.Archive]] = {}
    for path in sources:
        if not os.path.isfile(path):
            raise archives.ArchiveError(f"--source={path}: no such file.")
        archive = archives.match(path, expected)
        found[archive.filename] = (path, archive)
    for alternatives in wanted:
        given = [a for a in alternatives if a in found]
        if len(given) > 1:
            raise archives.ArchiveError(
                f"{name} is prepared from one of {', '.join(given)}, not both: pass one --source."
            )
        if not given:
            urls = [a.where() for a in expected if a.filename in alternatives]
            raise archives.ArchiveError(
                f"{name} needs {' or '.join(alternatives)}; pass it with --source=PATH "
                f"(download {' or '.join(urls) or alternatives[0]})."
            )
    return found


def prepare(
    name: str,
    sources: Sequence[str],
    data_dir: str,
    *,
    checksums: str | None = None,
    force: bool = False,
) -> str:
    """Verifies the archives, builds `name`, moves it in place; returns its directory."""
    expected = (
        archives.load_checksums_file(checksums, name)
        if checksums
        else archives.official_archives(name)
    )
    found = match_sources(name, sources, expected)
    cls = builders.BUILDERS[name]
    final_root = os.path.join(data_dir, name)
    final = os.path.join(final_root, str(cls.VERSION))
    if os.path.exists(os.path.join(final, "dataset_info.json")) and not force:
        print(f"{name} is already prepared in {final} (--force rebuilds it).")
        return final
    for filename, (path, archive) in found.items():
        print(f"checking {path} against {filename}'s size and sha256 ({archive.checked_by})")
        archives.verify(path, archive)

    staging = staging_dir(data_dir, name)
    shutil.rmtree(staging, ignore_errors=True)  # a killed run's leftovers: start over
    builder = cls(
        archive_paths={f: p for f, (p, _) in found.items()},
        data_dir=staging,
        file_format="array_record",
    )
    try:
        staged = build(builder)
        if name == "imagenet_r":
            write_split_file(staged, os.path.join(staged, SPLIT_FILE))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise

    os.makedirs(final_root, exist_ok=True)
    if os.path.exists(final):  # force: move the old version aside, never half-delete it
        old = os.path.join(staging, "old")
        os.rename(final, old)
    os.rename(staged, final)
    shutil.rmtree(staging, ignore_errors=True)
    return final


def build(builder: tfds.core.DatasetBuilder) -> str:
    """Runs `builder` (one of ours, reading local files) into its `data_dir` with TFDS's
    writer, our shuffle and sorted feature keys, quietly; returns its version directory."""
    tfds.disable_progress_bar()  # ours (over the archive bytes) shows progress and ETA
    absl_level = logging.getLogger("absl").level
    logging.getLogger("absl").setLevel(logging.WARNING)
    try:
        with (
            contextlib.redirect_stdout(io.StringIO()),
            _deterministic_records(),
            shuffler.installed(),
        ):
            builder.download_and_prepare(
                download_dir=os.path.join(os.fspath(builder.data_dir_root), "downloads")
            )
    finally:
        logging.getLogger("absl").setLevel(absl_level)
    return os.fspath(builder.data_path)


@contextlib.contextmanager
def _deterministic_records():
    """TFDS serializes each record as a `tf.train.Example`, whose feature map protobuf writes
    in hash order, which changes from one process to the next: the same examples, other bytes.
    Sorted map keys (`deterministic=True`) make a re-run write the same bytes."""
    serializer = example_serializer.ExampleSerializer
    original = serializer.serialize_example

    def serialize_example(self, example):
        return self.get_tf_example(example).SerializeToString(deterministic=True)

    serializer.serialize_example = serialize_example
    try:
        yield
    finally:
        serializer.serialize_example = original


def write_split_file(version_dir: str, path: str) -> None:
    """ImageNet-R: the `file_name`s of our train (`test[:80%]`) and test (`test[80%:]`)
    examples, in record order, as JSON; `data.split_file` of an image folder reads it."""
    source = tfds.builder_from_directory(version_dir).as_data_source(
        split="test", decoders={"image": tfds.decode.SkipDecoding()}
    )
    names = [_text(source[i]["file_name"]) for i in range(len(source))]
    spec = tfds_sources.TFDS_DATASETS["imagenet_r"]
    listing = {
        "dataset": "imagenet_r",
        "note": f"train = {spec.train_split}, test = "
        f"{spec.test_split} of TFDS imagenet_r, in record order (L2P's split)",
    }
    for ours, split in (("train", spec.train_split), ("test", spec.test_split)):
        _, start, stop = tfds_sources._split_bounds(split, {"test": len(names)})
        listing[ours] = names[start:stop]
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(listing, f, indent=0)
    os.replace(tmp, path)


def _text(value) -> str:
    value = value.item() if hasattr(value, "item") else value
    return value.decode() if isinstance(value, bytes) else str(value)
