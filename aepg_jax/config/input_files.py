"""Checks of the files a config names, cheap enough for `schema.validate` (before any data
work): the weights file `model.checkpoint` and the split file `data.split_file`.

The weights check reads the `.npz`'s member list and each array's `.npy` header (shape), never
the arrays: a missing file, a file that is not a zip archive (a saved HTML page, a truncated
download) or one whose backbone keys and shapes are not those of the augreg ViT layout for
`model.*` (the paper's B/16 for the paper configs) is refused in one line that names the
paper's file and its public download URL. Key names follow `checkpoints/augreg.py` (container
prefix stripped, pre-Linen block numbering renamed, `head` and `pre_logits` ignored); the
position embedding's token count may differ (it is resized on load). A timm `.safetensors`
file (or an `hf-hub:` id, resolved from the local cache) is checked the same way from its
header, after `checkpoints/timm.py`'s renaming and qkv split; a truncated one is refused.
"""

from __future__ import annotations

import functools
import os
import zipfile

import ml_collections
import numpy as np

from aepg_jax.checkpoints import augreg, catalog, hub, timm, weights
from aepg_jax.data import datasets
from aepg_jax.models import vit

AUGREG_FILE = (
    "B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.01"
    "-res_224.npz"
)
AUGREG_URL = f"https://storage.googleapis.com/vit_models/augreg/{AUGREG_FILE}"
_GET = f"the paper's weights are {AUGREG_FILE}, from {AUGREG_URL}"


def npz_shapes(path: str) -> dict[str, tuple[int, ...]]:
    """`{key: shape}` of an `.npz` from its `.npy` headers (no array is read); remembered per
    file version (path, size, mtime), as validation may see one file many times."""
    stat = os.stat(path)
    return dict(_npz_shapes(os.path.realpath(path), stat.st_size, stat.st_mtime_ns))


@functools.lru_cache(maxsize=16)
def _npz_shapes(path: str, size: int, mtime_ns: int) -> dict[str, tuple[int, ...]]:
    del size, mtime_ns  # the cache key
    shapes = {}
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if not info.filename.endswith(".npy"):
                continue
            with archive.open(info) as f:
                version = np.lib.format.read_magic(f)
                read = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                shapes[info.filename[: -len(".npy")]] = tuple(read(f)[0])
    return shapes


def backbone_shapes(m: ml_collections.ConfigDict) -> dict[str, tuple[int, ...]]:
    """The backbone's parameter shapes (Linen names) for the model fields `m`; the position
    embedding's token count is None (any grid is resized on load); `model.family` adds the
    clip pre-norm (and drops the patch bias) or the dinov2 layer scales."""
    d, h, mlp, p, c = m.hidden_size, m.num_heads, m.mlp_dim, m.patch_size, m.num_channels
    family = vit.family_of(m.get("family", vit.DEFAULT_FAMILY))
    shapes = {
        "embedding/kernel": (p, p, c, d),
        **({"embedding/bias": (d,)} if family.patch_bias else {}),
        **(
            {"Transformer/pre_norm/scale": (d,), "Transformer/pre_norm/bias": (d,)}
            if family.pre_norm
            else {}
        ),
        "cls": (1, 1, d),
        augreg.POSEMB: (1, None, d),
        "Transformer/encoder_norm/scale": (d,),
        "Transformer/encoder_norm/bias": (d,),
    }
    for i in range(m.depth):
        block = f"Transformer/encoderblock_{i}/"
        attention = block + "MultiHeadDotProductAttention_0/"
        for norm in ("LayerNorm_0", "LayerNorm_1"):
            shapes[f"{block}{norm}/scale"] = shapes[f"{block}{norm}/bias"] = (d,)
        for name in ("query", "key", "value"):
            shapes[f"{attention}{name}/kernel"] = (d, h, d // h)
            shapes[f"{attention}{name}/bias"] = (h, d // h)
        shapes[f"{attention}out/kernel"] = (h, d // h, d)
        shapes[f"{attention}out/bias"] = (d,)
        shapes[f"{block}MlpBlock_0/Dense_0/kernel"] = (d, mlp)
        shapes[f"{block}MlpBlock_0/Dense_0/bias"] = (mlp,)
        shapes[f"{block}MlpBlock_0/Dense_1/kernel"] = (mlp, d)
        shapes[f"{block}MlpBlock_0/Dense_1/bias"] = (d,)
        if family.layer_scale:
            shapes[f"{block}LayerScale_0/scale"] = shapes[f"{block}LayerScale_1/scale"] = (d,)
    return shapes


def _positive_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


def _found_shapes(
    path: str, expanded: str, m: ml_collections.ConfigDict
) -> tuple[dict[str, tuple] | None, str | None]:
    """`(Linen name -> shape, None)` of the file, or `(None, one-line problem)`."""
    if timm.is_safetensors(expanded):
        try:
            return timm.linen_shapes(timm.safetensor_shapes(expanded), m.num_heads), None
        except augreg.CheckpointError as err:
            return None, f"model.checkpoint={path}: {err}"
    if not zipfile.is_zipfile(expanded):
        return None, (
            f"model.checkpoint={path} is not a readable .npz file (not a zip archive; a "
            f"truncated download or a saved web page looks like this): {_GET}."
        )
    try:
        return augreg.to_linen_names(npz_shapes(expanded)), None
    except (zipfile.BadZipFile, OSError, ValueError) as err:
        return None, f"model.checkpoint={path} cannot be read ({err}): {_GET}."


def checkpoint_problem(path: str | None, m: ml_collections.ConfigDict) -> str | None:
    """One line on why `path` (a file or an `hf-hub:` id) cannot be the backbone of the model
    `m`, or None."""
    if not path:
        return (
            "model.init=augreg needs model.checkpoint=<path of the .npz or timm .safetensors, "
            f"or hf-hub:{hub.PAPER_ID}> or model.weights=<name> (docs/data.md): {_GET}."
        )
    try:
        expanded = weights.local_path(path)
    except augreg.CheckpointError as err:
        return f"model.checkpoint: {err}"
    if not os.path.isfile(expanded):
        return f"model.checkpoint={path} does not exist: {_GET}; pass its local path."
    if not all(_positive_int(m[k]) for k in vit.ARCH_FIELDS):
        return None  # the model's own fields are wrong: config.validation names them
    found, problem = _found_shapes(path, expanded, m)
    if problem:
        return problem
    family = m.get("family", vit.DEFAULT_FAMILY)
    if family not in vit.FAMILIES:
        return None  # config.validation names it
    held, evidence = catalog.family_of_names(found)
    if held != family:
        return (
            f"model.checkpoint={path} holds a {held}-family ViT ({evidence}), not "
            f"model.family={family}: set model.family={held}."
        )
    wanted = backbone_shapes(m)
    missing = sorted(wanted.keys() - found.keys())
    wrong = [
        f"{k} {found[k]} (model {tuple('*' if s is None else s for s in shape)})"
        for k, shape in wanted.items()
        if k in found
        and (
            len(found[k]) != len(shape)
            or any(s is not None and s != f for s, f in zip(shape, found[k], strict=True))
        )
    ]
    # Unconverted timm names (`fc_norm.weight`, `blocks.0.ls1.gamma`) have dots, no slash.
    extra = sorted(
        k
        for k in found.keys() - wanted.keys()
        if k.startswith("Transformer/") or ("/" not in k and "." in k)
    )
    if not (missing or wrong or extra):
        return None
    kind = "a timm" if timm.is_safetensors(expanded) else "an augreg"
    detail = "; ".join(
        f"{title} {', '.join(items[:3])}{' ...' if len(items) > 3 else ''}"
        for title, items in (("missing", missing), ("shapes", wrong), ("unexpected", extra))
        if items
    )
    return (
        f"model.checkpoint={path} is not {kind} ViT checkpoint of the configured model "
        f"(model.hidden_size={m.hidden_size}, depth={m.depth}, patch_size={m.patch_size}): "
        f"{detail}. {_GET} (`python -m aepg_jax.checkpoints.inspect FILE` shows what a file "
        "holds)."
    )


def problems(cfg: ml_collections.ConfigDict) -> list[str]:
    """One line per unusable file the config names (weights, split file)."""
    p = []
    if cfg.model.init == "augreg":
        problem = checkpoint_problem(weights.checkpoint_of(cfg.model), cfg.model)
        if problem:
            p.append(problem)
    split_file = cfg.data.get("split_file")
    if split_file:
        if not datasets.takes_split_file(cfg.data):
            p.append(
                f"data.split_file={split_file} applies to data.source=folder only (data.source="
                f"{cfg.data.source}); unset it."
            )
        elif not os.path.isfile(os.path.expanduser(split_file)):
            p.append(
                f"data.split_file={split_file} does not exist: `python -m aepg_jax.prepare "
                "imagenet_r` writes ImageNet-R's (l2p_split.json in its version directory)."
            )
    return p
