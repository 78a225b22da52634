"""`model.checkpoint` in any supported form: an augreg `.npz`, a timm `.safetensors`, or an
`hf-hub:timm/<model>` id (resolved from the local Hugging Face cache); which weights it holds.

    checkpoint = weights.checkpoint_of(cfg.model)          # model.checkpoint or model.weights
    path = weights.local_path(checkpoint)                  # hf-hub id -> cached file
    params = weights.load_backbone(path, params)           # either format
    weights.identify(checkpoint, path, cfg.model.weights)  # format, sha256, which weights

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

from aepg_jax.checkpoints import augreg, catalog, hub, timm

PAPER_TAG = "augreg_in21k_ft_in1k"
OTHER_TAGS = ("augreg2_in21k_ft_in1k",)
AUGREG_FILE = (
    "B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.01"
    "-res_224.npz"
)


def checkpoint_of(model_cfg: Any) -> str | None:
    """The file or `hf-hub:` id a model config loads: `model.checkpoint` when set, else the
    cached hub file of `model.weights` (`catalog.WEIGHTS`), else None."""
    if model_cfg.get("checkpoint"):
        return model_cfg.checkpoint
    name = model_cfg.get("weights")
    if name and name in catalog.WEIGHTS:
        return catalog.WEIGHTS[name].checkpoint
    return None


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


def identify(checkpoint: str, path: str, name: str | None = None) -> dict[str, Any]:
    """`{"path", "file", "format", "sha256", "weights", "paper_weights", "name", "family"}` for
    results.json; `name` is `model.weights` (None: the tag is read from the id, path or
    metadata). A file whose sha256 differs from the one `catalog` knows for `name` is refused."""
    tag = weights_tag(checkpoint, path)
    sha = file_sha256(path)
    entry = catalog.WEIGHTS.get(name) if name else None
    if entry is not None:
        tag = entry.name.partition(".")[2]
        if entry.sha256 and sha != entry.sha256:
            raise augreg.CheckpointError(
                f"model.weights={name}: {path} has sha256 {sha}, the published file "
                f"{entry.sha256}: download it again (`{hub.download_command(entry.hub_id)}`)."
            )
    return {
        "path": checkpoint,
        "file": path,
        "format": "timm safetensors" if timm.is_safetensors(path) else "augreg npz",
        "sha256": sha,
        "weights": tag,
        "paper_weights": None if tag is None else tag == PAPER_TAG,
        "name": name,
        "family": entry.family if entry else None,
    }


def describe(info: dict[str, Any]) -> str:
    """One line saying which weights were loaded."""
    head = f"backbone: {info['path']} ({info['format']}, sha256 {info['sha256'][:16]}...)"
    if info.get("name"):
        paper = "the paper's weights" if info["paper_weights"] else "not the paper's weights"
        return f"{head}: {info['name']} ({info['family']} family; {paper})"
    if info["paper_weights"]:
        return f"{head}: the paper's weights ({PAPER_TAG})"
    if info["weights"]:
        return (
            f"{head}: {info['weights']}, NOT the paper's weights (the paper used {PAPER_TAG}: "
            f"hf-hub:{hub.PAPER_ID})"
        )
    return f"{head}: weights not recognised as the paper's ({PAPER_TAG})"
