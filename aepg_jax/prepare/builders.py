"""TFDS's own builders, fed from the local archives instead of TFDS's download manager.

Each class subclasses the registered TFDS builder (same name, version, features, label names
and `DatasetInfo`) and replaces only `_split_generators`: the archive is streamed with
`archives.iter_members` instead of being downloaded and extracted, and every example gets the
key and feature values that TFDS's `_generate_examples` gives it. TFDS's own writer then
does the rest (beam-free): it orders the records of each split by a hash of their keys, so the
records come out in the order `tfds build` writes, and stores them as `array_record`.

Why not TFDS's code path itself: driven from a local archive (`DownloadConfig(manual_dir=...)`
with the file named as in TFDS's `checksums.tsv`), TFDS 4.9.10 verifies the checksum and then
fails without TensorFlow in its extractor (`tf.io.gfile`, `tf.compat.as_text`); the ImageNet-R,
CIFAR and CUB generators call `tf.io.gfile` too, CIFAR's images and CUB's masks are numpy
arrays that TFDS encodes with `tf.image.encode_png`, and CUB's masks are decoded with OpenCV.
Here PNGs are encoded and decoded with Pillow: CIFAR images and CUB masks hold the same pixels
as TFDS's but not the same PNG bytes; JPEG images are stored byte for byte as in the archive.
Records are serialized with sorted feature keys (tfds_build.py), so the shard files are not
byte-identical to `tfds build`'s (whose key order varies from run to run) but parse to the same
examples; `dataset_info.json` names this module instead of TFDS's.

Per dataset (archive member layout, TFDS key, features):
* imagenet_r, `imagenet-r.tar`: `imagenet-r/<wnid>/<file>` -> key `<wnid>_<file>`,
  `{image, label: wnid, file_name: <wnid>/<file>}`; one split, `test`.
* food101, `food-101.tar.gz`: `food-101/meta/{train,test}.json` ({class: [class/id]}) and
  `food-101/images/<class>/<id>.jpg` -> key `<class>/<id>`; splits train, validation (test.json).
* caltech_birds2011, `CUB_200_2011.tgz` (`CUB_200_2011/{images,train_test_split,
  bounding_boxes}.txt`, `CUB_200_2011/images/<nnn>.<Name>/<file>.jpg`) and `segmentations.tgz`
  (`segmentations/<nnn>.<Name>/<file>.png`) -> key = the member path; label nnn - 1.
* cifar10 / cifar100: the binary tarballs TFDS reads (`cifar-10-batches-bin/*.bin`,
  `cifar-100-binary/{train,test}.bin`) or the python ones (`cifar-10-batches-py/
  {data_batch_1..5,test_batch,batches.meta}`, `cifar-100-python/{train,test,meta}`), which hold
  the same images in the same order -> key = running index, `id` `train_00000`...
"""

from __future__ import annotations

import collections
import io
import json
import pickle
import re
import sys
from collections.abc import Iterator, Mapping
from typing import ClassVar

import numpy as np
import tensorflow_datasets as tfds
from PIL import Image

from aepg_jax.prepare import archives

Example = tuple[object, dict]


class _FromArchives:
    """Mixin: the builder reads `archives` ({official file name: local path}), not the web."""

    url_infos: ClassVar[Mapping] = {}  # checksums: `archives.verify` did them

    def __init__(self, *, archive_paths: Mapping[str, str], **kwargs):
        self.archive_paths = dict(archive_paths)
        super().__init__(**kwargs)

    def _stream(self, filename: str, want, what: str) -> Iterator[tuple[str, bytes]]:
        path = self.archive_paths[filename]
        yield from archives.iter_members(path, want, f"{self.name}: {what}")
        if what.endswith(" split"):  # now the shuffle writes its shards (shuffler.py: its own bar)
            print(f"{self.name}: {what} read from {filename}; writing its shards", file=sys.stderr)

    def _read(self, filename: str, names: set[str]) -> dict[str, bytes]:
        """Members `names` of `filename`, each required (one line naming the missing ones)."""
        found = {}
        for name, data in self._stream(filename, names.__contains__, "reading metadata"):
            found[name] = data
            if len(found) == len(names):
                break
        missing = sorted(names - found.keys())
        if missing:
            raise archives.ArchiveError(
                f"{self.archive_paths[filename]}: lacks {', '.join(missing)}; is it "
                f"{filename}? {_where(self.name, filename)}"
            )
        return found


def _where(name: str, filename: str) -> str:
    for archive in archives.official_archives(name):
        if archive.filename == filename:
            return f"Download it from {archive.url}."
    return ""


def _png(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="png")
    return buffer.getvalue()


class ImagenetR(_FromArchives, tfds.builder_cls("imagenet_r"), skip_registration=True):
    name = "imagenet_r"
    ARCHIVE = "imagenet-r.tar"
    _MEMBER = re.compile(r"imagenet-r/([^/]+)/([^/]+)")

    def _split_generators(self, dl_manager):
        return {"test": self._examples()}

    def _examples(self) -> Iterator[Example]:
        for name, data in self._stream(self.ARCHIVE, self._MEMBER.fullmatch, "test split"):
            synset, filename = self._MEMBER.fullmatch(name).groups()
            yield (
                f"{synset}_{filename}",
                {"image": data, "label": synset, "file_name": f"{synset}/{filename}"},
            )


class Food101(_FromArchives, tfds.builder_cls("food101"), skip_registration=True):
    name = "food101"
    ARCHIVE = "food-101.tar.gz"
    _META: ClassVar = {"train": "food-101/meta/train.json", "validation": "food-101/meta/test.json"}
    _IMAGES = "food-101/images/"

    def _split_generators(self, dl_manager):
        meta = self._read(self.ARCHIVE, set(self._META.values()))
        return {
            split: self._examples(split, json.loads(meta[path]))
            for split, path in self._META.items()
        }

    def _examples(self, split: str, listing: dict[str, list[str]]) -> Iterator[Example]:
        label_of = {image: label for label, images in listing.items() for image in images}
        prefix = self._IMAGES

        def want(name: str) -> bool:
            return (
                name.startswith(prefix)
                and name.endswith(".jpg")
                and name[len(prefix) : -4] in label_of
            )

        seen = 0
        for name, data in self._stream(self.ARCHIVE, want, f"{split} split"):
            image_name = name[len(prefix) : -4]
            seen += 1
            features = {"image": data, "label": label_of[image_name]}
            if self.version > "2.0.0":
                features["id"] = image_name
            yield image_name, features
        _check_all_found(self.archive_paths[self.ARCHIVE], seen, len(label_of), split)


def _check_all_found(path: str, seen: int, listed: int, split: str) -> None:
    if seen != listed:
        raise archives.ArchiveError(
            f"{path}: holds {seen} of the {listed} images its metadata lists for the {split} "
            "split; the archive is incomplete: download it again."
        )


class CaltechBirds2011(
    _FromArchives, tfds.builder_cls("caltech_birds2011"), skip_registration=True
):
    name = "caltech_birds2011"
    ARCHIVE = "CUB_200_2011.tgz"
    SEGMENTATIONS = "segmentations.tgz"
    _NAME_RE = re.compile(r"((\w*)/)*(\d*).(\w*)/(\w*.jpg)$")  # TFDS caltech_birds._NAME_RE
    _TEXT = ("images.txt", "train_test_split.txt", "bounding_boxes.txt")

    def _split_generators(self, dl_manager):
        text = self._read(self.ARCHIVE, {f"CUB_200_2011/{t}" for t in self._TEXT})
        images, split, boxes = (text[f"CUB_200_2011/{t}"].decode().splitlines() for t in self._TEXT)
        lists: dict[str, set[str]] = {"train": set(), "test": set()}
        attributes = collections.defaultdict(list)
        for line, line1, line2 in zip(split, images, boxes, strict=False):  # TFDS's zip
            img_idx, val = line.split()
            idx, img_name = line1.split()
            stem = self._NAME_RE.match(img_name).groups()[-1].split(".")[0]
            attributes[stem].append(line2.split()[1:])
            if img_idx == idx:
                lists["train" if int(val) == 1 else "test"].add(img_name)
        masks = self._stream(self.SEGMENTATIONS, lambda n: n.endswith(".png"), "masks")
        for name, data in masks:
            attributes[name.split("/")[-1].split(".")[0]].append(data)  # encoded: decoded later
        return {s: self._examples(s, lists[s], attributes) for s in ("train", "test")}

    def _examples(self, split: str, names: set[str], attributes) -> Iterator[Example]:
        def want(fname: str) -> bool:
            return bool(self._NAME_RE.match(fname)) and "/".join(fname.split("/")[-2:]) in names

        seen = 0
        for fname, data in self._stream(self.ARCHIVE, want, f"{split} split"):
            matches = self._NAME_RE.match(fname).groups()
            stem = matches[-1].split(".")[0]
            box, mask_png = attributes[stem][:2]
            # TFDS decodes with cv2.imdecode(flags=0): 8-bit grayscale.
            with Image.open(io.BytesIO(mask_png)) as img:
                mask = np.asarray(img if img.mode == "L" else img.convert("L"))
            height, width = mask.shape
            bbox = self._get_bounding_box_values(box, width, height)
            seen += 1
            yield (
                fname,
                {
                    "image": data,
                    "image/filename": fname,
                    "label": int(matches[-3]) - 1,
                    "label_name": matches[-2].lower(),
                    "bbox": tfds.features.BBox(*(min(v, 1.0) for v in bbox)),
                    "segmentation_mask": _png(mask),  # (H, W): one channel
                },
            )
        _check_all_found(self.archive_paths[self.ARCHIVE], seen, len(names), split)


class _ArraysOnly(pickle.Unpickler):
    """Unpickles CIFAR's python batches (dicts of lists and numpy arrays) and nothing else."""

    _ALLOWED: ClassVar = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),  # bytes pickled by Python 3 at protocol 2
    }

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} has no place in a CIFAR batch")


def _unpickle(data: bytes) -> dict:
    return _ArraysOnly(io.BytesIO(data), encoding="bytes").load()


class Cifar10(_FromArchives, tfds.builder_cls("cifar10"), skip_registration=True):
    name = "cifar10"
    # format -> (prefix, train files, test files, label files); label keys in record order
    LAYOUTS: ClassVar = {
        "cifar-10-binary.tar.gz": (
            "cifar-10-batches-bin/",
            [f"data_batch_{i}.bin" for i in range(1, 6)],
            ["test_batch.bin"],
            ["batches.meta.txt"],
        ),
        "cifar-10-python.tar.gz": (
            "cifar-10-batches-py/",
            [f"data_batch_{i}" for i in range(1, 6)],
            ["test_batch"],
            ["batches.meta"],
        ),
    }
    LABEL_KEYS = ("label",)
    PY_LABELS: ClassVar = {"label": (b"labels", b"label_names")}

    def _split_generators(self, dl_manager):
        (filename,) = self.archive_paths
        prefix, train, test, label_files = self.LAYOUTS[filename]
        members = self._read(filename, {prefix + f for f in [*train, *test, *label_files]})
        binary = filename.endswith("binary.tar.gz")
        if binary:
            for key, label_file in zip(self.LABEL_KEYS, label_files, strict=True):
                text = members[prefix + label_file].decode()
                self.info.features[key].names = [n for n in text.split("\n") if n]
        else:
            meta = _unpickle(members[prefix + label_files[0]])
            for key in self.LABEL_KEYS:
                names = meta[self.PY_LABELS[key][1]]
                self.info.features[key].names = [n.decode() for n in names]
        read = self._binary_records if binary else self._python_records
        return {
            "train": self._examples("train_", read([members[prefix + f] for f in train])),
            "test": self._examples("test_", read([members[prefix + f] for f in test])),
        }

    def _binary_records(self, blobs: list[bytes]) -> Iterator[tuple[tuple[int, ...], np.ndarray]]:
        n = len(self.LABEL_KEYS)
        for blob in blobs:  # TFDS cifar._load_data: labels bytes then 3x32x32 CHW pixels
            rows = np.frombuffer(blob, np.uint8).reshape(-1, n + 3072)
            for row in rows:
                yield tuple(int(v) for v in row[:n]), row[n:].reshape(3, 32, 32).transpose(1, 2, 0)

    def _python_records(self, blobs: list[bytes]) -> Iterator[tuple[tuple[int, ...], np.ndarray]]:
        for blob in blobs:
            batch = _unpickle(blob)
            images = np.asarray(batch[b"data"], np.uint8).reshape(-1, 3, 32, 32)
            labels = [batch[self.PY_LABELS[k][0]] for k in self.LABEL_KEYS]
            for i, image in enumerate(images):
                yield tuple(int(column[i]) for column in labels), image.transpose(1, 2, 0)

    def _examples(self, split_prefix: str, records) -> Iterator[Example]:
        for index, (labels, image) in enumerate(records):
            record = dict(zip(self.LABEL_KEYS, labels, strict=True))
            record["id"] = f"{split_prefix}{index:05d}"
            record["image"] = _png(np.ascontiguousarray(image))
            yield index, record


class Cifar100(Cifar10, tfds.builder_cls("cifar100"), skip_registration=True):
    name = "cifar100"
    LAYOUTS: ClassVar = {
        "cifar-100-binary.tar.gz": (
            "cifar-100-binary/",
            ["train.bin"],
            ["test.bin"],
            ["coarse_label_names.txt", "fine_label_names.txt"],
        ),
        "cifar-100-python.tar.gz": ("cifar-100-python/", ["train"], ["test"], ["meta"]),
    }
    LABEL_KEYS = ("coarse_label", "label")
    PY_LABELS: ClassVar = {
        "coarse_label": (b"coarse_labels", b"coarse_label_names"),
        "label": (b"fine_labels", b"fine_label_names"),
    }


BUILDERS = {b.name: b for b in (ImagenetR, Food101, CaltechBirds2011, Cifar10, Cifar100)}
# The archives each builder needs (one of the CIFAR formats; both of CUB's files).
REQUIRED = {
    "imagenet_r": (("imagenet-r.tar",),),
    "food101": (("food-101.tar.gz",),),
    "caltech_birds2011": (("CUB_200_2011.tgz",), ("segmentations.tgz",)),
    "cifar10": (tuple(Cifar10.LAYOUTS),),
    "cifar100": (tuple(Cifar100.LAYOUTS),),
}
