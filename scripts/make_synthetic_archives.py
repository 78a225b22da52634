"""Real-size synthetic archives in the official member layouts, for rehearsing `prepare`.

    python scripts/make_synthetic_archives.py imagenet_r food101 --out=/work/rehearsal/archives

writes `OUT/imagenet-r.tar` (30,000 JPEGs, 150 in each of 200 `imagenet-r/<wnid>/` folders,
~2.0 GiB as the real one) and/or `OUT/food-101.tar.gz` (101,000 JPEGs, 1,000 per class in
`food-101/images/<class>/<id>.jpg` with `meta/{train,test}.json` listing 750 / 250 of them,
~4.7 GiB), plus `OUT/<archive>.checksums.tsv` for `prepare --checksums`. The images are random
noise JPEGs whose sizes vary around the real archives' mean (noise does not compress, so the
gzip of Food-101 is as large as the real one); the wnids are 200 of TFDS's 1000 ImageNet
label names and the Food-101 classes TFDS's. Each archive is streamed to `<name>.tmp` and
renamed when complete; `--scale` shrinks the example counts per class (to no fewer than 4) and
`make(..., classes=N)` keeps the first N classes (tiny archives for the tests).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tarfile
import time

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from aepg_jax.prepare import archives

# name -> (archive, examples per class, side range in px, JPEG quality): the mean member size
# lands near the real archive's (ImageNet-R 2.0 GiB / 30,000; Food-101 4.7 GiB / 101,000).
LAYOUTS = {
    "imagenet_r": ("imagenet-r.tar", 150, (210, 290), 95),
    "food101": ("food-101.tar.gz", 1000, (180, 220), 95),
}


def _labels(name: str) -> list[str]:
    import tensorflow_datasets as tfds

    if name == "imagenet_r":
        from tensorflow_datasets.datasets.imagenet2012 import imagenet_common

        names = imagenet_common.label_names_file().read_text().split()
        return names[::5][:200]
    return (tfds.core.tfds_path() / "image_classification/food-101_classes.txt").read_text().split()


def _jpeg(rng: np.random.Generator, sides: tuple[int, int], quality: int) -> bytes:
    h, w = (int(v) for v in rng.integers(sides[0], sides[1] + 1, 2))
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(
        buffer, "jpeg", quality=quality
    )
    return buffer.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), 0
    tar.addfile(info, io.BytesIO(data))


def make(name: str, out: str, scale: float = 1.0, seed: int = 0, classes: int | None = None) -> str:
    """Writes the archive of `name` into `out`; returns its path (kept if already there)."""
    filename, per_class, sides, quality = LAYOUTS[name]
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, filename)
    if os.path.exists(path):
        print(f"{path} exists; kept")
        return path
    per_class = max(4, round(per_class * scale))
    labels = _labels(name)[:classes]
    rng = np.random.default_rng(seed)
    tmp = f"{path}.tmp"
    mode = "w:gz" if filename.endswith(".gz") else "w"
    kwargs = {"compresslevel": 1} if mode == "w:gz" else {}
    start, n = time.time(), 0
    with tarfile.open(tmp, mode, **kwargs) as tar:
        train: dict[str, list[str]] = {}
        test: dict[str, list[str]] = {}
        for c, label in enumerate(labels):
            for i in range(per_class):
                if name == "imagenet_r":
                    member = f"imagenet-r/{label}/{['art', 'cartoon', 'sketch'][i % 3]}_{i}.jpg"
                else:
                    image_id = f"{label}/{100000 + 37 * i + c}"
                    member = f"food-101/images/{image_id}.jpg"
                    (train if i < per_class * 3 // 4 else test).setdefault(label, []).append(
                        image_id
                    )
                _add(tar, member, _jpeg(rng, sides, quality))
                n += 1
            print(f"\r{filename}: {n} images, {time.time() - start:.0f} s", end="", flush=True)
        if name == "food101":
            _add(tar, "food-101/meta/classes.txt", "\n".join(labels).encode())
            _add(tar, "food-101/meta/train.json", json.dumps(train).encode())
            _add(tar, "food-101/meta/test.json", json.dumps(test).encode())
        else:
            _add(tar, "imagenet-r/README.txt", b"synthetic ImageNet-R rehearsal archive")
    os.replace(tmp, path)
    size, sha = archives.digest(path)
    with open(f"{path}.checksums.tsv", "w") as f:
        f.write(f"{filename}\t{size}\t{sha}\n")
    print(f"\n{path}: {n} images, {size / 2**30:.2f} GiB, {time.time() - start:.0f} s")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", choices=sorted(LAYOUTS))
    parser.add_argument("--out", required=True)
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args()
    for name in args.names:
        make(name, args.out, args.scale)


if __name__ == "__main__":
    main()
