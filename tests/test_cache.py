"""Tests for aepg_jax.data.cache: decode-once cache, crash-safe resumable builds, staleness,
processes sharing a cache directory."""

import json
import logging
import multiprocessing
import os
import signal
import time

import numpy as np
import pytest

from aepg_jax.data import cache
from aepg_jax.data.resize import store_resize
from aepg_jax.data.source import ArraySource

N, SIZE = 1300, 12  # > 2 chunks of 512


class CountingSource:
    """An ArraySource that counts decodes and can fail at one index (a simulated crash)."""

    def __init__(self, base, fail_at=None):
        self.base, self.fail_at, self.decoded = base, fail_at, 0

    @property
    def labels(self):
        return self.base.labels

    def __len__(self):
        return len(self.base)

    def image(self, index):
        if index == self.fail_at:
            raise KeyboardInterrupt("simulated crash")
        self.decoded += 1
        return self.base.image(index)


@pytest.fixture
def source():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (N, 15, 18, 3), dtype=np.uint8)
    return ArraySource(images, rng.integers(0, 7, N))


def _build(src, root, **kw):
    return cache.load_or_build(
        src, str(root), "toy", "train", SIZE, progress=False, num_workers=2, **kw
    )


def test_build_then_reuse(source, tmp_path):
    counting = CountingSource(source)
    built = _build(counting, tmp_path, class_names=["c"] * 7)
    assert built.images.shape == (N, SIZE, SIZE, 3) and built.images.dtype == np.uint8
    assert isinstance(built.images, np.memmap)
    for i in (0, 700, N - 1):
        np.testing.assert_array_equal(built.images[i], store_resize(source.image(i), SIZE))
    np.testing.assert_array_equal(built.labels, source.labels)
    manifest = json.load(
        open(os.path.join(cache.split_dir(str(tmp_path), "toy", "train", SIZE), "manifest.json"))
    )
    assert manifest["shape"] == [N, SIZE, SIZE, 3] and manifest["class_names"] == ["c"] * 7
    assert manifest["images_sha256"] == cache.images_checksum(built.images)
    assert counting.decoded == N

    again = CountingSource(source)
    reused = _build(again, tmp_path, verify=True)
    assert again.decoded == 0  # nothing decoded a second time
    np.testing.assert_array_equal(reused.images, built.images)


def test_crash_leaves_nothing_trusted_and_resumes(source, tmp_path):
    directory = cache.split_dir(str(tmp_path), "toy", "train", SIZE)
    with pytest.raises(KeyboardInterrupt):
        _build(CountingSource(source, fail_at=1100), tmp_path)
    files = set(os.listdir(directory))
    assert "manifest.json" not in files and "images.npy" not in files
    assert {"images.partial.npy", "progress.json"} <= files
    done = json.load(open(os.path.join(directory, "progress.json")))["done"]
    assert done == 1024  # two finished chunks survived

    resumed_source = CountingSource(source)
    resumed = _build(resumed_source, tmp_path)
    assert resumed_source.decoded == N - done  # only the unfinished part was decoded again
    assert not os.path.exists(os.path.join(directory, "progress.json"))
    clean = _build(CountingSource(source), tmp_path / "clean")
    np.testing.assert_array_equal(resumed.images, clean.images)
    assert resumed.manifest["images_sha256"] == clean.manifest["images_sha256"]


def test_progress_of_another_source_is_not_resumed(source, tmp_path):
    with pytest.raises(KeyboardInterrupt):
        _build(CountingSource(source, fail_at=600), tmp_path)
    other = ArraySource(source.images, (source.labels + 1) % 7)
    counting = CountingSource(other)
    built = _build(counting, tmp_path)
    assert counting.decoded == N  # labels differ: the partial build was discarded
    np.testing.assert_array_equal(built.labels, other.labels)


def test_stale_or_corrupt_cache_is_rebuilt(source, tmp_path, caplog):
    built = _build(CountingSource(source), tmp_path)
    changed = ArraySource(source.images, np.roll(source.labels, 1))
    with caplog.at_level(logging.WARNING):
        counting = CountingSource(changed)
        _build(counting, tmp_path)
    assert "labels differ" in caplog.text and counting.decoded == N

    _build(CountingSource(source), tmp_path)  # back to the original labels
    path = os.path.join(cache.split_dir(str(tmp_path), "toy", "train", SIZE), "images.npy")
    corrupt = np.load(path, mmap_mode="r+")
    corrupt[5] = 255 - corrupt[5]
    corrupt.flush()
    del corrupt, built
    unverified = _build(CountingSource(source), tmp_path)  # cheap checks only: trusted
    assert not np.array_equal(unverified.images[5], store_resize(source.image(5), SIZE))
    with caplog.at_level(logging.WARNING):
        counting = CountingSource(source)
        repaired = _build(counting, tmp_path, verify=True)
    assert "checksum mismatch" in caplog.text and counting.decoded == N
    np.testing.assert_array_equal(repaired.images[5], store_resize(source.image(5), SIZE))


def test_unreadable_manifest_is_rebuilt(source, tmp_path):
    _build(CountingSource(source), tmp_path)
    directory = cache.split_dir(str(tmp_path), "toy", "train", SIZE)
    with open(os.path.join(directory, "manifest.json"), "w") as f:
        f.write("{not json")
    counting = CountingSource(source)
    _build(counting, tmp_path)
    assert counting.decoded == N


class SlowSource(CountingSource):
    """A CountingSource whose decodes take `delay` seconds (a build that other processes meet)."""

    def __init__(self, base, delay):
        super().__init__(base)
        self.delay = delay

    def image(self, index):
        time.sleep(self.delay)
        return super().image(index)


class StallingSource(CountingSource):
    """A CountingSource whose decode of example `at` blocks for two minutes (a builder that is
    still at work whenever the test looks)."""

    def __init__(self, base, at):
        super().__init__(base)
        self.at = at

    def image(self, index):
        if index == self.at:
            time.sleep(120)
        return super().image(index)


def _build_in_process(src, root, barrier, results, name):
    """Child process: builds (or waits for and reads) the cache; reports decodes and digest."""
    barrier.wait()
    built = _build(src, root)
    results.put((name, src.decoded, cache.images_checksum(built.images), built.labels.tolist()))


def test_processes_sharing_a_cache_directory_build_it_once(source, tmp_path):
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(3), ctx.Queue()
    procs = [
        ctx.Process(
            target=_build_in_process,
            args=(SlowSource(source, 0.001), str(tmp_path), barrier, results, i),
        )
        for i in range(3)
    ]
    for p in procs:
        p.start()
    reports = sorted(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    decoded = [r[1] for r in reports]
    assert sorted(decoded) == [0, 0, N]  # one process decoded everything, the others none
    assert len({r[2] for r in reports}) == 1 and all(
        r[3] == source.labels.tolist() for r in reports
    )
    directory = cache.split_dir(str(tmp_path), "toy", "train", SIZE)
    assert sorted(os.listdir(directory)) == ["images.npy", "labels.npy", "manifest.json"]
    clean = _build(CountingSource(source), tmp_path / "clean")
    assert reports[0][2] == cache.images_checksum(clean.images)


def test_a_builder_killed_mid_build_hands_over_to_a_waiting_process(source, tmp_path):
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(1), ctx.Queue()
    directory = cache.split_dir(str(tmp_path), "toy", "train", SIZE)
    first = ctx.Process(  # its build stalls in the second chunk until it is killed
        target=_build_in_process,
        args=(StallingSource(source, at=700), str(tmp_path), barrier, results, "first"),
    )
    first.start()
    progress = os.path.join(directory, "progress.json")
    deadline = time.time() + 60
    while not os.path.exists(progress) and time.time() < deadline:
        time.sleep(0.02)  # the first chunk is written: the build is under way
    second = ctx.Process(
        target=_build_in_process, args=(CountingSource(source), str(tmp_path), barrier, results, 2)
    )
    second.start()
    time.sleep(1.0)  # the second process is waiting for the lock
    assert results.empty()
    os.kill(first.pid, signal.SIGKILL)
    first.join()
    name, decoded, digest, _ = results.get(timeout=120)
    second.join(timeout=30)
    assert name == 2 and second.exitcode == 0
    assert 0 < decoded < N  # resumed the killed build instead of starting over
    assert digest == cache.images_checksum(_build(CountingSource(source), tmp_path / "c").images)


class SignalledSource(CountingSource):
    """Sends this process SIGTERM while decoding example `at` (as SLURM would mid-build)."""

    def __init__(self, base, at):
        super().__init__(base)
        self.at = at

    def image(self, index):
        if index == self.at:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().image(index)


def test_sigterm_stops_a_build_after_its_chunk_and_the_build_resumes_there(source, tmp_path):
    from aepg_jax.system import preemption

    with preemption.catch(), pytest.raises(preemption.Preempted) as stop:
        _build(SignalledSource(source, at=600), tmp_path)
    assert stop.value.status == 128 + signal.SIGTERM
    assert "while caching toy/train at 1024/" in str(stop.value)
    resumed_source = CountingSource(source)
    resumed = _build(resumed_source, tmp_path)
    assert resumed_source.decoded == N - 1024
    np.testing.assert_array_equal(
        resumed.images, _build(CountingSource(source), tmp_path / "c").images
    )
