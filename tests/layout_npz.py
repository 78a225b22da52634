"""Header-only `.npz` files: the keys and shapes of a ViT checkpoint without its arrays.

Validation (`aepg_jax.config.input_files`) reads only a checkpoint's key list and `.npy` headers, so
configs naming the paper's weights validate against `paper_layout()`, a few KB with the augreg
ViT-B/16 file's keys (pre-Linen numbering, `head/*`) and shapes. Loading it fails: it has no
data.
"""

import functools
import os
import tempfile
import zipfile

import numpy as np

from aepg_jax.checkpoints import augreg
from aepg_jax.config import input_files
from aepg_jax.models import vit

_TO_PRE_LINEN = {new: old for old, new in augreg.PRE_LINEN_RENAMES.items()}


def write_layout_npz(path, shapes: dict) -> str:
    """An .npz whose members hold float32 `.npy` headers of `shapes` and no data."""
    with zipfile.ZipFile(path, "w") as archive:
        for key, shape in shapes.items():
            with archive.open(f"{key}.npy", "w") as f:
                header = {"descr": "<f4", "fortran_order": False, "shape": tuple(shape)}
                np.lib.format.write_array_header_1_0(f, header)
    return os.fspath(path)


def augreg_shapes(model_cfg, tokens: int = 197, head: int = 1000) -> dict:
    """The published file's keys (pre-Linen block names) and shapes for `model_cfg`."""
    shapes = {}
    for key, shape in input_files.backbone_shapes(model_cfg).items():
        match = augreg.BLOCK_KEY.match(key)
        if match:
            block, part, rest = match.groups()
            key = block + _TO_PRE_LINEN.get(part, part) + rest
        shapes[key] = tuple(tokens if s is None else s for s in shape)
    shapes["head/kernel"] = (model_cfg.hidden_size, head)
    shapes["head/bias"] = (head,)
    return shapes


@functools.cache
def paper_layout() -> str:
    """Path of a header-only file with the augreg ViT-B/16 layout (made once per process)."""
    path = os.path.join(tempfile.mkdtemp(), input_files.AUGREG_FILE)
    return write_layout_npz(path, augreg_shapes(vit.model_config("vit_b16")))
