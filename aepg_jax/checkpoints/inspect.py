"""Prints what a ViT checkpoint (augreg `.npz`, timm `.safetensors`) holds and whether it loads.

    python -m aepg_jax.checkpoints.inspect FILE|hf-hub:timm/<model> [--image-size 224]
        [--all-keys] [--num-heads H] [--family vit|dinov2|clip]
    python -m aepg_jax.checkpoints.inspect FILE --family=NAME --features=IMAGES.npy
        [--save=OUT.npy]

Exit status 0 when the file loads (backbone complete, shapes fit), 1 when it does not, with the
converter's error message. The family is read from the file's names (a pre-norm without patch
bias: clip; layer scales: dinov2; else vit); `--family` states it, and a file of another family
is refused.

`--features`: the backbone's pre-logits features for the images of IMAGES.npy, (N, H, W, 3)
float32 already normalised as the weights expect (nothing is normalised here; docs/data.md
gives each published backbone's mean and std), image size H = W from the images (the position
embedding resized to it): the final-norm class token, what timm's
`forward_head(forward_features(x), pre_logits=True)` returns. Printed as a summary; `--save`
writes them, (N, D) float32. The check to run after a download: compare with timm's features
of the same images.
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import ml_collections
import numpy as np

from aepg_jax.checkpoints import augreg, catalog, timm, weights
from aepg_jax.models import vit


def _describe(flat: dict[str, np.ndarray], all_keys: bool) -> list[str]:
    lines = []
    for key in sorted(flat):
        block = augreg.BLOCK_KEY.match(key)
        if all_keys or not block or block.group(1) == "Transformer/encoderblock_0/":
            lines.append(f"  {key:<70} {flat[key].shape!s:<18} {flat[key].dtype}")
    if not all_keys:
        lines.append("  (blocks 1.. have block 0's keys; --all-keys lists them)")
    return lines


def _npz_summary(path: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[str]]:
    """`(raw arrays, Linen-named arrays, report lines)` of an augreg `.npz`."""
    raw = augreg.read_npz(path)
    stripped = augreg.strip_container_prefix(raw)
    prefix = next(
        (p for p in augreg.CONTAINER_PREFIXES if raw and all(k.startswith(p) for k in raw)),
        None,
    )
    ignored = sorted(k for k in stripped if k.startswith(augreg.IGNORED_PREFIXES))
    naming = "pre-Linen (renamed on load)" if augreg.is_pre_linen(stripped) else "Linen"
    lines = [
        "format:      augreg npz",
        f"container:   {prefix or 'none'}",
        f"naming:      {naming}",
        f"ignored:     {', '.join(ignored) or 'none'}",
    ]
    return raw, augreg.to_linen_names(raw), lines


def _safetensors_summary(
    path: str, num_heads: int | None
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[str]]:
    """The same for a timm `.safetensors` (qkv split into `num_heads`, default width / 64)."""
    raw = timm.read_safetensors(path)
    width = raw["cls_token"].shape[-1] if "cls_token" in raw else 64
    heads = num_heads or max(1, width // 64)
    ignored = sorted(k for k in raw if k.startswith("head."))
    lines = [
        "format:      timm safetensors",
        f"metadata:    {timm.metadata(path) or 'none'}",
        f"naming:      timm (renamed on load; fused qkv split into {heads} heads)",
        f"ignored:     {', '.join(ignored) or 'none'}",
    ]
    return raw, timm.to_linen(raw, heads), lines


def _heads(path: str, num_heads: int | None) -> int:
    """`num_heads`, else the width / 64 of timm's ViTs (a timm file does not hold it)."""
    if num_heads:
        return num_heads
    if timm.is_safetensors(path):
        shapes = timm.safetensor_shapes(path)
        return max(1, shapes["cls_token"][-1] // 64) if "cls_token" in shapes else 1
    return 1  # an augreg .npz holds its head split


def model_of(
    path: str, family: str | None, num_heads: int | None, image_size: int | None = None
) -> tuple[ml_collections.ConfigDict, dict[str, np.ndarray]]:
    """`(model config, Linen-named arrays)` of the file: architecture and family read from it
    (`family` None) or checked against `family` (another is refused in one line)."""
    linen = weights.read_linen(path, _heads(path, num_heads))
    fields = augreg.fields_of(linen)
    held, evidence = catalog.family_of_names(linen)
    if family is not None and family != held:
        raise augreg.CheckpointError(
            f"--family={family}: {path} holds a {held}-family ViT ({evidence}); pass "
            f"--family={held}."
        )
    cfg = vit.model_config("vit_b16", **fields, family=held)
    if image_size:
        cfg.image_size = image_size
    return cfg, linen


def features(
    path: str, images: np.ndarray, family: str | None = None, num_heads: int | None = None
) -> np.ndarray:
    """The pre-logits features (N, D) of the backbone in `path` for normalised images
    (N, S, S, C) float32 (the position embedding resized to S / patch)."""
    if images.ndim != 4 or images.shape[1] != images.shape[2]:
        raise augreg.CheckpointError(
            f"--features: images of shape {images.shape}; give (N, S, S, C) square images."
        )
    cfg, _ = model_of(path, family, num_heads, images.shape[1])
    cfg.num_channels = images.shape[3]
    if cfg.image_size % cfg.patch_size:
        raise augreg.CheckpointError(
            f"--features: image size {cfg.image_size} is not a multiple of the patch size "
            f"{cfg.patch_size}."
        )
    shapes = jax.eval_shape(lambda: vit.init_params(cfg, jax.random.key(0)))
    params = weights.load_backbone(path, jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes))
    _, out = jax.jit(vit.build(cfg).apply)({"params": params}, np.asarray(images, np.float32))
    return np.asarray(out["features"])


def inspect_file(
    path: str,
    image_size: int | None,
    all_keys: bool,
    num_heads: int | None = None,
    family: str | None = None,
) -> tuple[bool, str]:
    """`(loads, report)` for the checkpoint at `path` (an augreg `.npz` or timm `.safetensors`)."""
    if timm.is_safetensors(path):
        raw, linen, lines = _safetensors_summary(path, num_heads)
    else:
        raw, linen, lines = _npz_summary(path)
    n_params = sum(int(v.size) for v in raw.values())
    report = [
        f"file:        {path} ({os.path.getsize(path) / 2**20:.1f} MiB)",
        f"arrays:      {len(raw)}, {n_params:,} scalars",
        *lines,
    ]
    try:
        fields = augreg.fields_of(linen)
    except augreg.CheckpointError as err:
        return False, "\n".join([*report, f"loads:       NO: {err}"])
    preset = next(
        (
            name
            for name, p in vit.PRESETS.items()
            if all(p[k] == fields[k] for k in p if k != "image_size")
        ),
        None,
    )
    held, evidence = catalog.family_of_names(linen)
    report.append("architecture: " + ", ".join(f"{k}={v}" for k, v in fields.items()))
    report.append(f"family:      {held} ({evidence}; model.family={held})")
    if family is not None and family != held:
        return False, "\n".join(
            [*report, f"loads:       NO: --family={family}, the file is {held}"]
        )
    report.append(f"preset:      {preset or 'none (use model_config overrides)'}")
    report += ["keys (Linen names):", *_describe(linen, all_keys)]
    cfg = vit.model_config(preset or "vit_b16", **fields, family=held)
    if image_size:
        cfg.image_size = image_size
    try:
        shapes = jax.eval_shape(lambda: vit.init_params(cfg, jax.random.key(0)))
        params = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)
        weights.load_backbone(path, params)
    except (augreg.CheckpointError, ValueError) as err:
        return False, "\n".join([*report, f"loads:       NO: {err}"])
    report.append(f"loads:       yes, into a ViT at image_size={cfg.image_size}")
    return True, "\n".join(report)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m aepg_jax.checkpoints.inspect",
        description=__doc__.splitlines()[0] + " Exit status 0: it loads; 1: it does not.",
    )
    parser.add_argument("file", help="a ViT .npz or timm .safetensors file, or an hf-hub: id")
    parser.add_argument(
        "--image-size",
        type=int,
        default=None,
        help="check loading at this image size (resizes the position embedding)",
    )
    parser.add_argument("--all-keys", action="store_true", help="list every block's keys")
    parser.add_argument(
        "--num-heads",
        type=int,
        default=None,
        help="heads to split a timm file's fused qkv into (default: width / 64, as timm's ViTs)",
    )
    parser.add_argument(
        "--family",
        choices=tuple(vit.FAMILIES),
        default=None,
        help="the model family the file must be (default: read from the file's names)",
    )
    parser.add_argument(
        "--features",
        default=None,
        metavar="IMAGES.npy",
        help="print the pre-logits features of these (N, H, W, 3) float32 normalised images",
    )
    parser.add_argument(
        "--save", default=None, metavar="OUT.npy", help="with --features: write them (N, D)"
    )
    args = parser.parse_args(argv)
    if args.save and not args.features:
        parser.error("--save needs --features=IMAGES.npy")
    try:
        path = weights.local_path(args.file)
        if args.features:
            return _features_main(path, args)
        ok, report = inspect_file(path, args.image_size, args.all_keys, args.num_heads, args.family)
    except augreg.CheckpointError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(report)
    return 0 if ok else 1


def _features_main(path: str, args: argparse.Namespace) -> int:
    try:
        images = np.load(args.features, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise augreg.CheckpointError(
            f"--features={args.features} is not a readable .npy file ({err})."
        ) from err
    feats = features(path, images.astype(np.float32), args.family, args.num_heads)
    norms = np.linalg.norm(feats, axis=-1)
    print(
        f"features: {feats.shape} float32 from {path}; mean {feats.mean():.6g}, std "
        f"{feats.std():.6g}, row norms {norms.min():.6g}..{norms.max():.6g}"
    )
    if args.save:
        np.save(args.save, feats)
        print(f"saved {args.save}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
