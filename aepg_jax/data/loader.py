"""Batches of a cached split as global arrays sharded over the mesh's `data` axis.

A global batch of `batch_size` examples is cut into `jax.process_count()` equal host slices;
each process reads only its slice from the memory map and the global `jax.Array` is assembled
with `jax.make_array_from_process_local_data` (one device or many, one host or many).

* Training: `drop_last=True`; the order of each epoch is a permutation drawn from
  `(seed, epoch)`, so a run (or a resumed run) sees the same batches.
* Evaluation: every example exactly once, in order; the last batch is padded (with copies of
  the split's first example) and `mask` marks the real rows.

Each batch is a dict `{"image": uint8 (B, S, S, 3), "label": int32 (B,), "mask": bool (B,)}`;
host reads run a few batches ahead in background threads, each gathering its batch in one
copy into a 64-byte-aligned buffer (which the CPU backend then aliases rather than copies; a
buffer is reused once the arrays made from it are gone). Training with a sequence of seeds
(vmapped multi-seed runs) stacks one batch per seed: `(num_seeds, B, ...)`, the seed axis
replicated and the batch axis sharded (`seeds_batch_sharding`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import sys
import threading
from collections.abc import Iterator, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA_AXIS = "data"


def data_mesh(devices: list[jax.Device] | None = None) -> Mesh:
    """A 1-D mesh over `devices` (default: all devices of all processes) named `data`."""
    return Mesh(np.asarray(devices if devices is not None else jax.devices()), (DATA_AXIS,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over `data`, other axes replicated."""
    return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def seeds_batch_sharding(mesh: Mesh) -> NamedSharding:
    """A leading seed axis replicated, the batch axis after it split over `data`."""
    return NamedSharding(mesh, PartitionSpec(None, DATA_AXIS))


def check_batch_size(batch_size: int, mesh: Mesh) -> None:
    """A global batch must split evenly over the devices and the processes."""
    devices, processes = mesh.devices.size, jax.process_count()
    if batch_size <= 0 or batch_size % devices or batch_size % processes:
        raise ValueError(
            f"batch_size={batch_size} must be a positive multiple of the number of devices "
            f"({devices}) and of processes ({processes}); e.g. use "
            f"{max(devices, processes) * max(1, batch_size // max(devices, processes))}."
        )


def epoch_order(indices: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """`indices` permuted by a generator seeded with `(seed, epoch)`."""
    return np.asarray(indices)[np.random.default_rng([seed, epoch]).permutation(len(indices))]


def num_batches(num_examples: int, batch_size: int, drop_last: bool) -> int:
    """Batches per epoch: floor when dropping the last partial batch, ceil otherwise."""
    return num_examples // batch_size if drop_last else -(-num_examples // batch_size)


def _host_slice(rows: np.ndarray) -> np.ndarray:
    per_host = len(rows) // jax.process_count()
    start = jax.process_index() * per_host
    return rows[start : start + per_host]


_ALIGN = 64  # XLA's CPU client aliases a host buffer aligned to 64 bytes instead of copying it


class _Buffers:
    """64-byte-aligned host batch buffers of one shape, each reused once only the pool holds it.

    Aligned, the CPU backend aliases a buffer instead of copying it; JAX then keeps a
    reference to it for as long as the array lives (on GPU until its transfer is done), so a
    buffer that nothing but this pool refers to is free to be written again.
    """

    def __init__(self, shape: tuple[int, ...], dtype) -> None:
        self._shape, self._dtype = shape, np.dtype(dtype)
        self._nbytes = int(np.prod(shape)) * self._dtype.itemsize
        self._raw: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self) -> np.ndarray:
        with self._lock:  # the view made below holds `raw` before another thread looks
            for raw in self._raw:
                if sys.getrefcount(raw) <= 3:  # the list, `raw` and getrefcount's argument
                    break
            else:
                raw = np.empty(self._nbytes + _ALIGN, np.uint8)
                self._raw.append(raw)
            start = -raw.ctypes.data % _ALIGN
            return raw[start : start + self._nbytes].view(self._dtype).reshape(self._shape)


def _read(images: np.ndarray, labels: np.ndarray, rows: np.ndarray, out: np.ndarray) -> np.ndarray:
    """`out[i] = images[rows[i]]` in one copy (no temporary; numpy drops the GIL meanwhile).

    `mode="clip"` only because `take` buffers `out` in its default mode; rows are in range.
    Anything else that indexes like an array (a wrapper with `__getitem__`) is indexed.
    """
    if isinstance(images, np.ndarray):
        np.take(images, rows, axis=0, out=out, mode="clip")
    else:
        out[...] = images[rows]
    return labels[rows].astype(np.int32)


def iterate(
    images: np.ndarray,
    labels: np.ndarray,
    indices: np.ndarray,
    batch_size: int,
    mesh: Mesh,
    *,
    train: bool,
    seed: int | Sequence[int] = 0,
    epoch: int = 0,
    start: int = 0,
    prefetch: int = 4,
    workers: int | None = None,
) -> Iterator[dict[str, jax.Array]]:
    """Global batches of `images[indices]` with `labels[indices]` (see the module docstring).

    `seed` a sequence (training only): one batch per seed, stacked on a leading axis, seed i's
    batch being exactly the batch `iterate(..., seed=seed[i])` yields. `start` skips the
    epoch's first batches without reading them (resuming mid-epoch). Host reads run up to
    `prefetch` batches ahead in `workers` threads (default: up to 4, one per CPU); batches are
    yielded in order, so neither changes what is yielded.
    """
    check_batch_size(batch_size, mesh)
    indices = np.asarray(indices, np.int64)
    stacked = not isinstance(seed, int | np.integer)
    if stacked and not train:
        raise ValueError("Evaluation batches take no seeds: pass train=False without a seed list.")
    if train:
        seeds = list(seed) if stacked else [seed]
        orders = [epoch_order(indices, s, epoch) for s in seeds]
        count = num_batches(len(indices), batch_size, drop_last=True)
        valid = np.ones(count * batch_size, bool)
    else:
        count = num_batches(len(indices), batch_size, drop_last=False)
        pad = count * batch_size - len(indices)
        orders = [np.concatenate([indices, np.full(pad, indices[0] if len(indices) else 0)])]
        valid = np.arange(len(orders[0])) < len(indices)
    sharding = seeds_batch_sharding(mesh) if stacked else batch_sharding(mesh)
    local = batch_size // jax.process_count()

    buffers = _Buffers((len(orders), local, *images.shape[1:]), images.dtype)

    def host_batch(b: int):
        batch = slice(b * batch_size, (b + 1) * batch_size)
        mask = _host_slice(valid[batch])
        image = buffers.take()
        label = np.stack(
            [_read(images, labels, _host_slice(o[batch]), image[k]) for k, o in enumerate(orders)]
        )
        if not stacked:
            return image[0], label[0], mask
        return image, label, np.stack([mask] * len(orders))

    def to_global(x: np.ndarray) -> jax.Array:
        lead = x.shape[:1] if stacked else ()
        shape = (*lead, batch_size, *x.shape[len(lead) + 1 :])
        assert x.shape[len(lead)] == local, (x.shape, local)
        return jax.make_array_from_process_local_data(sharding, x, shape)

    if workers is None:
        workers = min(4, os.cpu_count() or 1)
    prefetch = max(prefetch, workers, 1)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        first = min(start, count)
        pending = collections.deque(
            pool.submit(host_batch, b) for b in range(first, min(first + prefetch, count))
        )
        for b in range(first, count):
            image, label, mask = pending.popleft().result()
            if b + prefetch < count:
                pending.append(pool.submit(host_batch, b + prefetch))
            yield {"image": to_global(image), "label": to_global(label), "mask": to_global(mask)}
