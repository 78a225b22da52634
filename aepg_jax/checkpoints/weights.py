"""`model.checkpoint` in any supported form: an augreg `.npz`, a timm `.safetensors`, or an
`hf-hub:timm/<model>` id (resolved from the local Hugging Face cache); which weights it holds.

    path = weights.local_path(cfg.model.checkpoint)        # hf-hub id -> cached file
    params = weights.load_backbone(path, params)           # either format
    weights.identify(cfg.model.checkpoint, path)           # format, sha256, which weights

Identification: the paper's backbone is ViT-B/16 augreg, in21k pretrained and fine-tuned on
in1k: Google's `AUGREG_FILE` or timm's `vit_base_patch16_224.augreg_in21k_ft_in1k`. timm's
`augreg2_in21k_ft_in1k` (the default of plain `vit_base_patch16_224` in current timm) are other
weights. The tag is read from the id, the file's path (the HF cache keeps the repo name in it)
or the safetensors metadata; the file's sha256 (over its bytes, the Hugging Face blob name) is
recorded beside it.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import numpy as np

from aepg_jax.checkpoints import augreg, hub, timm

PAPER_TAG = "augreg_in21k_ft_in1k"
OTHER_TAGS = ("augreg2_in21k_ft_in1k",)
AUGREG_FILE = (
    "B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.01"
    "-res_224.npz"
)


def local_path(checkpoint: str) -> str:
    """The file of `model.checkpoint`: an `hf-hub:` id's cached file, else the path itself."""
    if hub.is_hub_id(checkpoint):
        return hub.resolve(checkpoint)
    return os.path.expanduser(checkpoint)


def num_heads_of(params: dict[str, Any]) -> int:
    """The model's head count, from block 0's query kernel `(D, H, Dh)`."""
    query = params["Transformer"]["encoderblock_0"]["MultiHeadDotProductAttention_0"]["query"]
    return int(query["kernel"].shape[1])


def read_linen(path: str, num_heads: int) -> dict[str, np.ndarray]:
    """The backbone arrays of `path` (either format) under Linen names."""
    if timm.is_safetensors(path):
        return timm.read_linen(path, num_heads)
    return augreg.to_linen_names(augreg.read_npz(path))


def load_backbone(path: str, params: dict[str, Any]) -> dict[str, Any]:
    """`augreg.load_backbone` for either format (`path` a local file)."""
    if timm.is_safetensors(path):
        return augreg.fit_backbone(timm.read_linen(path, num_heads_of(params)), params, path)
    return augreg.load_backbone(path, params)


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def weights_tag(checkpoint: str, path: str) -> str | None:
    """The pretrained tag named by the id, the path or the safetensors metadata, or None."""
    texts = [checkpoint, path]
    if timm.is_safetensors(path):
        try:
            texts += [f"{k}={v}" for k, v in timm.metadata(path).items()]
        except augreg.CheckpointError:
            pass
    for tag in (*OTHER_TAGS, PAPER_TAG):  # augreg2 first: the names share a suffix
        if any(tag in text for text in texts):
            return tag
    if os.path.basename(path) == AUGREG_FILE:
        return PAPER_TAG
    return None


def identify(checkpoint: str, path: str) -> dict[str, Any]:
    """`{"path", "format", "sha256", "weights", "paper_weights"}` for results.json."""
    tag = weights_tag(checkpoint, path)
    return {
        "path": checkpoint,
        "file": path,
        "format": "timm safetensors" if timm.is_safetensors(path) else "augreg npz",
        "sha256": file_sha256(path),
        "weights": tag,
        "paper_weights": None if tag is None else tag == PAPER_TAG,
    }


def describe(info: dict[str, Any]) -> str:
    """One line saying which weights were loaded."""
    head = f"backbone: {info['path']} ({info['format']}, sha256 {info['sha256'][:16]}...)"
    if info["paper_weights"]:
        return f"{head}: the paper's weights ({PAPER_TAG})"
    if info["weights"]:
        return (
            f"{head}: {info['weights']}, NOT the paper's weights (the paper used {PAPER_TAG}: "
            f"hf-hub:{hub.PAPER_ID})"
        )
    return f"{head}: weights not recognised as the paper's ({PAPER_TAG})"
