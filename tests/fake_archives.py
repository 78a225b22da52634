"""Tiny archives with the official member layouts of each dataset (few classes, 8-16 px).

Each `make_<name>(dir)` writes the archive(s) under the official file name(s) and returns
their paths; `checksums_tsv(paths, out)` writes the `--checksums` file that makes
`aepg_jax.prepare` accept them (the official digests are those of the real files).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import tarfile
import zipfile

import numpy as np
from PIL import Image

# ImageNet-R wnids (ids 1 and 6 of the 1000 ImageNet classes); CUB classes 1 and 101 land in
# different tasks of a 2-task split of 200; Food-101 classes 0 and 100 likewise of 101.
IMAGENET_R_CLASSES = ("n01443537", "n01833805")
CUB_CLASSES = ("001.Black_footed_Albatross", "101.White_Pelican")
FOOD_CLASSES = ("apple_pie", "waffles")


def _encode(seed: int, fmt: str, size: int = 12, mode: str = "RGB") -> bytes:
    rng = np.random.default_rng(seed)
    shape = (size, size + 2, 3) if mode == "RGB" else (size, size + 2)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(buffer, fmt)
    return buffer.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def _tar(path: str, members: dict[str, bytes]) -> str:
    mode = "w" if path.endswith(".tar") else "w:gz"
    with tarfile.open(path, mode) as tar:
        for name, data in members.items():
            _add(tar, name, data)
    return path


def make_imagenet_r(directory, per_class: int = 7) -> list[str]:
    """7 per class: TFDS's key-hash order then puts both classes in `test[80%:]` (3 images),
    so each task of a 2-task run has test examples."""
    members = {"imagenet-r/README.txt": b"renditions"}  # top-level file: not an example
    for c, wnid in enumerate(IMAGENET_R_CLASSES):
        for i in range(per_class):
            members[f"imagenet-r/{wnid}/{['art', 'cartoon'][i % 2]}_{i}.jpg"] = _encode(
                10 * c + i, "jpeg"
            )
    members[f"imagenet-r/{IMAGENET_R_CLASSES[0]}/._hidden.jpg"] = b"macOS junk"  # TFDS skips
    return [_tar(os.path.join(directory, "imagenet-r.tar"), members)]


def make_food101(directory, per_class: int = 4) -> list[str]:
    train, test, images = {}, {}, {}
    for c, label in enumerate(FOOD_CLASSES):
        ids = [f"{label}/{1000 + 7 * i}" for i in range(per_class)]
        train[label], test[label] = ids[:-1], ids[-1:]
        for i, image_id in enumerate(ids):
            images[f"food-101/images/{image_id}.jpg"] = _encode(100 + 10 * c + i, "jpeg")
    members = {
        **images,  # images before meta, as a streamed archive may put them
        "food-101/meta/classes.txt": "\n".join(FOOD_CLASSES).encode(),
        "food-101/meta/train.json": json.dumps(train).encode(),
        "food-101/meta/test.json": json.dumps(test).encode(),
    }
    return [_tar(os.path.join(directory, "food-101.tar.gz"), members)]


def make_cub(directory, per_class: int = 4) -> list[str]:
    images, masks, names, split, boxes = {}, {}, [], [], []
    for c, cls in enumerate(CUB_CLASSES):
        for i in range(per_class):
            stem = f"{cls.split('.')[1]}_{i:04d}_{c}"
            rel = f"{cls}/{stem}.jpg"
            images[f"CUB_200_2011/images/{rel}"] = _encode(200 + 10 * c + i, "jpeg")
            masks[f"segmentations/{cls}/{stem}.png"] = _encode(300 + i, "png", mode="L")
            n = len(names) + 1
            names.append(f"{n} {rel}")
            split.append(f"{n} {int(i < per_class - 1)}")
            boxes.append(f"{n} 1.0 2.0 5.0 6.0")
    text = {
        "CUB_200_2011/images.txt": names,
        "CUB_200_2011/train_test_split.txt": split,
        "CUB_200_2011/bounding_boxes.txt": boxes,
    }
    members = {"attributes.txt": b"1 has_bill_shape::curved"}
    members.update(images)
    members.update({k: ("\n".join(v) + "\n").encode() for k, v in text.items()})
    return [
        _tar(os.path.join(directory, "CUB_200_2011.tgz"), members),
        _tar(os.path.join(directory, "segmentations.tgz"), masks),
    ]


def cifar_arrays(name: str, sizes=(("train", 20), ("test", 8))) -> dict:
    """Images (N, 3072) CHW-flat uint8 and labels per split; cifar100 has (coarse, fine)."""
    rng = np.random.default_rng(7)
    out = {}
    for split, n in sizes:
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        fine = rng.integers(0, 10 if name == "cifar10" else 100, n)
        out[split] = (data, fine, fine // 5)
    return out


def make_cifar(
    directory, name: str = "cifar10", fmt: str = "python", sizes=(("train", 20), ("test", 8))
) -> list[str]:
    """The official tarball of `name` in `fmt` (python | binary); `sizes`: examples per split
    (50,000 / 10,000 in the real ones, benchmarks/make_synthetic_archives.py)."""
    arrays = cifar_arrays(name, sizes)
    train, test = arrays["train"], arrays["test"]
    ten = name == "cifar10"
    fine_names = [f"class{i}" for i in range(10 if ten else 100)]
    members = {}
    if fmt == "python":
        root = "cifar-10-batches-py/" if ten else "cifar-100-python/"

        def batch(data, fine, coarse):
            if ten:
                return pickle.dumps({b"data": data, b"labels": [int(v) for v in fine]}, 2)
            return pickle.dumps(
                {
                    b"data": data,
                    b"fine_labels": [int(v) for v in fine],
                    b"coarse_labels": [int(v) for v in coarse],
                },
                2,
            )

        if ten:  # five training batches
            for i, part in enumerate(np.array_split(np.arange(len(train[0])), 5)):
                members[f"{root}data_batch_{i + 1}"] = batch(*(a[part] for a in train))
            members[f"{root}test_batch"] = batch(*test)
            members[f"{root}batches.meta"] = pickle.dumps(
                {b"label_names": [n.encode() for n in fine_names]}, 2
            )
        else:
            members[f"{root}train"] = batch(*train)
            members[f"{root}test"] = batch(*test)
            members[f"{root}meta"] = pickle.dumps(
                {
                    b"fine_label_names": [n.encode() for n in fine_names],
                    b"coarse_label_names": [f"super{i}".encode() for i in range(20)],
                },
                2,
            )
        filename = f"{'cifar-10' if ten else 'cifar-100'}-python.tar.gz"
    else:
        root = "cifar-10-batches-bin/" if ten else "cifar-100-binary/"

        def records(data, fine, coarse):
            labels = fine[:, None] if ten else np.stack([coarse, fine], 1)
            return np.concatenate([labels.astype(np.uint8), data], 1).tobytes()

        if ten:
            for i, part in enumerate(np.array_split(np.arange(len(train[0])), 5)):
                members[f"{root}data_batch_{i + 1}.bin"] = records(*(a[part] for a in train))
            members[f"{root}test_batch.bin"] = records(*test)
            members[f"{root}batches.meta.txt"] = ("\n".join(fine_names) + "\n").encode()
        else:
            members[f"{root}train.bin"] = records(*train)
            members[f"{root}test.bin"] = records(*test)
            members[f"{root}coarse_label_names.txt"] = "\n".join(
                f"super{i}" for i in range(20)
            ).encode()
            members[f"{root}fine_label_names.txt"] = "\n".join(fine_names).encode()
        filename = f"{'cifar-10' if ten else 'cifar-100'}-binary.tar.gz"
    return [_tar(os.path.join(directory, filename), members)]


def make_clrs(directory, classes: int = 25, per_class: int = 5) -> list[str]:
    root = os.path.join(directory, "CLRS")
    for c in range(classes):
        os.makedirs(os.path.join(root, f"class{c:02d}"))
        for i in range(per_class):
            with open(os.path.join(root, f"class{c:02d}", f"{i}.tif"), "wb") as f:
                f.write(_encode(400 + 10 * c + i, "tiff", size=10))
    return [directory]


# DomainNet label ids 0, 308 and 327 (TFDS's class names, numbered as the release's lists).
DOMAINNET_CLASSES = ("aircraft_carrier", "The_Eiffel_Tower", "t-shirt")
DOMAINNET_DOMAINS = ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")


def make_domainnet(
    directory, classes: dict[str, int] | None = None, train: int = 2, test: int = 1
) -> list[str]:
    """`<domain>.zip` (`<domain>/<class>/<domain>_<c>_<i>.jpg`, quickdraw `<id>.png`, members
    in another order than the lists, deflated) and `<domain>_{train,test}.txt` for the six
    domains, `train` + `test` images per class (domain d has d % 2 more train images of the
    first class); `classes`: name -> label (default: DOMAINNET_CLASSES with their TFDS ids).
    Returns `[directory]`, the `--source`."""
    if classes is None:
        classes = dict(zip(DOMAINNET_CLASSES, (0, 308, 327), strict=True))
    for d, domain in enumerate(DOMAINNET_DOMAINS):
        lines = {"train": [], "test": []}
        members = {}
        for c, (name, label) in enumerate(classes.items()):
            count = train + test + (d % 2 if c == 0 else 0)
            for i in range(count):
                if domain == "quickdraw":
                    member = f"{domain}/{name}/{4_500_000 + 97 * c + i}.png"
                    data = _encode(600 + 100 * d + 10 * c + i, "png", mode="L")
                else:
                    member = f"{domain}/{name}/{domain}_{label:03d}_{i:06d}.jpg"
                    data = _encode(600 + 100 * d + 10 * c + i, "jpeg")
                members[member] = data
                lines["train" if i < count - test else "test"].append(f"{member} {label}")
        with zipfile.ZipFile(os.path.join(directory, f"{domain}.zip"), "w") as zf:
            for member in sorted(members, reverse=True):
                zf.writestr(zipfile.ZipInfo(member), members[member], zipfile.ZIP_DEFLATED)
        for split, listed in lines.items():
            with open(os.path.join(directory, f"{domain}_{split}.txt"), "w", newline="") as f:
                f.write("".join(f"{line}\n" for line in listed))
    return [os.fspath(directory)]


def domainnet_checksums(directory, out) -> str:
    """The `--checksums` TSV of the 18 DomainNet files in `directory`."""
    names = [
        f
        for domain in DOMAINNET_DOMAINS
        for f in (f"{domain}.zip", f"{domain}_train.txt", f"{domain}_test.txt")
    ]
    return checksums_tsv([os.path.join(directory, n) for n in names], out)


# PILOT's folders: the wrapping directories of the unpacked download and the class count.
PILOT_FOLDERS = {
    "imagenet_a": ("imagenet-a", 200),
    "objectnet": ("objectnet", 200),
    "omnibenchmark": ("omnibenchmark", 300),
    "vtab": ("vtab-cil/vtab", 50),
}


def pilot_class_names(classes: int) -> list[str]:
    """Unpadded numbers, so sorted names ("10" < "2") differ from numeric order, as
    `ImageFolder`'s sorted class folders may."""
    return [str(c) for c in range(classes)]


def write_pilot_folder(
    root, class_names, counts: dict[str, list[int]], image=None, fmt: str = "jpeg"
) -> int:
    """`root/{train,test}/<class>/img_<i>.jpg` with `counts[split][c]` images in class c;
    `image(split, c, i) -> bytes` (default: tiny random JPEGs). Returns the image count."""
    image = image or (lambda split, c, i: _encode(1000 * c + 7 * i + len(split), fmt, size=8))
    n = 0
    for split, per_class in counts.items():
        for c, label in enumerate(class_names):
            os.makedirs(os.path.join(root, split, label))
            for i in range(per_class[c]):
                with open(os.path.join(root, split, label, f"img_{i}.jpg"), "wb") as f:
                    f.write(image(split, c, i))
                n += 1
    return n


def make_pilot(directory, name: str, train: int = 2, test: int = 1) -> list[str]:
    """PILOT's unpacked folder of `name` (all its classes, `train`/`test` images each) under its
    wrapping directories, plus a stray top-level file, as an unzipped download holds."""
    wrapper, classes = PILOT_FOLDERS[name]
    root = os.path.join(directory, wrapper)
    counts = {"train": [train] * classes, "test": [test] * classes}
    write_pilot_folder(root, pilot_class_names(classes), counts)
    with open(os.path.join(root, "train", "0", "Thumbs.db"), "wb") as f:
        f.write(b"not an image")  # left out, with a note
    return [directory]


MAKERS = {
    "imagenet_r": make_imagenet_r,
    "food101": make_food101,
    "caltech_birds2011": make_cub,
    "cifar10": lambda d: make_cifar(d, "cifar10"),
    "cifar100": lambda d: make_cifar(d, "cifar100"),
    "clrs25": make_clrs,
    **{name: (lambda d, name=name: make_pilot(d, name)) for name in PILOT_FOLDERS},
}


def checksums_tsv(paths, out) -> str:
    with open(out, "w") as f:
        for path in paths:
            data = open(path, "rb").read()
            name = os.path.basename(path)
            f.write(f"{name}\t{len(data)}\t{hashlib.sha256(data).hexdigest()}\n")
    return os.fspath(out)
