"""Image-folder datasets (not in TFDS): checked, copied byte for byte to `<data_dir>/<name>/`.

| name          | the source folder                         | classes | published images         |
|---------------|-------------------------------------------|---------|--------------------------|
| clrs25        | CLRS: `ROOT/<class>/*`                    | 25      | 600 per class (15,000)   |
| imagenet_a    | PILOT's `ROOT/{train,test}/<class>/*`     | 200     | 5,981 train, 1,519 test  |
| objectnet     | PILOT's `ROOT/{train,test}/<class>/*`     | 200     | 26,509 train, 6,628 test |
| omnibenchmark | PILOT's `ROOT/{train,test}/<class>/*`     | 300     | 89,697 train, 5,985 test |
| vtab          | PILOT's `ROOT/{train,test}/<class>/*`     | 50      | 1,796 train, 8,619 test  |

The PILOT sets are the ImageNet-A, ObjectNet, OmniBenchmark and VTAB subsets that PILOT and
APER distribute as image folders (their counts as APER's paper reports them). Single wrapping
directories around ROOT (an archive's `imagenet-a/`, VTAB's `vtab-cil/vtab/`) are looked
through. Checked: the class count of every split, that train and test hold the same classes,
that every class holds images and no sub-folders (torchvision's `ImageFolder`, which PILOT
reads them with, would walk into those; `data.source=folder` reads each class folder flat), and
that every image opens with Pillow (progress bar with ETA). Counts other than the published
ones are reported, not refused; files that are not images are reported and left out. No
official digest is published for these folders: none is checked.

The files are copied byte for byte, hidden ones left out, into a hidden staging dir that is
renamed to `<data_dir>/<name>` at the end, so a killed preparation never leaves a partial folder
a run would read. Layout: `<data_dir>/clrs25/<class>/*` (the run splits it 80/20 by
`data.split_seed`), `<data_dir>/<name>/{train,test}/<class>/*` for the others (the run reads
those splits). Run with `data.source=folder`, `data.data_dir=<data_dir>` (the data root, shared
with TFDS datasets; `data/folder.py` `dataset_root`) or `<data_dir>/<name>`: class ids are
the sorted class folder names and examples are in sorted file order within a class, as
`ImageFolder` numbers and lists them.
"""

from __future__ import annotations

import dataclasses
import os
import shutil

from PIL import Image

from aepg_jax.data.folder import IMAGE_EXTENSIONS
from aepg_jax.prepare import archives
from aepg_jax.system import progress


@dataclasses.dataclass(frozen=True)
class FolderSet:
    """One folder dataset: its split folders (() when the classes sit at the root), class
    count, and published images per split (`""`: the root) or per class."""

    splits: tuple[str, ...]
    classes: int
    images: dict[str, int]
    per_class: int | None = None

    def layout(self) -> str:
        """The source layout, as the error lines name it."""
        return "ROOT/<class>/*" if not self.splits else "ROOT/{train,test}/<class>/*"


_PILOT = ("train", "test")
FOLDERS = {
    "clrs25": FolderSet((), 25, {"": 15_000}, per_class=600),
    "imagenet_a": FolderSet(_PILOT, 200, {"train": 5_981, "test": 1_519}),
    "objectnet": FolderSet(_PILOT, 200, {"train": 26_509, "test": 6_628}),
    "omnibenchmark": FolderSet(_PILOT, 300, {"train": 89_697, "test": 5_985}),
    "vtab": FolderSet(_PILOT, 50, {"train": 1_796, "test": 8_619}),
}
NUM_CLASSES = {name: f.classes for name, f in FOLDERS.items()}


def _visible(path: str) -> list[str]:
    """Entries of `path` a dataset holds: no hidden ones, no macOS `__MACOSX` folder."""
    return [e for e in sorted(os.listdir(path)) if not e.startswith(".") and e != "__MACOSX"]


def _root(source: str, splits: tuple[str, ...]) -> str:
    """`source`, or the folder inside its single wrapping directories that holds the splits
    (no splits: the classes, looked through only while the folder holds one entry)."""
    entries = _visible(source)
    dirs = [e for e in entries if os.path.isdir(os.path.join(source, e))]
    if splits and any(s in dirs for s in splits):  # the root, complete or not
        return source
    if len(dirs) == 1 and (splits or len(entries) == 1):
        return _root(os.path.join(source, dirs[0]), splits)
    return source


def _scan(name: str, source: str, split_dir: str) -> tuple[dict[str, list[str]], list[str]]:
    """`({class: image file names}, skipped non-image files)` of one split folder; refuses
    class folders that hold sub-folders."""
    classes = [c for c in _visible(split_dir) if os.path.isdir(os.path.join(split_dir, c))]
    files, skipped = {}, []
    for c in classes:
        class_dir = os.path.join(split_dir, c)
        entries = _visible(class_dir)
        nested = [e for e in entries if os.path.isdir(os.path.join(class_dir, e))]
        if nested:
            raise archives.ArchiveError(
                f"--source={source}: {class_dir} holds the folder {nested[0]}; {name} keeps the "
                "images of a class directly in its class folder: unpack the dataset again."
            )
        files[c] = [f for f in entries if f.lower().endswith(IMAGE_EXTENSIONS)]
        skipped += [
            os.path.join(class_dir, f) for f in entries if not f.lower().endswith(IMAGE_EXTENSIONS)
        ]
    return files, skipped


def _check_classes(name: str, source: str, where: str, files: dict[str, list[str]]) -> None:
    expected = FOLDERS[name].classes
    empty = [c for c, f in files.items() if not f]
    if len(files) != expected or empty:
        raise archives.ArchiveError(
            f"--source={source}: {len(files)} class directories"
            + (f" ({len(empty)} without images: {', '.join(empty[:3])})" if empty else "")
            + f" in {where}; {name} has {expected}, each holding its images."
        )


def _check_same_classes(source: str, root: str, found: dict[str, dict[str, list[str]]]) -> None:
    train, test = (set(found[s]) for s in _PILOT)
    if train != test:
        only = {s: sorted(a - b) for s, a, b in (("train", train, test), ("test", test, train))}
        differ = "; ".join(f"only in {s}/: {', '.join(c[:3])}" for s, c in only.items() if c)
        raise archives.ArchiveError(
            f"--source={source}: train/ and test/ of {root} hold different classes ({differ}); "
            "both must hold the same class folders: unpack the dataset again."
        )


def _note_counts(name: str, found: dict[str, dict[str, list[str]]]) -> None:
    spec = FOLDERS[name]
    if spec.per_class is not None:
        odd = {c: len(f) for c, f in found[""].items() if len(f) != spec.per_class}
        if odd:
            print(f"note: {len(odd)} classes do not hold {spec.per_class} images: {odd}")
        return
    counts = {s: sum(len(f) for f in found[s].values()) for s in spec.splits}
    if counts != spec.images:
        got = ", ".join(f"{n:,} {s}" for s, n in counts.items())
        published = ", ".join(f"{n:,} {s}" for s, n in spec.images.items())
        print(f"note: {name} holds {got} images; the published set holds {published}")


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _copy_checked(files: list[tuple[str, str]], desc: str) -> None:
    """Opens each `src` with Pillow and copies it byte for byte to `dst` (progress bar)."""
    with progress.new(total=len(files), desc=desc, unit="img", disable=None) as bar:
        for src, dst in files:
            try:
                with Image.open(src) as img:
                    img.load()
            except OSError as err:
                raise archives.ArchiveError(
                    f"{src}: not a readable image ({err}); unpack the dataset again."
                ) from err
            shutil.copyfile(src, dst)
            bar.update(1)


def prepare(name: str, source: str, data_dir: str, *, force: bool = False) -> str:
    """Checks and copies the image folder `source` of `name`; returns the prepared folder."""
    spec = FOLDERS[name]
    if not os.path.isdir(source):
        raise archives.ArchiveError(
            f"--source={source}: {name} is prepared from its unpacked folder ({spec.layout()}); "
            "no such directory."
        )
    final = os.path.join(data_dir, name)
    if os.path.isdir(final) and not force:
        print(f"{name} is already prepared in {final} (--force rebuilds it).")
        return final
    root = _root(source, spec.splits)
    missing = [s for s in spec.splits if not os.path.isdir(os.path.join(root, s))]
    if missing:
        raise archives.ArchiveError(
            f"--source={source}: {root} has no {' or '.join(f'{s}/' for s in missing)} folder; "
            f"{name} is PILOT's folder {spec.layout()}: pass the unpacked folder that holds "
            "train/ and test/."
        )
    found, skipped = {}, []
    for split in spec.splits or ("",):
        where = os.path.join(root, split) if split else root
        found[split], split_skipped = _scan(name, source, where)
        skipped += split_skipped
        _check_classes(name, source, where, found[split])
    if spec.splits:
        _check_same_classes(source, root, found)
    _note_counts(name, found)
    if skipped:
        print(f"note: left out {len(skipped)} file(s) that are not images, e.g. {skipped[0]}")

    staging = os.path.join(data_dir, f".{name}.preparing")
    shutil.rmtree(staging, ignore_errors=True)
    copies = []
    for split, classes in found.items():
        for c, names in classes.items():
            os.makedirs(os.path.join(staging, split, c))
            src, dst = os.path.join(root, split, c), os.path.join(staging, split, c)
            copies += [(os.path.join(src, f), os.path.join(dst, f)) for f in names]
    need = sum(os.path.getsize(src) for src, _ in copies)
    free = shutil.disk_usage(data_dir).free
    if need > free:
        shutil.rmtree(staging, ignore_errors=True)
        raise archives.ArchiveError(
            f"{name} needs {_size(need)} free under {data_dir}, {_size(free)} are: free space "
            "(or pass another --data_dir) and run the same command again."
        )
    print(f"{name}: no published digest exists; every image is opened instead")
    try:
        _copy_checked(copies, f"{name}: checking and copying")
    except archives.ArchiveError:
        shutil.rmtree(staging, ignore_errors=True)  # a bad image: nothing half-copied stays
        raise
    old = f"{staging}.old"
    if os.path.exists(final):  # force: move the old one aside, never half-delete it
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(staging, final)
    shutil.rmtree(old, ignore_errors=True)
    return final
