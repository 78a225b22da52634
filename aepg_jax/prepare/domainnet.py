"""DomainNet (cleaned release) from the 18 files users download: six TFDS configs, one per domain.

    prepare([source_dir], data_dir, checksums=None, force=False)

`source_dir` holds, as downloaded from http://ai.bu.edu/M3SDA/ (TFDS's URLs: `download_url`):
`<domain>.zip` (members `<domain>/<class>/<file>.jpg|png`) and `<domain>_{train,test}.txt`
(lines `<domain>/<class>/<file> <label>`) for each domain of `DOMAINS`. Label `k` is TFDS's
`domainnet` class name `k` (345 names ordered as the release numbers them: case and punctuation
ignored, so `cello` < `cell_phone` and `The_Eiffel_Tower` sits among the `t`s).

What is written is what `tfds build domainnet --file_format=array_record` writes:
`<data_dir>/domainnet/<domain>/1.0.0/`, TFDS's builder with config `<domain>` and its features
`{image, label}`, example `i` of `<domain>_<split>.txt` (line index, empty lines counted as TFDS
counts them) keyed `<domain>_<split>_<i:08d>`, so TFDS's writer puts the records in `tfds
build`'s order (`shuffler.py`); each image's bytes are the zip member's, not re-encoded.

Checks before anything is written: all 18 files present; with `checksums` (a TSV of
`filename size sha256` naming all 18) each file's size and sha256 (TFDS publishes no digest of
DomainNet's files, so without it none is checked); every list line well formed, its label in
0..344 and the class folder of its path that label's name; every listed image a member of its
zip. Each member's CRC-32 is checked as it is read (`zipfile`). Every error is one line naming
the file (and line). Each domain is staged in `<data_dir>/.domainnet.preparing/` and renamed
into place when complete; a domain already prepared is kept unless `force`, so a re-run after
a kill resumes at the first domain not in place.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import shutil
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from typing import ClassVar

import tensorflow_datasets as tfds

from aepg_jax.prepare import archives, tfds_build
from aepg_jax.system import progress

NAME = "domainnet"
DOMAINS = ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")
SPLITS = ("train", "test")
HOMEPAGE = "http://ai.bu.edu/M3SDA/"
# (train, test) lines of each list in the cleaned release.
COUNTS: Mapping[str, tuple[int, int]] = {
    "clipart": (33_525, 14_604),
    "infograph": (36_023, 15_582),
    "painting": (50_416, 21_850),
    "quickdraw": (120_750, 51_750),
    "real": (120_906, 52_041),
    "sketch": (48_212, 20_916),
}

_TFDS = tfds.builder_cls(NAME)
# The names of TFDS's `label` feature (its builder module's list), label k -> name k.
CLASS_NAMES: tuple[str, ...] = tuple(importlib.import_module(_TFDS.__module__)._CLASS_NAMES)


def zip_name(domain: str) -> str:
    return f"{domain}.zip"


def list_name(domain: str, split: str) -> str:
    return f"{domain}_{split}.txt"


def _files(domain: str) -> tuple[str, ...]:
    return (zip_name(domain), *(list_name(domain, s) for s in SPLITS))


FILES: tuple[str, ...] = tuple(f for d in DOMAINS for f in _files(d))


def download_url(filename: str) -> str:
    """Where TFDS's builder downloads `filename` (the zips of clipart and painting are the
    cleaned `groundtruth/` ones)."""
    base = _TFDS._BASE_URL
    for config in _TFDS.BUILDER_CONFIGS:
        if filename == zip_name(config.name):
            return f"{base}/{config.img_url}"
    return f"{base}/domainnet/txt/{filename}"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One list line: its index `i` (TFDS's key), the zip member and the label."""

    index: int
    member: str
    label: int


def read_list(path: str, domain: str) -> tuple[Entry, ...]:
    """The entries of a list file; a line TFDS would misread is one `ArchiveError` line."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
    except UnicodeDecodeError as err:
        raise archives.ArchiveError(
            f"{path}: not a text list ({err.reason} at byte {err.start}); download "
            f"{os.path.basename(path)} again from {download_url(os.path.basename(path))}."
        ) from err
    entries = []
    for i, line in enumerate(text.split("\n")):  # TFDS: `read().split('\n')`, blanks skipped
        if not line:
            continue
        parts = line.split(" ")
        label = _int(parts[1]) if len(parts) == 2 else None
        folders = parts[0].split("/")
        if (
            label is None
            or not 0 <= label < len(CLASS_NAMES)
            or len(folders) != 3
            or folders[0] != domain
            or not folders[2]
        ):
            raise archives.ArchiveError(
                f"{path}: line {i + 1} ({line.strip()[:80]!r}) is not `{domain}/<class>/<file> "
                f"<label 0..{len(CLASS_NAMES) - 1}>`; download {os.path.basename(path)} again "
                f"from {download_url(os.path.basename(path))}."
            )
        if folders[1] != CLASS_NAMES[label]:
            raise archives.ArchiveError(
                f"{path}: line {i + 1} labels {parts[0]} {label}, which is "
                f"{CLASS_NAMES[label]}, not {folders[1]}; download {os.path.basename(path)} "
                f"again from {download_url(os.path.basename(path))}."
            )
        entries.append(Entry(i, parts[0], label))
    if not entries:
        raise archives.ArchiveError(f"{path}: lists no image; download it again.")
    return tuple(entries)


def _int(text: str) -> int | None:
    try:
        return int(text)  # TFDS's `int()`: surrounding whitespace (a `\r`) is allowed
    except ValueError:
        return None


def _open_zip(path: str) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        raise archives.ArchiveError(
            f"{path}: cannot be read as a zip archive ({type(err).__name__}: {err}); it is "
            f"truncated or corrupt: download {download_url(os.path.basename(path))} again."
        ) from err


def check_members(zip_path: str, list_path: str, entries: tuple[Entry, ...]) -> None:
    """Every listed image is a member of the zip (one line naming the first that is not)."""
    with _open_zip(zip_path) as zf:
        members = set(zf.namelist())
    missing = [e for e in entries if e.member not in members]
    if missing:
        more = f" and {len(missing) - 1} more listed images" if len(missing) > 1 else ""
        raise archives.ArchiveError(
            f"{zip_path}: lacks {missing[0].member} (line {missing[0].index + 1} of "
            f"{list_path}){more}; the zip is incomplete or not from the same release as the "
            f"list: download {download_url(os.path.basename(zip_path))} again."
        )


class Domainnet(_TFDS, skip_registration=True):
    """TFDS's `domainnet` builder reading a local zip and lists instead of downloading."""

    name = NAME
    url_infos: ClassVar[Mapping] = {}

    def __init__(self, *, zip_path: str, lists: Mapping[str, tuple[Entry, ...]], **kwargs):
        self.zip_path = zip_path
        self.lists = dict(lists)
        super().__init__(**kwargs)

    def _split_generators(self, dl_manager):
        return {split: self._examples(split) for split in SPLITS}

    def _examples(self, split: str) -> Iterator[tuple[str, dict]]:
        domain = self.builder_config.name
        entries = self.lists[split]
        bar = progress.new(
            total=len(entries), desc=f"{NAME}/{domain}: {split} split", unit="img", disable=None
        )
        with _open_zip(self.zip_path) as zf, bar:
            for entry in entries:
                try:
                    image = zf.read(entry.member)
                except (zipfile.BadZipFile, OSError, EOFError) as err:
                    raise archives.ArchiveError(
                        f"{self.zip_path}: {entry.member} cannot be read ({err}); the zip is "
                        f"corrupt: download {download_url(zip_name(domain))} again."
                    ) from err
                bar.update()
                yield f"{domain}_{split}_{entry.index:08d}", {"image": image, "label": entry.label}


def _expected(checksums: str | None) -> dict[str, archives.Archive]:
    if checksums is None:
        return {}
    given = {a.filename: a for a in archives.load_checksums_file(checksums, NAME)}
    lacking = [f for f in FILES if f not in given]
    if lacking:
        raise archives.ArchiveError(
            f"--checksums={checksums}: has no line for {', '.join(lacking[:3])}"
            + (f" and {len(lacking) - 3} more" if len(lacking) > 3 else "")
            + f"; it needs `filename size sha256` for all {len(FILES)} files of {NAME}."
        )
    return {f: dataclasses.replace(given[f], url=download_url(f)) for f in FILES}


def version_dir(data_dir: str, domain: str) -> str:
    return os.path.join(data_dir, NAME, domain, str(_TFDS.VERSION))


def prepare(
    sources: Sequence[str], data_dir: str, *, checksums: str | None = None, force: bool = False
) -> str:
    """Checks the 18 files in the one directory `sources` names, writes each domain's TFDS
    config; returns `<data_dir>/domainnet`."""
    if len(sources) != 1:
        raise archives.ArchiveError(
            f"{NAME} takes one --source: the directory holding its six zips and twelve lists "
            f"(got {len(sources)})."
        )
    (source_dir,) = sources
    if not os.path.isdir(source_dir):
        raise archives.ArchiveError(
            f"--source={source_dir}: {NAME} is prepared from the directory holding its six zips "
            f"and twelve lists (downloaded from {HOMEPAGE}); no such directory."
        )
    paths = {f: os.path.join(source_dir, f) for f in FILES}
    absent = [f for f, p in paths.items() if not os.path.isfile(p)]
    if absent:
        raise archives.ArchiveError(
            f"--source={source_dir}: lacks {', '.join(absent[:3])}"
            + (f" and {len(absent) - 3} more" if len(absent) > 3 else "")
            + f"; download {download_url(absent[0])} (all {len(FILES)} files: {HOMEPAGE})."
        )
    expected = _expected(checksums)
    todo = [d for d in DOMAINS if force or not _prepared(data_dir, d)]
    for domain in DOMAINS:
        if domain not in todo:
            where = version_dir(data_dir, domain)
            print(f"{NAME}/{domain} is already prepared in {where} (--force rebuilds it).")
    if not todo:
        return os.path.join(data_dir, NAME)
    if expected:
        for f in (f for d in todo for f in _files(d)):
            print(f"checking {paths[f]} against {f}'s size and sha256 ({expected[f].checked_by})")
            archives.verify(paths[f], expected[f])
    else:
        print(
            f"{NAME}: no size or sha256 of its files is published (TFDS pins none); pass "
            "--checksums=TSV to check yours. Each image's CRC-32 is checked as it is read."
        )
    lists = {}
    for domain in todo:
        lists[domain] = {s: read_list(paths[list_name(domain, s)], domain) for s in SPLITS}
        for split in SPLITS:
            list_path = paths[list_name(domain, split)]
            check_members(paths[zip_name(domain)], list_path, lists[domain][split])
    staging = tfds_build.staging_dir(data_dir, NAME)
    for domain in todo:
        shutil.rmtree(staging, ignore_errors=True)  # a killed run's leftovers: start over
        builder = Domainnet(
            zip_path=paths[zip_name(domain)],
            lists=lists[domain],
            config=domain,
            data_dir=staging,
            file_format="array_record",
        )
        try:
            staged = tfds_build.build(builder)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        final = version_dir(data_dir, domain)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        if os.path.exists(final):  # force: move the old version aside, never half-delete it
            os.rename(final, os.path.join(staging, "old"))
        os.rename(staged, final)
        shutil.rmtree(staging, ignore_errors=True)
        counts = ", ".join(f"{len(lists[domain][s])} {s}" for s in SPLITS)
        print(f"{NAME}/{domain}: {counts} images written to {final}")
    return os.path.join(data_dir, NAME)


def _prepared(data_dir: str, domain: str) -> bool:
    return os.path.exists(os.path.join(version_dir(data_dir, domain), "dataset_info.json"))
