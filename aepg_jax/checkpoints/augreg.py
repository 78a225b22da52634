"""Loads the published ViT `.npz` checkpoints (augreg and the original `ViT-B_16.npz`).

The files hold flat `/`-joined keys in the pre-Linen numbering of google-research/
vision_transformer: inside `Transformer/encoderblock_i`, `MultiHeadDotProductAttention_1`,
`LayerNorm_2` and `MlpBlock_3` are our `MultiHeadDotProductAttention_0`, `LayerNorm_1`,
`MlpBlock_0` (renamed by an explicit table, never by sort order). Keys may sit under a
`params/` or `opt/target/` container prefix (big_vision's top-level `pos_embedding` is
accepted too). `head/*` and `pre_logits/*` are ignored (we train
our own heads); PEFT and head parameters keep their initial values.

The position embedding (1, 1 + g*g, D) is resized bicubically over its g x g grid (cls slot
kept) when the model's image size differs from the file's. Any other missing key, extra key or
shape mismatch raises `CheckpointError` naming it.

    params = vit.init_params(cfg, rng, head_sizes)
    params = augreg.load_backbone("B_16-i21k-300ep-...-res_224.npz", params)
"""

from __future__ import annotations

import math
import os
import re
import zipfile
from typing import Any

import jax
import numpy as np
from flax import traverse_util

from aepg_jax.models import partition

PRE_LINEN_RENAMES = {
    "MultiHeadDotProductAttention_1": "MultiHeadDotProductAttention_0",
    "LayerNorm_2": "LayerNorm_1",
    "MlpBlock_3": "MlpBlock_0",
}
CONTAINER_PREFIXES = ("params/", "opt/target/")
IGNORED_PREFIXES = ("head/", "pre_logits/")
POSEMB = "Transformer/posembed_input/pos_embedding"
# big_vision-saved ViTs (under `params/`) keep the position embedding at the top level.
ALIASES = {"pos_embedding": POSEMB}
BLOCK_KEY = re.compile(r"^(Transformer/encoderblock_\d+/)([^/]+)(/.*)$")


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read or does not fit the model."""


def read_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """All arrays of an `.npz` file, by key; clear errors for a missing or corrupt file."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise CheckpointError(
            f"Checkpoint {path!r} does not exist. Download the augreg file named in docs/data.md "
            '("Pretrained weights") and pass its local path.'
        )
    if not zipfile.is_zipfile(path):  # numpy's own error for this talks of pickled data
        raise CheckpointError(
            f"Checkpoint {path!r} is not a readable .npz file (not a zip archive): pass the "
            "augreg/ViT .npz file; a truncated download also looks like this: download it again."
        )
    try:
        with np.load(path, allow_pickle=False) as data:
            return {key: np.asarray(data[key]) for key in data.files}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as err:
        raise CheckpointError(
            f"Checkpoint {path!r} is not a readable .npz file ({type(err).__name__}: {err}); "
            "it may be truncated or corrupt: download it again."
        ) from err


def strip_container_prefix(flat: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Removes a `params/` or `opt/target/` prefix shared by every key."""
    for prefix in CONTAINER_PREFIXES:
        if flat and all(k.startswith(prefix) for k in flat):
            return {k[len(prefix) :]: v for k, v in flat.items()}
    return flat


def is_pre_linen(flat: dict[str, np.ndarray]) -> bool:
    """True when the block submodules use the pre-Linen numbering (e.g. `MlpBlock_3`)."""
    parts = {m.group(2) for k in flat if (m := BLOCK_KEY.match(k))}
    old, new = parts & set(PRE_LINEN_RENAMES), parts & set(PRE_LINEN_RENAMES.values())
    if old and ({"MultiHeadDotProductAttention_0", "MlpBlock_0"} & new):
        raise CheckpointError(
            f"Checkpoint mixes pre-Linen {sorted(old)} and Linen {sorted(new)} block names."
        )
    return bool(old)


def to_linen_names(flat: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Container prefix stripped, block parts renamed to Linen, head/pre_logits dropped."""
    flat = strip_container_prefix(flat)
    rename = is_pre_linen(flat)
    out = {}
    for key, value in flat.items():
        if key.startswith(IGNORED_PREFIXES):
            continue
        key = ALIASES.get(key, key)
        m = BLOCK_KEY.match(key)
        if rename and m:
            key = m.group(1) + PRE_LINEN_RENAMES.get(m.group(2), m.group(2)) + m.group(3)
        out[key] = value
    return out


def resize_posemb(posemb: np.ndarray, num_tokens: int) -> np.ndarray:
    """(1, 1 + g*g, D) -> (1, num_tokens, D): cls slot kept, grid resized bicubically."""
    _, n, width = posemb.shape
    old_grid, new_grid = math.isqrt(n - 1), math.isqrt(num_tokens - 1)
    if old_grid**2 != n - 1 or new_grid**2 != num_tokens - 1:
        raise CheckpointError(
            f"Cannot resize the position embedding from {n} to {num_tokens} tokens: "
            "both must be 1 + a square number (cls + square patch grid)."
        )
    grid = posemb[0, 1:].reshape(old_grid, old_grid, width)
    resized = jax.image.resize(grid, (new_grid, new_grid, width), method="cubic")
    return np.concatenate([posemb[:, :1], np.asarray(resized).reshape(1, -1, width)], axis=1)


def load_backbone(
    path: str | os.PathLike,
    params: dict[str, Any],
    rules: partition.Rules = partition.DEFAULT_RULES,
) -> dict[str, Any]:
    """`params` with every `backbone` leaf replaced by the checkpoint's value (same dtype).

    Raises `CheckpointError` listing missing keys, extra keys and shape mismatches.
    """
    return fit_backbone(to_linen_names(read_npz(path)), params, os.fspath(path), rules)


def fit_backbone(
    loaded: dict[str, np.ndarray],
    params: dict[str, Any],
    path: str,
    rules: partition.Rules = partition.DEFAULT_RULES,
) -> dict[str, Any]:
    """`params` with every `backbone` leaf replaced by `loaded`'s (Linen names; read from
    `path`, named in errors); the position embedding resized to the model's grid."""
    labels = traverse_util.flatten_dict(partition.label_params(params, rules), sep="/")
    flat = traverse_util.flatten_dict(params, sep="/")
    wanted = {k for k, label in labels.items() if label == partition.BACKBONE}

    missing = sorted(wanted - loaded.keys())
    extra = sorted(loaded.keys() - wanted)
    mismatched = []
    for key in sorted(wanted & loaded.keys()):
        have, want = loaded[key].shape, flat[key].shape
        if have == want:
            continue
        if key == POSEMB and have[0] == 1 and have[2:] == want[2:]:
            loaded[key] = resize_posemb(loaded[key], want[1])
        else:
            mismatched.append(f"{key}: file {have} vs model {want}")
    problems = [
        (f"{len(missing)} missing", missing),
        (f"{len(extra)} unexpected", extra),
        (f"{len(mismatched)} shape mismatch(es)", mismatched),
    ]
    problems = [(title, items) for title, items in problems if items]
    if problems:
        detail = "; ".join(
            f"{title}: {', '.join(items[:8])}" + (" ..." if len(items) > 8 else "")
            for title, items in problems
        )
        raise CheckpointError(
            f"Checkpoint {path!r} does not fit the model ({detail}). Check that the "
            "model config (patch_size, hidden_size, depth, num_heads, mlp_dim) matches the file; "
            "`python -m aepg_jax.checkpoints.inspect FILE` shows what the file holds."
        )
    for key in wanted:
        flat[key] = jax.numpy.asarray(loaded[key], dtype=flat[key].dtype)
    return traverse_util.unflatten_dict(flat, sep="/")


def infer_model_fields(path: str | os.PathLike) -> dict[str, int]:
    """Architecture of a checkpoint from its shapes: patch, width, depth, heads, MLP, image."""
    return fields_of(to_linen_names(read_npz(path)))


def fields_of(flat: dict[str, np.ndarray]) -> dict[str, int]:
    """`infer_model_fields` of arrays under Linen names."""
    try:
        kernel = flat["embedding/kernel"]
        query = flat["Transformer/encoderblock_0/MultiHeadDotProductAttention_0/query/kernel"]
        mlp = flat["Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel"]
        posemb = flat[POSEMB]
    except KeyError as err:
        raise CheckpointError(f"Not a ViT checkpoint: key {err} is missing.") from err
    depth = len({m.group(1) for k in flat if (m := BLOCK_KEY.match(k))})
    grid = math.isqrt(posemb.shape[1] - 1)
    return dict(
        patch_size=int(kernel.shape[0]),
        hidden_size=int(kernel.shape[-1]),
        num_channels=int(kernel.shape[2]),
        depth=depth,
        num_heads=int(query.shape[1]),
        mlp_dim=int(mlp.shape[1]),
        image_size=int(grid * kernel.shape[0]),
    )
