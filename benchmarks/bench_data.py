"""Input-pipeline throughput: decode-once cache + jitted augmentation vs per-epoch PIL decoding.

Both pipelines produce the same training batches (RandomResizedCrop(224, scale (0.05, 1)),
horizontal flip, normalisation to [-1, 1], float32 NHWC) from the same JPEG files:

* ours: JPEGs decoded once into the uint8 memory-mapped cache at 256 px (timed separately,
  paid once per dataset), then per epoch: `loader.iterate` (memmap reads, sharded global
  batches) and `augment.train_augment` jitted on the default JAX device;
* baseline: what the PyTorch peers do every epoch on the CPU: open and decode each JPEG with
  PIL, RandomResizedCrop + flip with PIL, normalise with NumPy, stack; run on a thread pool
  with one thread per core (PIL releases the GIL while decoding and resizing).

    python benchmarks/bench_data.py [--images 512] [--batch 64] [--epochs 2]

Prints images/s of each and the ratio, measured in this one run (the first epoch of ours
includes compilation and is reported separately), plus our loader and our augmentation alone.
On a CPU-only machine the augmentation runs on the CPU too, where `scale_and_translate`'s
dense antialiased resize is slower than PIL's; the design pays off when a GPU/TPU runs it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import math
import os
import random
import tempfile
import time

import jax
import numpy as np
from PIL import Image

from aepg_jax.data import augment, cache, folder, loader


def make_jpegs(root: str, count: int, classes: int = 8, seed: int = 0) -> None:
    """`count` smooth random JPEGs (300-500 px sides) under root/<class>/."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        h, w = rng.integers(300, 500, 2)
        coarse = rng.integers(0, 256, (h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
        img = Image.fromarray(coarse).resize((int(w), int(h)), Image.BILINEAR)
        directory = os.path.join(root, f"class_{i % classes}")
        os.makedirs(directory, exist_ok=True)
        img.save(os.path.join(directory, f"{i:05d}.jpg"), quality=90)


def pil_train_transform(path: str, out: int, rng: random.Random) -> np.ndarray:
    """torchvision-style RandomResizedCrop + flip + normalise on one file, PIL/NumPy only."""
    with Image.open(path) as img:
        img = img.convert("RGB")
        width, height = img.size
        area = width * height
        for _ in range(10):
            target = area * rng.uniform(0.05, 1.0)
            ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
            w = round(math.sqrt(target * ratio))
            h = round(math.sqrt(target / ratio))
            if 0 < w <= width and 0 < h <= height:
                top, left = rng.randint(0, height - h), rng.randint(0, width - w)
                break
        else:
            h, w, top, left = height, width, 0, 0
        crop = img.resize((out, out), Image.BILINEAR, box=(left, top, left + w, top + h))
        if rng.random() < 0.5:
            crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
    return (np.asarray(crop, np.float32) / 255.0 - 0.5) / 0.5


def bench_baseline(paths: list[str], batch: int, epochs: int, out: int) -> float:
    """Images/s of per-epoch PIL decoding + augmentation on a thread pool."""
    rng = random.Random(0)
    seen = 0
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
        for _ in range(epochs):
            order = rng.sample(paths, len(paths))
            for b in range(len(order) // batch):
                chunk = order[b * batch : (b + 1) * batch]
                seeds = [rng.random() for _ in chunk]
                images = list(
                    pool.map(
                        lambda a: pil_train_transform(a[0], out, random.Random(a[1])),
                        zip(chunk, seeds, strict=True),
                    )
                )
                np.stack(images)
                seen += len(chunk)
    return seen / (time.perf_counter() - start)


def bench_ours(split: cache.CachedSplit, batch: int, epochs: int, out: int) -> dict[str, float]:
    """Images/s of our pipeline: loader alone, augmentation alone, both (first epoch apart)."""
    mesh = loader.data_mesh()
    augment_fn = jax.jit(lambda key, x: augment.train_augment(key, x, out))
    key = jax.random.key(0)

    def epoch_batches(epoch: int):
        return loader.iterate(
            split.images,
            split.labels,
            np.arange(len(split)),
            batch,
            mesh,
            train=True,
            seed=0,
            epoch=epoch,
        )

    def timed(fn) -> float:
        start = time.perf_counter()
        seen = fn()
        return seen / (time.perf_counter() - start)

    def full_epoch(epoch: int) -> int:
        result, seen = None, 0
        for step, b in enumerate(epoch_batches(epoch)):
            result = augment_fn(jax.random.fold_in(key, epoch * 10_000 + step), b["image"])
            seen += batch
        jax.block_until_ready(result)
        return seen

    def loader_epoch(epoch: int) -> int:
        seen = 0
        for b in epoch_batches(epoch):
            jax.block_until_ready(b["image"])
            seen += batch
        return seen

    first = timed(lambda: full_epoch(0))
    device_batch = next(epoch_batches(0))["image"]

    def augment_only() -> int:
        result = None
        for step in range(len(split) // batch):
            result = augment_fn(jax.random.fold_in(key, step), device_batch)
        jax.block_until_ready(result)
        return (len(split) // batch) * batch

    return {
        "first": first,
        "full": float(np.median([timed(lambda e=e: full_epoch(e)) for e in range(1, epochs + 1)])),
        "loader": float(np.median([timed(lambda e=e: loader_epoch(e)) for e in range(epochs)])),
        "augment": float(np.median([timed(augment_only) for _ in range(epochs)])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512, help="JPEG files to generate")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs per pipeline")
    parser.add_argument("--out", type=int, default=224, help="augmented image side")
    parser.add_argument("--store", type=int, default=256, help="cache storage side")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        make_jpegs(os.path.join(tmp, "jpegs"), args.images)
        ds = folder.load_folder(os.path.join(tmp, "jpegs"), test_fraction=0.1)
        start = time.perf_counter()
        split = cache.load_or_build(
            ds.train, os.path.join(tmp, "cache"), "bench", "train", args.store, progress=False
        )
        build = len(split) / (time.perf_counter() - start)
        paths = [ds.train.base.paths[i] for i in ds.train.indices]

        baseline = bench_baseline(paths, args.batch, args.epochs, args.out)
        ours = bench_ours(split, args.batch, args.epochs, args.out)

    print(
        f"device: {jax.devices()[0].device_kind} x{jax.device_count()}, "
        f"{os.cpu_count()} CPU threads, {len(paths)} JPEGs, batch {args.batch}, "
        f"{args.out}px crops"
    )
    print(f"cache build (decode once @{args.store}px): {build:8.1f} img/s (paid once)")
    print(f"baseline PIL decode+augment per epoch:    {baseline:8.1f} img/s")
    print(f"ours, first epoch (includes compile):     {ours['first']:8.1f} img/s")
    print(f"ours, loader alone (memmap -> device):    {ours['loader']:8.1f} img/s")
    print(f"ours, jitted augmentation alone:          {ours['augment']:8.1f} img/s")
    print(f"ours, cache + loader + jitted augment:    {ours['full']:8.1f} img/s")
    print(f"ratio ours / baseline:                    {ours['full'] / baseline:8.2f}x")


if __name__ == "__main__":
    main()
