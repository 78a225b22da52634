"""Host loader throughput vs what the plan projects one H100 consumes, measured in one run.

Builds (or reuses) a synthetic decode-once cache at the real size in the cache's on-disk
format (`images.npy` (N, S, S, 3) uint8 and `labels.npy`, memory-mapped as `cache.py` does),
warms the page cache, then times over the same epoch order (`loader.epoch_order`, seed 0):

* memcpy: contiguous copies of a batch's bytes from the memory map (the ceiling),
* sorted gather: `np.take` of a batch's sorted rows into a preallocated buffer,
* old loader: the baseline, the previous `loader.iterate` (kept below verbatim),
* new loader: `aepg_jax.data.loader.iterate` (default threads, and with one thread),

each in `--rounds` interleaved rounds of `--batches` batches (median reported; the machine may be
shared, so the load average is printed beside). H100 consumption = bf16 peak x the plan's MFU /
FLOPs per image of the train step (`--gflop_per_img`, from BENCHMARKS.md's plan table: lae bf16,
1 x H100, ViT-B/16 at 224 px).

    nice -n 10 .venv/bin/python benchmarks/bench_loader.py [--n=24000] [--batch=256]
        [--root=rehearsal/bench_loader]
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import statistics
import time

import jax
import numpy as np

from aepg_jax.data import loader
from aepg_jax.plan import report, targets

ROOT = "rehearsal/bench_loader"  # --root's default, relative to the working directory


# ---- the previous loader, verbatim (the baseline) ----------------------------------------------
def _old_read(images, labels, rows, valid):
    order = np.argsort(rows, kind="stable")
    gathered = np.empty((len(rows), *images.shape[1:]), images.dtype)
    gathered[order] = images[rows[order]]
    return gathered, labels[rows].astype(np.int32), valid


def old_iterate(images, labels, indices, batch_size, mesh, *, seed=0, epoch=0, prefetch=2):
    """The old `iterate` (training, one seed): one gather thread, fancy index then scatter."""
    indices = np.asarray(indices, np.int64)
    order = loader.epoch_order(indices, seed, epoch)
    count = loader.num_batches(len(indices), batch_size, drop_last=True)
    valid = np.ones(count * batch_size, bool)
    sharding = loader.batch_sharding(mesh)

    def host_batch(b):
        sl = slice(b * batch_size, (b + 1) * batch_size)
        return _old_read(images, labels, order[sl], valid[sl])

    def to_global(x):
        return jax.make_array_from_process_local_data(sharding, x, (batch_size, *x.shape[1:]))

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = collections.deque(pool.submit(host_batch, b) for b in range(min(prefetch, count)))
        for b in range(count):
            image, label, mask = pending.popleft().result()
            if b + prefetch < count:
                pending.append(pool.submit(host_batch, b + prefetch))
            yield {"image": to_global(image), "label": to_global(label), "mask": to_global(mask)}


# ---- the cache ----------------------------------------------------------------------------------
def cache(n: int, size: int, root: str = ROOT) -> tuple[np.ndarray, np.ndarray]:
    """The synthetic cache under `root` (built once, then reused)."""
    directory = os.path.join(root, f"train-{size}px-{n}")
    path = os.path.join(directory, "images.npy")
    if not os.path.exists(os.path.join(directory, "labels.npy")):
        os.makedirs(directory, exist_ok=True)
        out = np.lib.format.open_memmap(path + ".partial", "w+", np.uint8, (n, size, size, 3))
        rng = np.random.default_rng(0)
        for i in range(0, n, 512):
            out[i : i + 512] = rng.integers(0, 256, out[i : i + 512].shape, dtype=np.uint8)
        out.flush()
        del out
        os.replace(path + ".partial", path)
        np.save(os.path.join(directory, "labels.npy"), rng.integers(0, 200, n))
    return np.load(path, mmap_mode="r"), np.load(os.path.join(directory, "labels.npy"))


def warm(images: np.ndarray) -> float:
    t = time.perf_counter()
    buf = np.empty((512, *images.shape[1:]), images.dtype)
    for i in range(0, len(images), 512):
        part = images[i : i + 512]
        np.copyto(buf[: len(part)], part)
    return time.perf_counter() - t


# ---- the measurements ---------------------------------------------------------------------------
def timed(batches) -> float:
    t, count = time.perf_counter(), 0
    for batch in batches:
        jax.block_until_ready(batch)
        count += 1
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=24000)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--batches", type=int, default=0, help="per method and round (0: an epoch)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--gflop_per_img", type=float, default=71.71)
    p.add_argument("--json", default="", help="also write the results to this file")
    p.add_argument("--root", default=ROOT, help="where the synthetic cache is built (4.4 GiB)")
    a = p.parse_args()

    images, labels = cache(a.n, a.size, a.root)
    warm_s = warm(images)
    mesh = loader.data_mesh(jax.local_devices()[:1])
    order = loader.epoch_order(np.arange(a.n), 0, 0)
    k = min(a.batches or a.n, a.n // a.batch)
    indices = order[: k * a.batch]  # the first k batches of an epoch: same rows for every method
    sub = np.sort(indices)  # an epoch over these rows (own permutation) for the loaders
    buf = np.empty((a.batch, *images.shape[1:]), images.dtype)

    def memcpy():
        for b in range(k):
            np.copyto(buf, images[b * a.batch : (b + 1) * a.batch])
            yield None

    def sorted_gather():
        for b in range(k):
            np.take(images, np.sort(indices[b * a.batch : (b + 1) * a.batch]), 0, buf, "clip")
            yield None

    methods = {
        "memcpy (ceiling)": lambda: timed(memcpy()),
        "sorted gather": lambda: timed(sorted_gather()),
        "old loader": lambda: timed(old_iterate(images, labels, sub, a.batch, mesh)),
        "new, 1 thread": lambda: timed(
            loader.iterate(images, labels, sub, a.batch, mesh, train=True, workers=1)
        ),
        "new loader": lambda: timed(loader.iterate(images, labels, sub, a.batch, mesh, train=True)),
    }
    load_before = os.getloadavg()
    seconds = {m: [] for m in methods}
    for _ in range(a.rounds):
        for m, run in methods.items():
            seconds[m].append(run())
    load_after = os.getloadavg()

    rate = {m: k * a.batch / statistics.median(s) for m, s in seconds.items()}
    h100 = targets.CHIPS["h100"].peak_bf16 * report.MFU / (a.gflop_per_img * 1e9)
    print(
        f"cache {a.n} x {a.size}x{a.size}x3 uint8 ({images.nbytes / 2**30:.2f} GiB), warmed in "
        f"{warm_s:.1f} s; batch {a.batch}, {k} batches x {a.rounds} rounds; cpus {os.cpu_count()}; "
        f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after"
    )
    print(
        f"plan: one H100 bf16 at {report.MFU:.0%} MFU, {a.gflop_per_img} GFLOP/img -> "
        f"{h100:,.0f} images/s"
    )
    print(f"{'path':<18} {'images/s':>10} {'GB/s':>6} {'x old':>6} {'x H100':>7}  rounds (s)")
    for m, r in rate.items():
        gbs = r * images[0].nbytes / 1e9
        rounds = " ".join(f"{s:.2f}" for s in seconds[m])
        ratios = f"{r / rate['old loader']:>6.2f} {r / h100:>7.2f}"
        print(f"{m:<18} {r:>10,.0f} {gbs:>6.2f} {ratios}  {rounds}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rate": rate, "h100": h100, "load": [load_before, load_after]}, f)


if __name__ == "__main__":
    main()
