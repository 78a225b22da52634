"""TFDS datasets read without TensorFlow (docs/algorithm.md §8).

Supported datasets (`TFDS_DATASETS`) and the TFDS splits that become our train / test:

| name                | train        | test         | classes                                  |
|---------------------|--------------|--------------|------------------------------------------|
| `imagenet_r`        | `test[:80%]` | `test[80%:]` | 200 (the ids used, of 1000, -> 0..199)   |
| `food101`           | `train`      | `validation` | 101                                      |
| `caltech_birds2011` | `train`      | `test`       | 200                                      |
| `cifar10`           | `train`      | `test`       | 10                                       |
| `cifar100`          | `train`      | `test`       | 100 (the fine `label`)                   |
| `fashion_mnist`     | `train`      | `test`       | 10 (grayscale, replicated to 3 channels) |
| `domainnet`         | `train`      | `test`       | 345, in six domains (below)              |

ImageNet-R only has a `test` split (30,000 images). Our 80/20 cut is L2P's and uses TFDS's own
percent-slicing arithmetic (`tfds.core.ReadInstruction`, rounding to the closest example) on the
whole split, opened once: train and test are disjoint and together cover it. Its labels live in the
1000-class ImageNet label space: the ids occurring anywhere in the `test` split (200 of them) are
mapped to 0..K-1 in increasing order of the original id, one mapping shared by train and test, and
`class_names` are the TFDS label feature's names of those ids (WordNet ids such as `n01443537`).
Every other dataset keeps its TFDS label ids and names.

DomainNet is one TFDS builder with a config per domain (`domainnet/clipart`, ...). Its `Dataset`
is the six configs' splits one after another in the fixed order clipart, infograph, painting,
quickdraw, real, sketch (`domain_names`): train 409,832 (33,525 + 36,023 + 50,416 + 120,750 +
120,906 + 48,212) and test 176,743 examples, each split's `domains` the domain id of every
example (from the config it comes from: no record is read for it), labels TFDS's 0..344 and
`class_names` TFDS's 345 names, numbered as the release's lists number them.

No TensorFlow: data is read with `tfds.data_source(..., download=False)`, which needs a dataset
prepared in a random-access file format (`array_record`, recommended, or `parquet`). Each TFDS
split is opened once with image decoding skipped (`tfds.decode.SkipDecoding`), so a record
parses (protobuf, NumPy) to `{'label': int, 'image': encoded bytes, ...}`: `.labels` is one pass
over the records that decodes no image (made once, when `load_tfds` builds the `Dataset`, and
cached on the source), and `.image(i)` decodes one image with Pillow. Preparing the files is a
one-time step: `python -m aepg_jax.prepare NAME --source=ARCHIVE --data_dir=DIR` from the
downloaded archive, offline and without TensorFlow, or `tfds build` (`prepare_command`), which
imports TensorFlow; a dataset that is missing or prepared in another format raises
`DatasetNotPreparedError` carrying both commands.

`tfds.testing.mock_data` also works: its fake source cannot skip image decoding without TensorFlow
(it re-encodes its random images with TensorFlow), so the split is then re-opened with TFDS's
NumPy decoding and `.image(i)` takes the decoded array as is (TFDS prints a "Failed to import
TensorFlow" banner when that happens). The mock ignores split slicing (every split has
`num_examples` examples), another reason to cut slices here rather than in TFDS.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import logging
import os
import types
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow_datasets as tfds
from PIL import Image

from aepg_jax.data.source import Dataset, Source, SubsetSource, to_rgb

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TfdsSpec:
    """How one TFDS dataset becomes a `Dataset`.

    Attributes:
        tfds_name: the TFDS builder name (also our dataset name).
        train_split: TFDS split string read as our train split (`'train'`, `'test[:80%]'`).
        test_split: TFDS split string read as our test split.
        num_classes: classes of the real prepared data after any relabelling (a mismatch, e.g.
            on mocked or partially built data, is logged).
        relabel_used: map the label ids occurring in the TFDS splits read to 0..K-1 (sorted).
        image_features: image features whose decoding is skipped; the first is the image.
        label_feature: the `ClassLabel` feature used as label.
        domains: TFDS builder configs, each one domain, whose splits are concatenated in this
            order (empty: the dataset has no configs and one domain).
    """

    tfds_name: str
    train_split: str
    test_split: str
    num_classes: int
    relabel_used: bool = False
    image_features: tuple[str, ...] = ("image",)
    label_feature: str = "label"
    domains: tuple[str, ...] = ()


TFDS_DATASETS: Mapping[str, TfdsSpec] = types.MappingProxyType(
    {
        spec.tfds_name: spec
        for spec in (
            TfdsSpec("imagenet_r", "test[:80%]", "test[80%:]", 200, relabel_used=True),
            TfdsSpec("food101", "train", "validation", 101),
            # `segmentation_mask` is a second image feature: it is not decoded either.
            TfdsSpec(
                "caltech_birds2011",
                "train",
                "test",
                200,
                image_features=("image", "segmentation_mask"),
            ),
            TfdsSpec("cifar10", "train", "test", 10),
            TfdsSpec("cifar100", "train", "test", 100),
            TfdsSpec("fashion_mnist", "train", "test", 10),
            TfdsSpec(
                "domainnet",
                "train",
                "test",
                345,
                domains=("clipart", "infograph", "painting", "quickdraw", "real", "sketch"),
            ),
        )
    }
)


class DatasetNotPreparedError(FileNotFoundError):
    """A TFDS dataset is absent from the data dir, or prepared in a non-random-access format.

    A `FileNotFoundError`: the array_record (or parquet) files that reading without TensorFlow
    needs are not there. The message holds the `tfds build` command that prepares them.
    """


def prepare_command(name: str, data_dir: str | os.PathLike[str] | None = None) -> str:
    """The shell command that prepares `name` for `load_tfds` (run once, where TF is installed)."""
    target = os.fspath(data_dir) if data_dir is not None else "<data_dir>"
    return f"tfds build {name} --file_format=array_record --data_dir={target}"


class TfdsSource:
    """One whole TFDS split behind a `tfds.data_source`; implements `Source`.

    `labels` are the TFDS label ids, read in one pass over the records (each is parsed, no image
    is decoded) on first use and cached on the object. Records are read one at a time: TFDS's
    batched `__getitems__` was no faster on a 2-core machine, and the mock's is broken (its
    `__getitems__` is not bound to the source in TFDS 4.9.10).
    """

    def __init__(
        self,
        data_source: Sequence[Any],
        *,
        image_key: str = "image",
        label_key: str = "label",
    ):
        self.data_source = data_source
        self.image_key = image_key
        self.label_key = label_key

    def __len__(self) -> int:
        return len(self.data_source)

    @functools.cached_property
    def labels(self) -> np.ndarray:
        """int64 (N,) TFDS label ids in index order."""
        source, key = self.data_source, self.label_key
        return np.fromiter((int(source[i][key]) for i in range(len(source))), np.int64, len(source))

    def image(self, index: int) -> np.ndarray:
        """Image `index`: uint8 (H, W, 3), decoded with Pillow, grayscale replicated."""
        return _decode_image(self.data_source[int(index)][self.image_key])

    def __repr__(self) -> str:
        return f"TfdsSource({self.data_source!r}, n={len(self)})"


@dataclasses.dataclass(frozen=True)
class RelabeledSource:
    """`base` with every label `y` replaced by `label_map[y]` (an int64 lookup table)."""

    base: Source
    label_map: np.ndarray
    labels: np.ndarray = dataclasses.field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "label_map", np.asarray(self.label_map, np.int64))
        object.__setattr__(self, "labels", self.label_map[np.asarray(self.base.labels)])

    def __len__(self) -> int:
        return len(self.base)

    def image(self, index: int) -> np.ndarray:
        return self.base.image(index)


@dataclasses.dataclass(frozen=True)
class DomainsSource:
    """The examples of `parts[0]`, then of `parts[1]`, ...; every example of `parts[d]` is of
    domain d. Example `i` is example `i - offsets[d]` of `parts[d]`, `offsets` the cumulative
    lengths."""

    parts: tuple[Source, ...]

    @functools.cached_property
    def offsets(self) -> np.ndarray:
        return np.cumsum([0, *(len(p) for p in self.parts)])

    @functools.cached_property
    def labels(self) -> np.ndarray:
        """int64 (N,): the parts' labels one after another."""
        return np.concatenate([np.asarray(p.labels, np.int64) for p in self.parts])

    @functools.cached_property
    def domains(self) -> np.ndarray:
        """int64 (N,): d for each example of `parts[d]` (no record is read)."""
        return np.repeat(np.arange(len(self.parts), dtype=np.int64), np.diff(self.offsets))

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def image(self, index: int) -> np.ndarray:
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} examples")
        d = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return self.parts[d].image(index - int(self.offsets[d]))


def load_tfds(name: str, data_dir: str | os.PathLike[str] | None = None) -> Dataset:
    """The `Dataset` of a supported TFDS dataset, read without TensorFlow; never downloads.

    Args:
        name: a key of `TFDS_DATASETS`.
        data_dir: the TFDS data directory; `None` is TFDS's default (`$TFDS_DATA_DIR` as set
            when TFDS was imported, else `~/tensorflow_datasets`).

    Returns:
        `Dataset(name, train, test, class_names, domain_names)` with the splits and labels of
        the module docstring (`domain_names` empty but for DomainNet). The labels of every
        split are read here, once (`Dataset` checks their range).

    Raises:
        ValueError: `name` is not supported (the message lists the supported names).
        DatasetNotPreparedError: the dataset is not prepared in `data_dir` in array_record (or
            parquet) format; the message gives the `tfds build` command.
    """
    if name not in TFDS_DATASETS:
        raise ValueError(
            f"Unknown TFDS dataset {name!r}; supported: {', '.join(sorted(TFDS_DATASETS))}."
        )
    spec = TFDS_DATASETS[name]
    splits = (spec.train_split, spec.test_split)
    bases = list(dict.fromkeys(tfds.core.ReadInstruction.from_spec(s).split_name for s in splits))
    if spec.domains:
        per_domain = [_open(spec, bases, data_dir, config=d) for d in spec.domains]
        opened = per_domain[0]
        whole: dict[str, Source] = {
            base: DomainsSource(tuple(sources[k] for sources in per_domain))
            for k, base in enumerate(bases)
        }
    else:
        opened = _open(spec, bases, data_dir)
        whole = dict(zip(bases, opened, strict=True))
    label_feature = opened[0].data_source.dataset_info.features[spec.label_feature]
    class_names = tuple(label_feature.names)

    if spec.relabel_used:
        used = np.unique(np.concatenate([source.labels for source in whole.values()]))
        label_map = np.full(len(class_names), -1, np.int64)
        label_map[used] = np.arange(len(used))
        whole = {base: RelabeledSource(source, label_map) for base, source in whole.items()}
        class_names = tuple(class_names[i] for i in used)
    if len(class_names) != spec.num_classes:
        logger.warning(
            "%s has %d classes here but %d when fully prepared (mocked or partial data?).",
            name,
            len(class_names),
            spec.num_classes,
        )

    sizes = {base: len(source) for base, source in whole.items()}

    def read(split: str) -> Source:
        base, start, stop = _split_bounds(split, sizes)
        if (start, stop) == (0, sizes[base]):
            return whole[base]
        return SubsetSource(whole[base], range(start, stop))

    return Dataset(name, read(spec.train_split), read(spec.test_split), class_names, spec.domains)


def _split_bounds(split: str, sizes: Mapping[str, int]) -> tuple[str, int, int]:
    """`'test[:80%]'` -> `('test', start, stop)` by TFDS's slicing rules on `sizes['test']`."""
    instruction = tfds.core.ReadInstruction.from_spec(split)
    if not isinstance(instruction, tfds.core.ReadInstruction):
        raise ValueError(f"Only single-split specs are supported; got {split!r}.")
    base, size = instruction.split_name, sizes[instruction.split_name]
    info = tfds.core.SplitInfo(name=base, shard_lengths=[size], num_bytes=0, filename_template=None)
    (absolute,) = instruction.to_absolute({base: info})
    start, stop, _ = slice(absolute.from_, absolute.to).indices(size)
    return base, start, stop


@contextlib.contextmanager
def _absl_quiet():
    """absl's (TFDS's) log below ERROR is dropped while inside."""
    from absl import logging as absl_logging

    before = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.ERROR)
    try:
        yield
    finally:
        absl_logging.set_verbosity(before)


def _open(
    spec: TfdsSpec,
    splits: list[str],
    data_dir: str | os.PathLike[str] | None,
    config: str | None = None,
) -> list[TfdsSource]:
    """`TfdsSource`s of the whole TFDS `splits` (of builder config `config`, if given), image
    decoding skipped where that works."""
    skip = {key: tfds.decode.SkipDecoding() for key in spec.image_features}
    builder = spec.tfds_name if config is None else f"{spec.tfds_name}/{config}"

    def open_with(decoders):
        return tfds.data_source(
            builder, split=splits, data_dir=data_dir, download=False, decoders=decoders
        )

    try:
        with _absl_quiet():  # TFDS's warnings on a missing dataset_info.json: said below
            sources = open_with(skip)
    except Exception as err:
        with _absl_quiet():
            _raise_if_not_prepared(spec.tfds_name, data_dir, err, config)
        raise
    try:
        for source in sources:
            if len(source):
                source[0]  # The mock's fake records need TensorFlow to skip image decoding.
    except ImportError as err:
        if "tensorflow" not in str(err):
            raise
        logger.info("%s: falling back to NumPy image decoding (%s).", spec.tfds_name, err)
        sources = open_with(None)
    return [
        TfdsSource(
            source,
            image_key=spec.image_features[0],
            label_key=spec.label_feature,
        )
        for source in sources
    ]


def _decode_image(value: Any) -> np.ndarray:
    """Encoded image bytes, or an image TFDS already decoded -> uint8 (H, W, 3)."""
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "OSV":
        value = value.item()
    if isinstance(value, bytes | bytearray | memoryview):
        with Image.open(io.BytesIO(value)) as img:
            value = np.asarray(img if img.mode == "L" else img.convert("RGB"))
    return to_rgb(np.asarray(value))


def prepare_source(name: str) -> str:
    """What `python -m aepg_jax.prepare name` takes as `--source`, for the messages."""
    return "DIR" if name in TFDS_DATASETS and TFDS_DATASETS[name].domains else "ARCHIVE"


def _raise_if_not_prepared(
    name: str,
    data_dir: str | os.PathLike[str] | None,
    error: Exception,
    config: str | None = None,
) -> None:
    """Raises `DatasetNotPreparedError` if `error` comes from a missing or wrongly prepared set
    (of builder config `config`, if given)."""
    source = prepare_source(name)
    try:
        builder = tfds.builder(name if config is None else f"{name}/{config}", data_dir=data_dir)
    except Exception:  # Not a preparation problem we can name: the caller re-raises `error`.
        return
    root = os.fspath(data_dir) if data_dir is not None else os.fspath(builder.data_dir_root)
    looked = (
        f"data.data_dir={root}"
        if data_dir is not None
        else f"{root}, TFDS's default: data.data_dir is not set"
    )
    if not builder.is_prepared():
        raise DatasetNotPreparedError(
            f"TFDS dataset {name!r} is not prepared in {builder.data_dir} ({looked}): prepare "
            f"it with `python -m aepg_jax.prepare {name} --source={source} --data_dir={root}` "
            "(the archives: docs/data.md, 'What you prepare'; where TensorFlow is installed, "
            f"`{prepare_command(name, root)}` also does) or pass "
            "--config.data.data_dir=<the directory it is prepared in>."
        ) from error
    formats = builder.info.available_file_formats()
    if formats & set(tfds.core.FileFormat.with_random_access()):
        return
    found = ", ".join(sorted(f.value for f in formats)) or "no known file format"
    raise DatasetNotPreparedError(
        f"TFDS dataset {name!r} is prepared in {builder.data_dir} ({looked}) as {found}, but "
        f"reading it without TensorFlow needs array_record: delete {builder.data_dir} and "
        f"prepare it again with `python -m aepg_jax.prepare {name} --source={source} "
        f"--data_dir={root}` or `{prepare_command(name, root)}` (or into another data_dir)."
    ) from error
