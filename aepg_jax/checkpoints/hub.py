"""`hf-hub:timm/<model>` checkpoint ids, resolved offline from the local Hugging Face cache.

    hf-hub:timm/vit_base_patch16_224.augreg_in21k_ft_in1k
        -> ~/.cache/huggingface/hub/models--timm--vit_base_patch16_224.augreg_in21k_ft_in1k/
           snapshots/<revision>/model.safetensors

Nothing is downloaded: `huggingface_hub` (the optional `hub` extra) is asked only for the cached
file (`try_to_load_from_cache`, which makes no request). Without the package, or when the file
is not cached, the error names the command that downloads it. The cache is the one
`huggingface_hub` uses (`HF_HUB_CACHE`, `HF_HOME`, ~/.cache/huggingface/hub).

timm's plain `vit_base_patch16_224` means its default tag (in current timm `augreg2_in21k_ft_in1k`,
not the paper's weights), so an id must name its tag.
"""

from __future__ import annotations

import os

from aepg_jax.checkpoints import augreg

PREFIX = "hf-hub:"
FILENAME = "model.safetensors"
PAPER_ID = "timm/vit_base_patch16_224.augreg_in21k_ft_in1k"


def is_hub_id(checkpoint: str | None) -> bool:
    return isinstance(checkpoint, str) and checkpoint.startswith(PREFIX)


def download_command(repo_id: str) -> str:
    return f"hf download {repo_id} {FILENAME}"


def parse(checkpoint: str) -> str:
    """`hf-hub:timm/<model>.<tag>` -> `timm/<model>.<tag>`; a malformed id is refused."""
    repo_id = checkpoint[len(PREFIX) :]
    owner, _, name = repo_id.partition("/")
    if not owner or not name or "/" in name:
        raise augreg.CheckpointError(
            f"{checkpoint!r} is not an hf-hub id: write hf-hub:<owner>/<model>, e.g. "
            f"hf-hub:{PAPER_ID} (the paper's weights)."
        )
    if owner == "timm" and "." not in name:
        raise augreg.CheckpointError(
            f"{checkpoint!r} names no pretrained tag: timm resolves a plain model name to its "
            f"current default (for vit_base_patch16_224 augreg2_in21k_ft_in1k, not the paper's "
            f"weights); name the tag, e.g. hf-hub:{PAPER_ID}."
        )
    return repo_id


def resolve(checkpoint: str) -> str:
    """Local path of the cached `model.safetensors` of an `hf-hub:` id (never downloads)."""
    repo_id = parse(checkpoint)
    get = f"download it once with `{download_command(repo_id)}`"
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError as err:
        raise augreg.CheckpointError(
            f"{checkpoint} needs huggingface_hub to find the cached file: install the hub extra "
            f"(bash scripts/install.sh hub), and {get} if it is not cached yet."
        ) from err
    found = try_to_load_from_cache(repo_id, FILENAME)
    if not isinstance(found, str) or not os.path.isfile(found):
        raise augreg.CheckpointError(
            f"{checkpoint} is not in the local Hugging Face cache: {get} (huggingface_hub's "
            "cache: HF_HUB_CACHE, HF_HOME or ~/.cache/huggingface/hub)."
        )
    return found
