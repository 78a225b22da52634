"""The official archives of each dataset, their sizes and sha256 digests, and reading them.

Expected values come from TFDS's own checksum files in the installed `tensorflow_datasets`
(`datasets/imagenet_r/checksums.tsv`, `url_checksums/{food101,caltech_birds2011,cifar10,
cifar100}.txt`), so a file TFDS would accept is accepted here. CIFAR's python tarballs, which
TFDS does not use, are checked against the values Keras pins in `keras.datasets.cifar10/100`
(`file_hash`; sizes as published). CLRS25 has no official archive digest: none is checked.

`verify` hashes a file once (progress bar with ETA) and raises `ArchiveError`, whose message
is one line: the file, its size and sha256, the expected ones, and where to download it.
`iter_members` streams a tar archive (no extraction to disk) with a progress bar over the
compressed bytes, yielding the members TFDS's extractor would (`_normpath` rules: no hidden
files, no absolute or `~` paths, no links).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import tarfile
import zlib
from collections.abc import Callable, Iterator

import tqdm
from tensorflow_datasets.core import utils as tfds_utils
from tensorflow_datasets.core.download import checksums as tfds_checksums

from aepg_jax.system import progress


class ArchiveError(ValueError):
    """An archive that is missing, wrong, truncated or unreadable (message: one line)."""


@dataclasses.dataclass(frozen=True)
class Archive:
    """One official archive: file name, size in bytes, sha256 and download URL."""

    filename: str
    size: int | None
    sha256: str | None
    url: str
    checked_by: str  # where the expected values come from

    def where(self) -> str:
        return f"{self.filename} from {self.url}"


_TFDS_CHECKSUM_FILES = {
    "imagenet_r": "datasets/imagenet_r/checksums.tsv",
    "food101": "url_checksums/food101.txt",
    "caltech_birds2011": "url_checksums/caltech_birds2011.txt",
    "cifar10": "url_checksums/cifar10.txt",
    "cifar100": "url_checksums/cifar100.txt",
}
# Keras pins these (keras/datasets/cifar10.py, cifar100.py); TFDS reads the binary tarballs.
_KERAS_CIFAR = {
    "cifar10": Archive(
        "cifar-10-python.tar.gz",
        170_498_071,
        "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce",
        "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        "Keras (keras.datasets.cifar10)",
    ),
    "cifar100": Archive(
        "cifar-100-python.tar.gz",
        169_001_437,
        "85cd44d02ba6437773c5bbd22e183051d648de2e7d6b014e1ef29b855ba677a7",
        "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
        "Keras (keras.datasets.cifar100)",
    ),
}


def official_archives(name: str) -> tuple[Archive, ...]:
    """Every archive `name` can be prepared from (one per distinct file name)."""
    if name not in _TFDS_CHECKSUM_FILES:
        return ()
    path = tfds_utils.tfds_path() / _TFDS_CHECKSUM_FILES[name]
    found: dict[str, Archive] = {}
    for url, info in tfds_checksums.load_url_infos(path).items():
        if info.filename not in found or "drive.google" in found[info.filename].url:
            found[info.filename] = Archive(
                info.filename, int(info.size), info.checksum, url, f"TFDS ({path.name})"
            )
    if name in _KERAS_CIFAR:
        found[_KERAS_CIFAR[name].filename] = _KERAS_CIFAR[name]
    return tuple(found.values())


def load_checksums_file(path: str, name: str) -> tuple[Archive, ...]:
    """Expected archives from a TSV `filename<TAB>size<TAB>sha256` (replaces the official
    ones: for archives you repacked or mirrors with other digests; the tests use it)."""
    archives = []
    with open(path) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                filename, size, digest = line.split()[:3]
                url = next(
                    (a.url for a in official_archives(name) if a.filename == filename), "(yours)"
                )
                archives.append(Archive(filename, int(size), digest, url, f"--checksums={path}"))
    return tuple(archives)


class _Counting(io.RawIOBase):
    """A read-only file whose reads advance a progress bar."""

    def __init__(self, f, bar: tqdm.tqdm):
        self.f, self.bar = f, bar

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self.f.readinto(buffer)
        self.bar.update(n or 0)
        return n or 0


def _bar(path: str, desc: str) -> tqdm.tqdm:
    return progress.new(
        total=os.path.getsize(path),
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        dynamic_ncols=True,
        leave=False,
        disable=None,  # no bar when stderr is not a terminal (logs, tests)
    )


def digest(path: str, desc: str | None = None) -> tuple[int, str]:
    """`(size, sha256)` of a file, read once with a progress bar."""
    h = hashlib.sha256()
    with open(path, "rb") as f, _bar(path, desc or f"sha256 {os.path.basename(path)}") as bar:
        while chunk := f.read(1 << 22):
            h.update(chunk)
            bar.update(len(chunk))
    return os.path.getsize(path), h.hexdigest()


def verify(path: str, expected: Archive) -> None:
    """Raises `ArchiveError` (one line) unless `path` has the expected size and sha256."""
    if expected.sha256 is None:
        return
    size, sha = digest(path)
    if (size, sha) != (expected.size, expected.sha256):
        raise ArchiveError(
            f"{path}: {size} bytes, sha256 {sha}; expected {expected.size} bytes, sha256 "
            f"{expected.sha256} ({expected.checked_by}): wrong, truncated or corrupt file; "
            f"download {expected.where()} again."
        )


def match(path: str, candidates: tuple[Archive, ...]) -> Archive:
    """The expected archive `path` should be: by file name, else by size, else the first."""
    base = os.path.basename(path)
    by_name = [a for a in candidates if a.filename == base]
    if by_name:
        return by_name[0]
    size = os.path.getsize(path)
    by_size = [a for a in candidates if a.size == size]
    return (by_size or list(candidates))[0]


def _normpath(path: str) -> str | None:
    """TFDS extractor's rule (`download/extractor.py`): which archive members it keeps."""
    path = os.path.normpath(path)
    if (
        path.startswith(".")
        or os.path.isabs(path)
        or path.endswith("~")
        or os.path.basename(path).startswith(".")
    ):
        return None
    return path


def iter_members(path: str, want: Callable[[str], bool], desc: str) -> Iterator[tuple[str, bytes]]:
    """Streams `path` (tar, tar.gz, tgz; nothing extracted to disk): `(name, bytes)` of each
    regular file TFDS would extract (normalized name) for which `want(name)` holds."""
    try:
        with open(path, "rb") as raw, _bar(path, desc) as bar:
            stream = io.BufferedReader(_Counting(raw, bar), 1 << 20)
            with tarfile.open(fileobj=stream, mode="r|*") as tar:
                for member in tar:
                    name = _normpath(member.name) if member.isfile() else None
                    if name is not None and want(name):
                        yield name, tar.extractfile(member).read()
    except (tarfile.TarError, zlib.error, EOFError, OSError) as err:
        raise ArchiveError(
            f"{path}: cannot be read as a tar archive ({type(err).__name__}: {err}); it is "
            "truncated or corrupt: download it again."
        ) from err
