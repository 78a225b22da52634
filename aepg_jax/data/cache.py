"""Decode-once cache: a split stored as one memory-mapped uint8 `.npy` at a fixed resolution.

Every image is decoded and brought to `size x size` once (`resize.store_resize`: shorter side
to `size`, center crop), written to `<root>/<dataset>/<split>-<size>px/images.npy`
(N, size, size, 3) with `labels.npy` and a JSON `manifest.json` (shape, class names, label
checksum, image checksum). Training then reads uint8 batches straight from the memory map and
augments them on the accelerator (`augment.py`).

Crash safety: images are written to `images.partial.npy`, with the number of finished examples
and per-chunk checksums in `progress.json` after every chunk. A killed build resumes from the
last finished chunk. Only a complete build is renamed to `images.npy`, and the manifest is
written last (atomically), so a half-written file is never trusted: a cache without a manifest
does not exist. A manifest whose label checksum or shape disagrees with the source is rebuilt
with a warning; `verify=True` also re-hashes the images.

Several processes sharing the cache directory (the processes of a multi-process run, or runs
started together): the build holds an exclusive lock (`flock` on `<split>-<size>px.lock`
beside the split's directory), so one process builds and the others wait for it, then read
the finished cache. A builder that dies releases the lock; the next one resumes its build.

Disk: before anything is written, the bytes the split needs (`N * size * size * 3`) are
compared with the space free where it goes; too little stops the run in one line naming both
and the fields that set the size (`CacheTooLarge`). The images file is then reserved on disk in
full (`posix_fallocate`), so the build cannot run out of space while writing through the memory
map (on a full disk that is a SIGBUS, not an exception).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Sequence

import numpy as np

from aepg_jax.data.resize import store_resize
from aepg_jax.data.source import Source
from aepg_jax.system import preemption
from aepg_jax.system import progress as system_progress

FORMAT_VERSION = 1
_CHUNK = 512


@dataclasses.dataclass(frozen=True)
class CachedSplit:
    """A cached split: `images` (N, S, S, 3) uint8 memory map, `labels` (N,) int64."""

    images: np.ndarray
    labels: np.ndarray
    manifest: dict

    def __len__(self) -> int:
        return len(self.labels)


def split_dir(root: str, dataset: str, split: str, size: int) -> str:
    """Directory of one cached split."""
    return os.path.join(root, dataset, f"{split}-{size}px")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def labels_checksum(labels: np.ndarray) -> str:
    """sha256 of the labels as little-endian int64."""
    return _sha256(np.asarray(labels, "<i8").tobytes())


def _write_json(path: str, obj: dict) -> None:
    """Atomic JSON write: temp file, fsync, rename."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _combine(chunk_digests: Sequence[str]) -> str:
    return _sha256("".join(chunk_digests).encode())


def images_checksum(images: np.ndarray) -> str:
    """sha256 over the sha256 of each `_CHUNK`-example chunk (resumable while writing)."""
    return _combine(
        [
            _sha256(np.ascontiguousarray(images[i : i + _CHUNK]).tobytes())
            for i in range(0, len(images), _CHUNK)
        ]
    )


def _load_complete(directory: str, source: Source, size: int, verify: bool) -> CachedSplit | None:
    """The finished cache in `directory` if it matches `source`; None if it must be (re)built."""
    manifest_path = os.path.join(directory, "manifest.json")
    if not os.path.exists(manifest_path):
        return None
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
        images = np.load(os.path.join(directory, "images.npy"), mmap_mode="r")
        labels = np.load(os.path.join(directory, "labels.npy"))
    except (OSError, ValueError, json.JSONDecodeError) as err:
        logging.warning("Cache %s is unreadable (%s); rebuilding it.", directory, err)
        return None
    expected_shape = [len(source), size, size, 3]
    problems = []
    if manifest.get("version") != FORMAT_VERSION:
        problems.append(f"format version {manifest.get('version')} != {FORMAT_VERSION}")
    if list(images.shape) != expected_shape or manifest.get("shape") != expected_shape:
        problems.append(f"shape {list(images.shape)} != {expected_shape}")
    if manifest.get("labels_sha256") != labels_checksum(source.labels) or not np.array_equal(
        labels, source.labels
    ):
        problems.append("labels differ from the source")
    if not problems and verify and images_checksum(images) != manifest.get("images_sha256"):
        problems.append("image checksum mismatch (corrupt file)")
    if problems:
        logging.warning("Cache %s is stale (%s); rebuilding it.", directory, "; ".join(problems))
        return None
    return CachedSplit(images, labels, manifest)


@contextlib.contextmanager
def _build_lock(directory: str):
    """Exclusive lock on building `directory`, across processes (released if one dies)."""
    os.makedirs(os.path.dirname(directory), exist_ok=True)
    with open(f"{directory}.lock", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logging.warning("Waiting for another process that builds the cache %s.", directory)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class CacheTooLarge(ValueError):
    """The disk cannot hold the cache about to be built."""


def _free_bytes(path: str) -> int:
    """Bytes free to this process on the file system of `path` (its nearest existing ancestor)."""
    while not os.path.exists(path):
        path = os.path.dirname(path) or "."
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def check_space(directory: str, dataset: str, split: str, n: int, size: int) -> None:
    """Raises `CacheTooLarge` when the split's images (`n x size x size x 3` bytes, less what a
    partial build already holds) do not fit the space free at `directory`."""
    needed = n * size * size * 3
    partial = os.path.join(directory, "images.partial.npy")
    if os.path.exists(partial):
        needed -= os.stat(partial).st_blocks * 512
    free = _free_bytes(directory)
    if needed > free:
        raise CacheTooLarge(
            f"the decode-once cache of {dataset}/{split} at {size} px needs {needed / 2**30:.1f} "
            f"GiB in {directory}, {free / 2**30:.1f} GiB are free: check data.store_size (and "
            "model.image_size, which sets the pretraining cache's size), or point "
            "data.cache_dir at a larger disk."
        )


def load_or_build(
    source: Source,
    root: str,
    dataset: str,
    split: str,
    size: int,
    *,
    class_names: Sequence[str] = (),
    verify: bool = False,
    num_workers: int | None = None,
    resize_fn: Callable[[np.ndarray, int], np.ndarray] = store_resize,
    progress: bool = True,
) -> CachedSplit:
    """The cached split for `source`, building (or resuming) it when needed; one process
    at a time builds, the others wait and read its result."""
    directory = split_dir(root, dataset, split, size)
    cached = _load_complete(directory, source, size, verify)
    if cached is not None:
        return cached
    check_space(directory, dataset, split, len(source), size)
    with _build_lock(directory):
        # Another process may have finished the build while this one waited for the lock.
        cached = _load_complete(directory, source, size, verify)
        if cached is not None:
            return cached
        return _build(
            source, directory, dataset, split, size, class_names, num_workers, resize_fn, progress
        )


def _reserve(path: str, directory: str, dataset: str, split: str, size: int) -> None:
    """Allocates every block of `path` now, so that writing through its memory map cannot meet
    a full disk (a SIGBUS); `CacheTooLarge` when the space went meanwhile."""
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            if err.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                return  # a file system without fallocate: the check before is what there is
            raise
        raise CacheTooLarge(
            f"the disk of {directory} filled while reserving the cache of {dataset}/{split} at "
            f"{size} px: free space there, or point data.cache_dir at a larger disk."
        ) from err
    finally:
        os.close(fd)


def _build(
    source: Source,
    directory: str,
    dataset: str,
    split: str,
    size: int,
    class_names: Sequence[str],
    num_workers: int | None,
    resize_fn: Callable[[np.ndarray, int], np.ndarray],
    progress: bool,
) -> CachedSplit:
    """Builds (or resumes building) the cache in `directory`; the caller holds the lock."""
    if os.path.exists(os.path.join(directory, "manifest.json")):
        shutil.rmtree(directory)  # stale complete cache: start over
    os.makedirs(directory, exist_ok=True)

    n = len(source)
    shape = (n, size, size, 3)
    partial = os.path.join(directory, "images.partial.npy")
    progress_path = os.path.join(directory, "progress.json")
    label_sha = labels_checksum(source.labels)
    state = {"done": 0, "chunk_sha256": [], "shape": list(shape), "labels_sha256": label_sha}
    if os.path.exists(partial) and os.path.exists(progress_path):
        with open(progress_path) as f:
            previous = json.load(f)
        if previous.get("shape") == list(shape) and previous.get("labels_sha256") == label_sha:
            state = previous
            logging.info("Resuming cache build %s at %d/%d.", directory, state["done"], n)
    if state["done"] == 0:
        images = np.lib.format.open_memmap(partial, mode="w+", dtype=np.uint8, shape=shape)
    else:
        images = np.load(partial, mmap_mode="r+")
    _reserve(partial, directory, dataset, split, size)

    def decode(i: int) -> np.ndarray:
        image = resize_fn(source.image(i), size)
        if image.shape != (size, size, 3) or image.dtype != np.uint8:
            raise ValueError(f"resize gave {image.shape} {image.dtype} for example {i}.")
        return image

    bar = system_progress.new(
        total=n,
        initial=state["done"],
        desc=f"caching {dataset}/{split} @{size}px",
        unit="img",
        disable=not progress,
    )
    with concurrent.futures.ThreadPoolExecutor(num_workers or os.cpu_count()) as pool:
        for start in range(state["done"], n, _CHUNK):
            stop = min(start + _CHUNK, n)
            images[start:stop] = np.stack(list(pool.map(decode, range(start, stop))))
            images.flush()
            state["chunk_sha256"].append(
                _sha256(np.ascontiguousarray(images[start:stop]).tobytes())
            )
            state["done"] = stop
            _write_json(progress_path, state)
            bar.update(stop - start)
            signum = preemption.requested()
            if signum is not None and stop < n:  # a long build stops too, where it resumes
                raise preemption.Preempted(
                    signum, f"while caching {dataset}/{split} at {stop}/{n} images (resumed there)"
                )
    bar.close()
    del images

    labels_tmp = os.path.join(directory, "labels.partial.npy")
    np.save(labels_tmp, np.asarray(source.labels, np.int64))
    os.replace(labels_tmp, os.path.join(directory, "labels.npy"))
    os.replace(partial, os.path.join(directory, "images.npy"))
    manifest = {
        "version": FORMAT_VERSION,
        "dataset": dataset,
        "split": split,
        "size": size,
        "shape": list(shape),
        "class_names": list(class_names),
        "labels_sha256": label_sha,
        "images_sha256": _combine(state["chunk_sha256"]),
    }
    _write_json(os.path.join(directory, "manifest.json"), manifest)
    os.remove(progress_path)
    cached = _load_complete(directory, source, size, verify=False)
    assert cached is not None, directory
    return cached
