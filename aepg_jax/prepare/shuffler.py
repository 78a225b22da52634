"""TFDS's record shuffle, as an external merge sort on local disk: bounded memory, no TensorFlow.

TFDS's writer (`tensorflow_datasets.core.writer.Writer`) hands every serialized example to a
`shuffle.Shuffler` and writes the shards in the order it yields: ascending
`hkey = int(md5(salt + key))` (128 bits; `hashing.Hasher`, salt = the split name), a duplicate
hkey being an error. TFDS keeps the examples in memory up to `shuffle.MAX_MEM_BUFFER_SIZE`
(1 GB) and then spills them into 1000 bucket files by hkey range through `tf.io.gfile`, which
fails without TensorFlow: ImageNet-R (2.0 GiB), Food-101 (4.7 GiB) and CUB-200 cross it.

`SpillingShuffler` has the same interface and yields the same sequence (sorted by hkey: the
in-memory path sorts all, the bucket path sorts bucket after bucket of ascending hkey ranges,
both the global hkey order), but keeps at most `mem_limit` bytes of records in memory: each
time they exceed it, they are sorted and written as one run file (`hkey` 16 bytes big-endian,
length 8 bytes, record), and iteration merges the runs (`heapq.merge`, one buffered reader
each). Disk: the split's bytes once more, in a hidden directory beside the shards, deleted as
soon as the split is written (and with the staging dir if the process dies).

`installed(mem_limit)` swaps it in for `shuffle.Shuffler` (the name `writer.Writer` looks up)
for the duration of a build; `tests/test_prepare_spill.py` pins what this relies on.
"""

from __future__ import annotations

import contextlib
import heapq
import operator
import os
import shutil
import struct
import uuid
from collections.abc import Iterator

import tqdm
from tensorflow_datasets.core import hashing, shuffle

from aepg_jax.system import progress

MEM_LIMIT = 256 << 20  # bytes of records held in memory before a run is written
_HEADER = struct.Struct(">16sQ")  # hkey (big-endian, so bytes order = int order), length
_BUFFER = 1 << 20  # read buffer per run file during the merge


class SpillingShuffler:
    """Drop-in for `tensorflow_datasets.core.shuffle.Shuffler` (same arguments and yield)."""

    def __init__(
        self,
        dirpath,
        hash_salt: str | bytes,
        disable_shuffling: bool = False,
        ignore_duplicates: bool = False,
        *,
        mem_limit: int = MEM_LIMIT,
    ):
        self._dir = os.path.join(os.fspath(dirpath), f".shuffle-{uuid.uuid4().hex}")
        self._hasher = hashing.Hasher(hash_salt)
        self._disable_shuffling = disable_shuffling
        self._ignore_duplicates = ignore_duplicates
        self._mem_limit = mem_limit
        self._seen: set[int] = set()
        self._buffer: list[tuple[int, bytes]] = []
        self._buffered_bytes = 0
        self._runs: list[str] = []
        self._total_bytes = 0
        self._num_examples = 0
        self._read_only = False
        split = hash_salt.decode() if isinstance(hash_salt, bytes) else hash_salt
        self.desc = f"writing the {split} split"  # TFDS salts with the split name

    @property
    def size(self) -> int:
        """Bytes of all records (not keys), as TFDS's."""
        return self._total_bytes

    @property
    def num_examples(self) -> int:
        return self._num_examples

    @property
    def bucket_lengths(self) -> list[int]:
        # TFDS uses these only for the shards' unused `file_instructions`; the shard sizes
        # come from `num_examples` and `size`.
        return [self._num_examples]

    @property
    def num_runs(self) -> int:
        return len(self._runs)

    def add(self, key, data: bytes) -> None:
        if self._read_only:
            raise AssertionError("add() cannot be called after __iter__.")
        if not isinstance(data, bytes):
            raise AssertionError(f"Only bytes (not {type(data)}) can be stored in Shuffler!")
        hkey = self._hasher.hash_key(key)
        if self._ignore_duplicates:
            if hkey in self._seen:
                return
            self._seen.add(hkey)
        if self._disable_shuffling:
            hkey = int(key)  # TFDS: the key itself keeps the generation order
        self._buffer.append((hkey, data))
        self._buffered_bytes += len(data)
        self._total_bytes += len(data)
        self._num_examples += 1
        if self._buffered_bytes > self._mem_limit:
            self._spill()

    def _spill(self) -> None:
        """Writes the buffer, sorted, as one run file (complete before it is listed)."""
        os.makedirs(self._dir, exist_ok=True)
        self._buffer.sort(key=operator.itemgetter(0))
        path = os.path.join(self._dir, f"run_{len(self._runs):05d}")
        with open(path, "wb", buffering=_BUFFER) as f:
            for hkey, data in self._buffer:
                f.write(_HEADER.pack(hkey.to_bytes(16, "big"), len(data)))
                f.write(data)
        self._runs.append(path)
        self._buffer, self._buffered_bytes = [], 0

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        self._read_only = True
        bar = progress.new(
            total=self._num_examples,
            desc=self.desc,
            unit=" records",
            dynamic_ncols=True,
            leave=False,
            disable=None,  # no bar when stderr is not a terminal (logs, tests)
        )
        try:
            if self._runs and self._buffer:
                self._spill()
            if self._runs:
                with contextlib.ExitStack() as stack:
                    files = [
                        stack.enter_context(open(p, "rb", buffering=_BUFFER)) for p in self._runs
                    ]
                    merged = heapq.merge(*map(_read_run, files), key=operator.itemgetter(0))
                    yield from _checked(merged, bar)
            else:
                self._buffer.sort(key=operator.itemgetter(0))
                yield from _checked(iter(self._buffer), bar)
        finally:
            bar.close()
            self._buffer = []
            shutil.rmtree(self._dir, ignore_errors=True)


def _read_run(f) -> Iterator[tuple[int, bytes]]:
    while header := f.read(_HEADER.size):
        hkey, length = _HEADER.unpack(header)
        yield int.from_bytes(hkey, "big"), f.read(length)


def _checked(records: Iterator[tuple[int, bytes]], bar: tqdm.tqdm):
    """TFDS's `Shuffler.__iter__`: equal consecutive hkeys are a duplicated key."""
    previous_hkey, previous_data = None, None
    for hkey, data in records:
        if hkey == previous_hkey:
            raise shuffle.DuplicatedKeysError(data, previous_data)
        previous_hkey, previous_data = hkey, data
        bar.update()
        yield hkey, data


@contextlib.contextmanager
def installed(mem_limit: int | None = None):
    """`shuffle.Shuffler` is `SpillingShuffler(mem_limit=mem_limit or MEM_LIMIT)` inside."""
    original = shuffle.Shuffler
    mem_limit = mem_limit or MEM_LIMIT

    def make(*args, **kwargs) -> SpillingShuffler:
        return SpillingShuffler(*args, mem_limit=mem_limit, **kwargs)

    shuffle.Shuffler = make
    try:
        yield
    finally:
        shuffle.Shuffler = original
