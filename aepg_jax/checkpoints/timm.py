"""Loads timm's PyTorch-layout ViT weights (`model.safetensors`) onto our parameter tree.

timm keeps torch's layout: Linear weights `(out, in)`, the patch conv `(D, C, P, P)`, and the
attention's query, key and value fused into one `blocks.i.attn.qkv` Linear whose `3*D` output
rows are `[q; k; v]`, each head-major (row `head * Dh + d`). The map onto the augreg/Linen names
of `checkpoints/augreg.py`:

    cls_token (1, 1, D)                -> cls
    pos_embed (1, N, D)                -> Transformer/posembed_input/pos_embedding
    patch_embed.proj.weight (D,C,P,P)  -> embedding/kernel (P, P, C, D)   (transpose 2,3,1,0)
    norm.{weight,bias}                 -> Transformer/encoder_norm/{scale,bias}
    blocks.i.norm1 / norm2             -> encoderblock_i/LayerNorm_0 / LayerNorm_1
    blocks.i.attn.qkv.weight (3D, D)   -> .../{query,key,value}/kernel (D, H, Dh)
    blocks.i.attn.qkv.bias (3D,)       -> .../{query,key,value}/bias (H, Dh)
    blocks.i.attn.proj.weight (D, D)   -> .../out/kernel (H, Dh, D);  proj.bias -> out/bias
    blocks.i.mlp.fc{1,2}.weight        -> .../MlpBlock_0/Dense_{0,1}/kernel (transposed)
    norm_pre.{weight,bias}             -> Transformer/pre_norm/{scale,bias}      (clip family)
    blocks.i.ls{1,2}.gamma             -> encoderblock_i/LayerScale_{0,1}/scale  (dinov2 family)

`head.*` is ignored (we train our own heads); any other key (`fc_norm`, registers)
is kept under its timm name so that validation reports it as unexpected. The head count `H` is
not in the file: it is the model's (`num_heads`), which any split of `D` fits.

The file is read with the `safetensors` package's NumPy API (no torch). Shapes alone come from
its header (`safetensor_shapes`), converted by the same code on zero-stride stand-in arrays, so
config validation sees exactly the names and shapes loading would.
"""

from __future__ import annotations

import functools
import json
import os
import re
import struct
from collections.abc import Callable

import numpy as np

from aepg_jax.checkpoints import augreg

SUFFIX = ".safetensors"
_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")
_IGNORED = ("head.",)
_TOP = {
    "cls_token": "cls",
    "pos_embed": augreg.POSEMB,
    "patch_embed.proj.bias": "embedding/bias",
    "norm.weight": "Transformer/encoder_norm/scale",
    "norm.bias": "Transformer/encoder_norm/bias",
    "norm_pre.weight": "Transformer/pre_norm/scale",  # clip family
    "norm_pre.bias": "Transformer/pre_norm/bias",
}
_IN_BLOCK = {
    "norm1.weight": "LayerNorm_0/scale",
    "norm1.bias": "LayerNorm_0/bias",
    "norm2.weight": "LayerNorm_1/scale",
    "norm2.bias": "LayerNorm_1/bias",
    "mlp.fc1.bias": "MlpBlock_0/Dense_0/bias",
    "mlp.fc2.bias": "MlpBlock_0/Dense_1/bias",
    "attn.proj.bias": "MultiHeadDotProductAttention_0/out/bias",
    "ls1.gamma": "LayerScale_0/scale",  # dinov2 family
    "ls2.gamma": "LayerScale_1/scale",
}
_TRANSPOSED = {
    "mlp.fc1.weight": "MlpBlock_0/Dense_0/kernel",
    "mlp.fc2.weight": "MlpBlock_0/Dense_1/kernel",
}
_ATTN = "MultiHeadDotProductAttention_0"


def is_safetensors(path: str | os.PathLike) -> bool:
    """True for a `.safetensors` name or a file that starts like one (u64 length + `{`)."""
    path = os.fspath(path)
    if path.endswith(SUFFIX):
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return False
    return len(head) == 9 and head[8:9] == b"{" and struct.unpack("<Q", head[:8])[0] < 2**30


def _split_qkv(key: str, x: np.ndarray, num_heads: int) -> dict[str, np.ndarray]:
    """Fused `(3D, D)` weight or `(3D,)` bias -> query/key/value kernels `(D, H, Dh)` or biases
    `(H, Dh)`; a shape that does not split is returned under its timm name."""
    rows = x.shape[0]
    if rows % 3 or (rows // 3) % num_heads or x.ndim not in (1, 2):
        return {key: x}
    d = rows // 3
    block = f"Transformer/encoderblock_{_BLOCK.match(key).group(1)}/{_ATTN}"
    if x.ndim == 2:
        parts = x.reshape(3, num_heads, d // num_heads, x.shape[1]).transpose(0, 3, 1, 2)
        leaf = "kernel"
    else:
        parts = x.reshape(3, num_heads, d // num_heads)
        leaf = "bias"
    return {f"{block}/{n}/{leaf}": parts[j] for j, n in enumerate(("query", "key", "value"))}


def _convert_one(key: str, x: np.ndarray, num_heads: int) -> dict[str, np.ndarray]:
    if key in _TOP:
        return {_TOP[key]: x}
    if key == "patch_embed.proj.weight" and x.ndim == 4:
        return {"embedding/kernel": x.transpose(2, 3, 1, 0)}
    m = _BLOCK.match(key)
    if not m:
        return {key: x}
    prefix, rest = f"Transformer/encoderblock_{m.group(1)}/", m.group(2)
    if rest in _IN_BLOCK:
        return {prefix + _IN_BLOCK[rest]: x}
    if rest in _TRANSPOSED and x.ndim == 2:
        return {prefix + _TRANSPOSED[rest]: x.T}
    if rest in ("attn.qkv.weight", "attn.qkv.bias"):
        return _split_qkv(key, x, num_heads)
    if rest == "attn.proj.weight" and x.ndim == 2 and x.shape[1] % num_heads == 0:
        d_in = x.shape[1]
        return {f"{prefix}{_ATTN}/out/kernel": x.T.reshape(num_heads, d_in // num_heads, -1)}
    return {key: x}


def to_linen(flat: dict[str, np.ndarray], num_heads: int) -> dict[str, np.ndarray]:
    """timm names and layouts -> our Linen names and layouts; `head.*` dropped."""
    out: dict[str, np.ndarray] = {}
    for key, x in flat.items():
        if not key.startswith(_IGNORED):
            out.update(_convert_one(key, x, num_heads))
    return out


def _open_error(path: str, err: Exception) -> augreg.CheckpointError:
    return augreg.CheckpointError(
        f"{path!r} is not a readable .safetensors file ({type(err).__name__}: "
        f"{str(err).strip().splitlines()[0] if str(err).strip() else ''}); a truncated download "
        "looks like this: download it again."
    )


def _truncated(path: str, expected: int, size: int) -> augreg.CheckpointError:
    return augreg.CheckpointError(
        f"{path!r} is truncated: expected {expected} bytes, file has {size} (an interrupted "
        "download); download it again."
    )


def _check_size(path: str) -> None:
    """A file shorter than its header says (a truncated download) is refused in one line."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise _truncated(path, 8, size)
        n = struct.unpack("<Q", head)[0]
        if n > size - 8:
            if n >= 2**30:  # no header is this long: not a length at all
                raise _open_error(path, ValueError(f"a header length of {n} bytes"))
            raise _truncated(path, 8 + n, size)
        try:
            header = json.loads(f.read(n))
        except ValueError as err:
            raise _open_error(path, err) from err
    try:
        end = max(
            (int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"),
            default=0,
        )
    except (AttributeError, KeyError, IndexError, TypeError, ValueError) as err:
        raise _open_error(path, ValueError(f"malformed header ({err!r})")) from err
    if 8 + n + end > size:
        raise _truncated(path, 8 + n + end, size)


def _safe_open(path: str) -> Callable:
    try:
        from safetensors import safe_open
    except ImportError as err:  # a dependency of the package: a broken install
        raise augreg.CheckpointError(
            "reading .safetensors needs the `safetensors` package: reinstall aepg_jax "
            "(bash scripts/install.sh)."
        ) from err
    return safe_open


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """All tensors of a `.safetensors` file as NumPy arrays, by timm name."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise augreg.CheckpointError(f"Checkpoint {path!r} does not exist.")
    _check_size(path)
    try:
        with _safe_open(path)(path, framework="numpy") as f:
            return {k: np.asarray(f.get_tensor(k)) for k in f.keys()}
    except Exception as err:  # safetensors' own SafetensorError, dtype errors
        raise _open_error(path, err) from err


def safetensor_shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """`{timm name: shape}` from the header (no tensor is read)."""
    path = os.fspath(path)
    stat = os.stat(path)
    return dict(_shapes(os.path.realpath(path), stat.st_size, stat.st_mtime_ns))


@functools.lru_cache(maxsize=16)
def _shapes(path: str, size: int, mtime_ns: int) -> dict[str, tuple[int, ...]]:
    del size, mtime_ns  # the cache key
    _check_size(path)
    try:
        with _safe_open(path)(path, framework="numpy") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as err:
        raise _open_error(path, err) from err


def metadata(path: str | os.PathLike) -> dict[str, str]:
    """The header's `__metadata__` (string pairs; timm writes e.g. `format: pt`)."""
    try:
        with _safe_open(path)(os.fspath(path), framework="numpy") as f:
            return dict(f.metadata() or {})
    except Exception as err:
        raise _open_error(os.fspath(path), err) from err


def linen_shapes(shapes: dict[str, tuple[int, ...]], num_heads: int) -> dict[str, tuple]:
    """The Linen names and shapes `to_linen` gives for arrays of `shapes` (timm names)."""
    stand_ins = {k: np.broadcast_to(np.float32(0), s) for k, s in shapes.items()}
    return {k: tuple(v.shape) for k, v in to_linen(stand_ins, num_heads).items()}


def read_linen(path: str | os.PathLike, num_heads: int) -> dict[str, np.ndarray]:
    """A timm `.safetensors` file under our Linen names and layouts (contiguous float arrays)."""
    return {
        k: np.ascontiguousarray(v) for k, v in to_linen(read_safetensors(path), num_heads).items()
    }
