"""Pretrains a small ViT backbone offline (e.g. on Fashion-MNIST) for `model.init=pretrained`.

The embedded default has no downloadable weights, so it makes its own: the model (without
PEFT) plus one linear head is trained with cross-entropy and Adam for `pretrain.epochs`
epochs, and the backbone is written as an `.npz` with Linen names under `pretrain.cache_dir`,
named by a hash of everything that shapes it (model fields, pretraining settings including
`pretrain.seed`, normalisation). Later runs with the same settings reuse the file
(`augreg.load_backbone` reads it).

Shipped backbones: the package carries the embedded default's backbone in `aepg_jax/assets/`
(made by this module, `scripts/make_shipped_backbone.py` regenerates it), listed in
`assets/backbones.json` with its fingerprint (`file_fingerprint`: sha256 over the arrays' names,
shapes, dtypes and bytes, independent of the zip container). With `pretrain.shipped=True` (the
default) a run whose settings hash to a shipped file's name uses it, so every machine starts from
the same weights and nothing is pretrained; its fingerprint is checked first and a mismatch is an
error (a damaged install: reinstall, or pass `--config.pretrain.shipped=False` to pretrain
locally). Floating-point results of pretraining differ between machines, so a locally
pretrained backbone need not equal the shipped one.

The write is atomic: a killed pretraining leaves no file that would be trusted. With several
processes, all pretrain together (one SPMD program) unless every one finds the file, and each
writes it (hosts need not share `pretrain.cache_dir`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from aepg_jax import losses
from aepg_jax.data import augment, cache, datasets, loader
from aepg_jax.models import partition, vit
from aepg_jax.system import hosts, progress

ASSETS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets")
SHIPPED_MANIFEST = os.path.join(ASSETS_DIR, "backbones.json")
_NOT_IN_KEY = ("cache_dir", "shipped")  # where the file lives, not what it holds


def backbone_name(cfg: ml_collections.ConfigDict) -> str:
    """File name of the pretrained backbone for `cfg` (a hash of what determines it)."""
    key = {
        "model": {k: cfg.model[k] for k in vit.ARCH_FIELDS},
        "pretrain": {k: v for k, v in cfg.pretrain.items() if k not in _NOT_IN_KEY},
        "normalize": cfg.input.normalize,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return f"{cfg.pretrain.dataset}-{cfg.model.hidden_size}x{cfg.model.depth}-{digest}.npz"


def backbone_path(cfg: ml_collections.ConfigDict) -> str:
    """Where a locally pretrained backbone for `cfg` is cached."""
    return os.path.join(os.path.expanduser(cfg.pretrain.cache_dir), backbone_name(cfg))


def file_fingerprint(path: str) -> str:
    """sha256 over an `.npz`'s arrays (sorted names, shapes, dtypes, bytes): equal for equal
    weights whatever the zip container's timestamps."""
    digest = hashlib.sha256()
    with np.load(path) as data:
        for name in sorted(data.files):
            array = np.ascontiguousarray(data[name])
            digest.update(f"{name}:{array.shape}:{array.dtype.str}".encode())
            digest.update(array.tobytes())
    return digest.hexdigest()


def shipped_manifest() -> dict[str, dict]:
    """`assets/backbones.json`: {file name: {"sha256": file_fingerprint, ...}}."""
    if not os.path.exists(SHIPPED_MANIFEST):
        return {}
    with open(SHIPPED_MANIFEST) as f:
        return json.load(f)


def shipped_backbone(cfg: ml_collections.ConfigDict) -> str | None:
    """The package's backbone for `cfg`'s settings, fingerprint checked, or None when none is
    shipped for them (or `pretrain.shipped=False`). Raises ValueError on a mismatch."""
    name = backbone_name(cfg)
    entry = shipped_manifest().get(name)
    if not cfg.pretrain.get("shipped", True) or entry is None:
        return None
    path = os.path.join(ASSETS_DIR, name)
    found = file_fingerprint(path) if os.path.exists(path) else "no file"
    if found != entry["sha256"]:
        raise ValueError(
            f"The shipped backbone {path} does not match its fingerprint in {SHIPPED_MANIFEST} "
            f"({found[:16]} != {entry['sha256'][:16]}): the installation is damaged. Reinstall "
            "the package, or pass --config.pretrain.shipped=False to pretrain one locally."
        )
    return path


def pretrain_backbone(cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> str:
    """Path of the pretrained backbone `.npz`: the shipped one for these settings, else the
    cached one, training it first if it is not cached."""
    shipped = shipped_backbone(cfg)
    if shipped is not None:
        logging.info("Using the shipped pretrained backbone %s.", shipped)
        return shipped
    path = backbone_path(cfg)
    # Every process must take the same branch, else their collectives would not match.
    if hosts.everywhere(os.path.exists(path)):
        logging.info("Using the cached pretrained backbone %s.", path)
        return path
    start = time.time()
    p = cfg.pretrain
    ds = datasets.load_dataset(p.dataset, data_dir=p.data_dir, split_seed=cfg.data.split_seed)
    size = cfg.model.image_size
    root = os.path.expanduser(cfg.data.cache_dir)
    train = cache.load_or_build(ds.train, root, ds.name, "train", size)
    test = cache.load_or_build(ds.test, root, ds.name, "test", size)

    model_cfg = ml_collections.ConfigDict(cfg.model.to_dict())
    model_cfg.peft.kind = "none"
    model_cfg.dtype = "float32"  # pretraining in float32, whatever the fine-tuning compute dtype
    num_classes = len(ds.class_names)
    model = vit.build(model_cfg, (num_classes,))
    key = jax.random.PRNGKey(cfg.pretrain.seed)
    params = vit.init_params(model_cfg, jax.random.fold_in(key, 1), (num_classes,))
    optimizer = optax.adam(p.learning_rate)
    opt_state = optimizer.init(params)
    normalize = cfg.input.normalize

    @jax.jit
    def step(params, opt_state, batch, step_key):
        x = augment.train_augment(
            step_key,
            batch["image"],
            size,
            scale=(0.6, 1.0),
            flip_prob=0.0,
            normalize_mode=normalize,
        )

        def loss_fn(prm):
            logits, _ = model.apply({"params": prm}, x)
            return jnp.mean(losses.cross_entropy(logits, batch["label"]))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    @jax.jit
    def correct(params, batch):
        x = augment.test_transform(batch["image"], size, normalize)
        logits, _ = model.apply({"params": params}, x)
        return jnp.sum((jnp.argmax(logits, -1) == batch["label"]) & batch["mask"])

    batch_size = p.batch_size
    steps = loader.num_batches(len(train), batch_size, drop_last=True) * p.epochs
    bar = progress.bar(
        steps, desc=f"pretraining on {ds.name}", unit="step", disable=not hosts.is_main()
    )
    loss = jnp.nan
    for epoch in range(p.epochs):
        for i, batch in enumerate(
            loader.iterate(
                train.images,
                train.labels,
                np.arange(len(train)),
                batch_size,
                mesh,
                train=True,
                seed=p.seed,
                epoch=epoch,
            )
        ):
            step_key = jax.random.fold_in(key, epoch * 1_000_000 + i)
            params, opt_state, loss = step(params, opt_state, batch, step_key)
            if epoch == 0 and i == 0:  # compiled: the bar's clock starts now
                jax.block_until_ready(loss)
                progress.started(bar, 1)
            else:
                bar.update(1)
            progress.at(pretraining=f"step {bar.n}/{steps}")
            if i % 50 == 0:
                bar.set_postfix(loss=f"{float(loss):.3f}")
    bar.close()
    if not np.isfinite(float(loss)):
        raise FloatingPointError(f"Pretraining on {ds.name} diverged (loss {float(loss)}).")
    accuracy = _accuracy(correct, params, test, batch_size, mesh)
    logging.info(
        "Pretrained on %s: test accuracy %.4f in %.0f s.", ds.name, accuracy, time.time() - start
    )
    if hosts.is_main():
        print(
            f"pretrained backbone on {ds.name}: test accuracy {100 * accuracy:.1f}% "
            f"({time.time() - start:.0f} s) -> {path}"
        )
    check_above_chance(accuracy, num_classes, ds.name)
    _save_backbone(
        path, params, {"dataset": ds.name, "test_accuracy": accuracy, "epochs": p.epochs}
    )
    return path


def _accuracy(correct, params, split: cache.CachedSplit, batch_size: int, mesh) -> float:
    """Fraction of `split` that `correct(params, batch)` counts as right."""
    rows = np.arange(len(split))
    batches = loader.iterate(split.images, split.labels, rows, batch_size, mesh, train=False)
    return sum(int(correct(params, b)) for b in batches) / len(split)


def check_above_chance(accuracy: float, num_classes: int, dataset: str) -> None:
    """Refuses a backbone whose test accuracy is within 1.5x of chance (1 / classes): it did
    not learn, and caching it would spoil every later run that reuses it."""
    chance = 1.0 / num_classes
    if accuracy < 1.5 * chance:
        raise ValueError(
            f"Pretraining on {dataset} reached {100 * accuracy:.1f}% test accuracy, chance is "
            f"{100 * chance:.1f}%: the backbone is not cached. Check pretrain.learning_rate "
            "and pretrain.epochs."
        )


def _save_backbone(path: str, params: dict, info: dict) -> None:
    """Writes the backbone leaves as an `.npz` (atomically) and `info` beside it as JSON."""
    backbone, _ = partition.split(params, partition.label_params(params), (partition.BACKBONE,))
    flat = {name: np.asarray(leaf) for name, leaf in partition.named_leaves(backbone).items()}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"  # other processes may write the same file
    with open(tmp, "wb") as f:
        np.savez(f, **flat)
    os.replace(tmp, path)
    info_tmp = f"{path[:-4]}.{os.getpid()}.json.tmp"
    with open(info_tmp, "w") as f:
        json.dump(info, f)
    os.replace(info_tmp, f"{path[:-4]}.json")
