"""Prints what a ViT checkpoint (augreg `.npz`, timm `.safetensors`) holds and whether it loads.

    python -m aepg_jax.checkpoints.inspect FILE|hf-hub:timm/<model> [--image-size 224]
        [--all-keys] [--num-heads H]

Exit status 0 when the file loads (backbone complete, shapes fit), 1 when it does not, with the
converter's error message.
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import numpy as np

from aepg_jax.checkpoints import augreg, timm, weights
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


def inspect_file(
    path: str, image_size: int | None, all_keys: bool, num_heads: int | None = None
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
    report.append("architecture: " + ", ".join(f"{k}={v}" for k, v in fields.items()))
    report.append(f"preset:      {preset or 'none (use model_config overrides)'}")
    report += ["keys (Linen names):", *_describe(linen, all_keys)]
    cfg = vit.model_config(preset or "vit_b16", **{k: v for k, v in fields.items()})
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
    args = parser.parse_args(argv)
    try:
        path = weights.local_path(args.file)
        ok, report = inspect_file(path, args.image_size, args.all_keys, args.num_heads)
    except augreg.CheckpointError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(report)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
