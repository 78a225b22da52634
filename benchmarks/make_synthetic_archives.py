"""Real-size synthetic archives in the official member layouts, for rehearsing `prepare`.

    python benchmarks/make_synthetic_archives.py imagenet_r food101 caltech_birds2011 cifar10 \
        cifar100 clrs25 domainnet imagenet_a objectnet omnibenchmark vtab \
        --out=rehearsal/archives

writes into OUT, each as the real download is laid out:

| name | file(s) | examples | size |
|---|---|---|---|
| imagenet_r | imagenet-r.tar | 30,000 in 200 classes | 2.0 GiB |
| food101 | food-101.tar.gz (meta/{train,test}.json) | 101,000: 750 + 250 x101 | 4.7 GiB |
| caltech_birds2011 | CUB_200_2011.tgz + segmentations.tgz | 11,788: 5,994 + 5,794 | 1.1 GiB |
| cifar10 | cifar-10-python.tar.gz (pickled batches) | 50,000 + 10,000, 32 px | 0.2 GiB |
| cifar100 | cifar-100-python.tar.gz (pickled batches) | 50,000 + 10,000, 32 px | 0.2 GiB |
| clrs25 | CLRS/<class>/*.tif (a folder) | 15,000 in 25, 256 px | 2.8 GiB |
| domainnet | domainnet/: 6 `<domain>.zip`, 12 `<domain>_<split>.txt` | 409,832 + 176,743 | 17 GiB |
| imagenet_a | imagenet-a/{train,test}/<wnid>/*.jpg (a folder) | 5,981 + 1,519 in 200 | 0.7 GiB |
| objectnet | objectnet/{train,test}/<class>/*.jpg | 26,509 + 6,628 in 200 | 8.0 GiB |
| omnibenchmark | omnibenchmark/{train,test}/<class>/*.jpg | 89,697 + 5,985 in 300 | 6.7 GiB |
| vtab | vtab-cil/vtab/{train,test}/<class>/*.jpg | 1,796 + 8,619 in 50 | 0.5 GiB |

plus `OUT/<first file>.checksums.tsv` (every file of the dataset) for `prepare --checksums`
(none for CLRS25, which has no published digest). The images are random noise (JPEGs whose
sizes vary around the real archives' mean; noise does not compress, so a gzip is as large as
the real one; CLRS's uncompressed 256 px TIFFs); the wnids are 200 of TFDS's 1000 ImageNet
label names, the Food-101 classes TFDS's, CUB's `<nnn>.<Name>` folders with 58-60 images each
and a PNG mask per image in `segmentations/`, CIFAR's batches as tests/fake_archives.py writes
them, CLRS's 25 scene classes of 600. DomainNet's lists have the real line count of each domain and
split (`aepg_jax.prepare.domainnet.COUNTS`; the classes equally filled, TFDS's 345 names and
label ids) and its zips (stored, not deflated: JPEG and PNG do not compress) hold
`<domain>/<class>/<domain>_<label>_<i>.jpg` (quickdraw: `<id>.png`); to keep generation fast
their bytes come from a pool of 2,000 distinct images per domain, reused from member to member:
noise JPEGs whose side is set so that the zip's mean member size is the real one (clipart
1.2 GiB, infograph 4.0, painting 3.4, real 5.6, sketch 2.5 GiB in all), quickdraw's 255 px
grayscale PNG line drawings (about 0.4 GiB, 2-4 KB each as the real ones);
`OUT/domainnet.checksums.tsv` covers the 18 files. PILOT's four folders have their real
train/test counts spread evenly over their classes (ImageNet-A's folders 200 ImageNet wnids);
PILOT does not publish the folders' sizes: theirs are estimates (ImageNet-A's from its original
7,500 images in 0.66 GiB; ObjectNet's photos kept near 500 px; OmniBenchmark's and VTAB's web
and benchmark images near ImageNet-R's and 200 px). Each output is written under `<name>.tmp`
and renamed when complete; `--scale` shrinks the example counts per class (to no fewer than 4;
DomainNet's lines per list, to no fewer than one per class; PILOT's images per split, to no
fewer than one per class) and
`make(..., classes=N)` keeps the first N classes (tiny archives for the tests).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tarfile
import time
import zipfile

import numpy as np
from PIL import Image, ImageDraw

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import fake_archives  # the official member layouts the prepare tests use

from aepg_jax.prepare import archives, domainnet

# name -> (files, examples per class, side range in px, JPEG quality): the mean member size
# lands near the real archive's (ImageNet-R 2.0 GiB / 30,000; Food-101 4.7 GiB / 101,000;
# CUB 1.1 GiB / 11,788). CIFAR's counts are per split (train, test); CLRS's images are 256 px.
LAYOUTS = {
    "imagenet_r": (("imagenet-r.tar",), 150, (210, 290), 95),
    "food101": (("food-101.tar.gz",), 1000, (180, 220), 95),
    "caltech_birds2011": (("CUB_200_2011.tgz", "segmentations.tgz"), 60, (240, 320), 95),
    "cifar10": (("cifar-10-python.tar.gz",), (50000, 10000), (32, 32), None),
    "cifar100": (("cifar-100-python.tar.gz",), (50000, 10000), (32, 32), None),
    "clrs25": (("CLRS",), 600, (256, 256), None),
    "domainnet": (("domainnet",), None, None, 95),  # counts: domainnet.COUNTS, sizes below
    # PILOT's folders: (train, test) images in all; the sides give ~94 / 255 / 74 / 48 KiB JPEGs
    "imagenet_a": (("imagenet-a",), (5_981, 1_519), (250, 310), 95),
    "objectnet": (("objectnet",), (26_509, 6_628), (420, 520), 95),
    "omnibenchmark": (("omnibenchmark",), (89_697, 5_985), (210, 290), 95),
    "vtab": (("vtab-cil",), (1_796, 8_619), (170, 230), 95),
}
PILOT = ("imagenet_a", "objectnet", "omnibenchmark", "vtab")
PILOT_CLASSES = {"imagenet_a": 200, "objectnet": 200, "omnibenchmark": 300, "vtab": 50}
# DomainNet: each domain zip's real size in GiB, which sets its images' mean size.
DOMAINNET_GIB = {
    "clipart": 1.2,
    "infograph": 4.0,
    "painting": 3.4,
    "quickdraw": 0.44,
    "real": 5.6,
    "sketch": 2.5,
}
DOMAINNET_POOL = 2000  # distinct images per domain
CLRS_CLASSES = (
    "airport bare-land beach bridge commercial desert farmland forest golf-course highway "
    "industrial meadow mountain overpass park parking playground port railway railway-station "
    "residential river runway stadium storage-tank"
).split()


def _labels(name: str) -> list[str]:
    import tensorflow_datasets as tfds

    if name == "imagenet_r":
        from tensorflow_datasets.datasets.imagenet2012 import imagenet_common

        names = imagenet_common.label_names_file().read_text().split()
        return names[::5][:200]
    if name == "caltech_birds2011":
        return [f"{c + 1:03d}.Bird_{c + 1:03d}" for c in range(200)]
    if name == "clrs25":
        return list(CLRS_CLASSES)
    if name in PILOT:
        if name == "imagenet_a":
            return _labels("imagenet_r")  # 200 ImageNet wnids, as ImageNet-A's folders
        return fake_archives.pilot_class_names(PILOT_CLASSES[name])
    if name == "domainnet":
        return list(domainnet.CLASS_NAMES)
    return (tfds.core.tfds_path() / "image_classification/food-101_classes.txt").read_text().split()


def _sides(rng: np.random.Generator, sides: tuple[int, int]) -> tuple[int, int]:
    h, w = (int(v) for v in rng.integers(sides[0], sides[1] + 1, 2))
    return h, w


def _jpeg(rng: np.random.Generator, shape: tuple[int, int], quality: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (*shape, 3), dtype=np.uint8)).save(
        buffer, "jpeg", quality=quality
    )
    return buffer.getvalue()


def _mask(shape: tuple[int, int]) -> bytes:
    """A bird-shaped blob: CUB's masks are 8-bit PNGs of the image's size, mostly 0 / 255."""
    h, w = shape
    img = Image.new("L", (w, h))
    ImageDraw.Draw(img).ellipse((w // 6, h // 5, 5 * w // 6, 4 * h // 5), fill=255)
    buffer = io.BytesIO()
    img.save(buffer, "png")
    return buffer.getvalue()


_add = fake_archives._add  # one member of `data` bytes, mtime 0


def _open(path: str) -> tarfile.TarFile:
    if path.endswith((".gz", ".tgz")):
        return tarfile.open(path, "w:gz", compresslevel=1)
    return tarfile.open(path, "w")


def _progress(what: str, n: int, start: float) -> None:
    print(f"\r{what}: {n} images, {time.time() - start:.0f} s", end="", flush=True)


def _imagenet_r_or_food(name, tmp, labels, per_class, sides, quality, rng) -> int:
    n, start = 0, time.time()
    train: dict[str, list[str]] = {}
    test: dict[str, list[str]] = {}
    with _open(tmp[0]) as tar:
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
                _add(tar, member, _jpeg(rng, _sides(rng, sides), quality))
                n += 1
            _progress(name, n, start)
        if name == "food101":
            _add(tar, "food-101/meta/classes.txt", "\n".join(labels).encode())
            _add(tar, "food-101/meta/train.json", json.dumps(train).encode())
            _add(tar, "food-101/meta/test.json", json.dumps(test).encode())
        else:
            _add(tar, "imagenet-r/README.txt", b"synthetic ImageNet-R rehearsal archive")
    return n


def _cub(name, tmp, labels, per_class, sides, quality, rng) -> int:
    """CUB_200_2011/images/<nnn>.<Name>/<Name>_<i>_<c>.jpg with its three text files, and the
    masks `segmentations/<nnn>.<Name>/<same stem>.png`. Of 200 x 60, the first 106 classes
    hold 58 (11,788 in all, as the real set); the first 30 of each class (29 in the first 6)
    are train: 5,994 train, 5,794 test, as the real split."""
    full = per_class == 60  # the real counts; scaled down: half of each class is train
    names, split, boxes = [], [], []
    n, start = 0, time.time()
    with _open(tmp[0]) as tar, _open(tmp[1]) as masks:
        _add(tar, "attributes.txt", b"1 has_bill_shape::curved_(up_or_down)\n")
        for c, label in enumerate(labels):
            count = per_class - 2 if full and c < 106 else per_class
            train = (29 if c < 6 else 30) if full else count // 2
            for i in range(count):
                stem = f"{label.split('.')[1]}_{i:04d}_{c}"
                shape = _sides(rng, sides)
                _add(tar, f"CUB_200_2011/images/{label}/{stem}.jpg", _jpeg(rng, shape, quality))
                _add(masks, f"segmentations/{label}/{stem}.png", _mask(shape))
                n += 1
                names.append(f"{n} {label}/{stem}.jpg")
                split.append(f"{n} {int(i < train)}")
                h, w = shape
                boxes.append(f"{n} {w / 6:.1f} {h / 5:.1f} {2 * w / 3:.1f} {3 * h / 5:.1f}")
            _progress(name, n, start)
        for member, lines in (
            ("images.txt", names),
            ("train_test_split.txt", split),
            ("bounding_boxes.txt", boxes),
            ("classes.txt", [f"{c + 1} {label}" for c, label in enumerate(labels)]),
        ):
            _add(tar, f"CUB_200_2011/{member}", ("\n".join(lines) + "\n").encode())
    return n


def _cifar(name, tmp, labels, per_split, sides, quality, rng) -> int:
    """tests/fake_archives.py's python tarball at the real split sizes, under the tmp name."""
    staging = f"{tmp[0]}.d"
    os.makedirs(staging, exist_ok=True)
    (written,) = fake_archives.make_cifar(
        staging, name, "python", (("train", per_split[0]), ("test", per_split[1]))
    )
    os.replace(written, tmp[0])
    os.rmdir(staging)
    return sum(per_split)


def _clrs(name, tmp, labels, per_class, sides, quality, rng) -> int:
    """CLRS/<class>/<class>_<i>.tif: uncompressed 256 px RGB TIFFs (192 KiB each)."""
    shutil.rmtree(tmp[0], ignore_errors=True)
    n, start = 0, time.time()
    for label in labels:
        os.makedirs(os.path.join(tmp[0], label))
        for i in range(per_class):
            pixels = rng.integers(0, 256, (*sides, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(os.path.join(tmp[0], label, f"{label}_{i:04d}.tif"))
            n += 1
        _progress(name, n, start)
    return n


def _drawing(rng: np.random.Generator) -> bytes:
    """A quickdraw-like 255 px grayscale PNG: a few black strokes on white."""
    img = Image.new("L", (255, 255), 255)
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(4, 10))):
        draw.line([tuple(int(v) for v in rng.integers(0, 255, 2)) for _ in range(3)], 0, 3)
    buffer = io.BytesIO()
    img.save(buffer, "png")
    return buffer.getvalue()


def _domainnet(name, tmp, labels, scale, sides, quality, rng) -> int:
    """tmp[0]/<domain>.zip and <domain>_{train,test}.txt for the six domains: each list has
    `round(real lines * scale)` lines (at least one per class of `labels`, the first classes of
    TFDS's 345), the classes filled in turn; the images drawn from a pool (module docstring)."""
    shutil.rmtree(tmp[0], ignore_errors=True)
    os.makedirs(tmp[0])
    index = {label: k for k, label in enumerate(domainnet.CLASS_NAMES)}
    n, start = 0, time.time()
    for domain in domainnet.DOMAINS:
        counts = {
            split: max(len(labels), round(real * scale))
            for split, real in zip(domainnet.SPLITS, domainnet.COUNTS[domain], strict=True)
        }
        total = sum(counts.values())
        if domain == "quickdraw":
            pool = [_drawing(rng) for _ in range(min(DOMAINNET_POOL, total))]
        else:  # noise JPEG: ~1.2 bytes per pixel at quality 95
            side = (DOMAINNET_GIB[domain] * 2**30 / sum(domainnet.COUNTS[domain]) / 1.2) ** 0.5
            sides = (round(0.85 * side), round(1.15 * side))
            pool = [
                _jpeg(rng, _sides(rng, sides), quality) for _ in range(min(DOMAINNET_POOL, total))
            ]
        seen = dict.fromkeys(labels, 0)
        path = os.path.join(tmp[0], domainnet.zip_name(domain))
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            for split, count in counts.items():
                lines = []
                for i in range(count):
                    label = labels[i % len(labels)]
                    k = seen[label]
                    seen[label] += 1
                    if domain == "quickdraw":
                        member = f"{domain}/{label}/{4_500_000_000 + 1000 * index[label] + k}.png"
                    else:
                        member = f"{domain}/{label}/{domain}_{index[label]:03d}_{k:06d}.jpg"
                    zf.writestr(zipfile.ZipInfo(member), pool[n % len(pool)])
                    lines.append(f"{member} {index[label]}\n")
                    n += 1
                with open(os.path.join(tmp[0], domainnet.list_name(domain, split)), "w") as f:
                    f.writelines(lines)
                _progress(name, n, start)
    return n


def spread(n: int, classes: int) -> list[int]:
    """`n` images over `classes` as evenly as can be (the first `n % classes` one more), at
    least one each."""
    return [max(1, n // classes + (c < n % classes)) for c in range(classes)]


def _pilot(name, tmp, labels, per_split, sides, quality, rng) -> int:
    """PILOT's `<root>/{train,test}/<class>/img_<i>.jpg` (VTAB's root `vtab-cil/vtab`), each
    split's images spread evenly over the classes (the first ones one more), at least one each."""
    shutil.rmtree(tmp[0], ignore_errors=True)
    root = os.path.join(tmp[0], "vtab") if name == "vtab" else tmp[0]
    counts = {s: spread(n, len(labels)) for s, n in zip(("train", "test"), per_split, strict=True)}
    start = time.time()
    n = fake_archives.write_pilot_folder(
        root, labels, counts, lambda split, c, i: _jpeg(rng, _sides(rng, sides), quality)
    )
    _progress(name, n, start)
    return n


WRITERS = {
    "imagenet_r": _imagenet_r_or_food,
    "food101": _imagenet_r_or_food,
    "caltech_birds2011": _cub,
    "cifar10": _cifar,
    "cifar100": _cifar,
    "clrs25": _clrs,
    "domainnet": _domainnet,
    **dict.fromkeys(PILOT, _pilot),
}


def _size(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def make(name: str, out: str, scale: float = 1.0, seed: int = 0, classes: int | None = None) -> str:
    """Writes the archive(s) of `name` into `out`; returns the first one's path (all kept if
    already there)."""
    files, per_class, sides, quality = LAYOUTS[name]
    os.makedirs(out, exist_ok=True)
    paths = [os.path.join(out, f) for f in files]
    if all(os.path.exists(p) for p in paths):
        print(f"{paths[0]} exists; kept")
        return paths[0]
    if per_class is None:  # DomainNet: the writer scales its lists
        per_class = scale
    elif isinstance(per_class, tuple):  # CIFAR and PILOT's folders: examples per split
        per_class = tuple(max(10, round(k * scale)) for k in per_class)
    else:
        per_class = max(4, round(per_class * scale))
    labels = _labels(name)[:classes] if name not in ("cifar10", "cifar100") else []
    tmp = [f"{p}.tmp" for p in paths]
    start = time.time()
    n = WRITERS[name](name, tmp, labels, per_class, sides, quality, np.random.default_rng(seed))
    for t, p in zip(tmp, paths, strict=True):
        os.replace(t, p)
    # CLRS (a folder) has no published digest to replace; DomainNet's folder holds 18 files.
    listed = [os.path.join(paths[0], f) for f in domainnet.FILES] if name == "domainnet" else paths
    if os.path.isfile(listed[0]):
        with open(f"{paths[0]}.checksums.tsv", "w") as f:
            for p in listed:
                size, sha = archives.digest(p)
                f.write(f"{os.path.basename(p)}\t{size}\t{sha}\n")
    size = sum(_size(p) for p in paths)
    print(f"\n{', '.join(paths)}: {n} images, {size / 2**30:.2f} GiB, {time.time() - start:.0f} s")
    return paths[0]


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
