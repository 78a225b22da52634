"""Generate tests/fixtures/timm_tiny_vit{,_io}.npz and timm_tiny_vit.safetensors: a tiny timm ViT
in the augreg .npz layout and in timm's own safetensors layout, from the same weights.

Builds a tiny, randomly initialised ``timm`` ``VisionTransformer`` in PyTorch (patch 8, 32x32
RGB input, width 32, depth 2, 2 heads, MLP 128, 10 classes, class-token pooling), overwrites
every parameter with non-trivial random values, and writes two ``.npz`` files.

``timm_tiny_vit.npz`` holds only the weights, exactly as a published checkpoint would:

* the weights under the plain key names of the published Google augreg / original ViT ``.npz``
  checkpoints (``embedding/kernel``, ``Transformer/encoderblock_{i}/...``, ``head/kernel``, ...;
  no ``params/`` prefix), float32.

``timm_tiny_vit.safetensors`` holds the same weights as timm itself writes them for the Hugging
Face hub (``safetensors.torch.save_file(model.state_dict())``, the call of timm's
``save_for_hf``: torch layout, fused ``blocks.N.attn.qkv``), checked by loading it back with
``timm.models.load_checkpoint``.

``timm_tiny_vit_io.npz`` holds the test inputs and timm's outputs:

* ``fixture/images``: 4 input images (4, 32, 32, 3) NHWC, uniform in [-1, 1] (numpy seed 0);
  timm was fed exactly these values, transposed to NCHW;
* ``fixture/tokens``: ``model.forward_features(x)`` (after the final norm), (4, 17, 32);
* ``fixture/features``: ``model.forward_head(tokens, pre_logits=True)``, the normed class
  token, (4, 32);
* ``fixture/logits``: ``model(x)``, (4, 10);
* ``fixture/{patch_size,hidden_size,depth,num_heads,mlp_dim,image_size,num_classes}``: 0-d ints.

A JAX test loads the weights through the project's converter and must reproduce the outputs.
Numerical conventions of timm's ViT that the JAX side must match (the script asserts both):

* GELU is the exact erf form (``nn.GELU(approximate='none')``), not the tanh approximation;
* every LayerNorm uses eps = 1e-6 (not PyTorch's default 1e-5).

The layout is checked against timm itself: after writing the file, a second, differently
initialised timm model loads it with timm's own augreg loader
``timm.models.vision_transformer._load_weights`` and must reproduce every parameter bit for bit
and the logits to < 1e-6; otherwise the script fails.

Regenerate (torch/timm in a throwaway venv, or in the project's .venv like bench_step.py)::

    python3 -m venv /tmp/torchenv
    /tmp/torchenv/bin/pip install torch==2.13.0
    /tmp/torchenv/bin/pip install --no-deps timm
    /tmp/torchenv/bin/pip install pyyaml huggingface_hub safetensors numpy
    /tmp/torchenv/bin/python tests/make_timm_fixture.py

Generated with timm 1.0.31, torch 2.13.0+cpu, numpy 2.4.6 (CPU). timm is installed without its
``torchvision`` dependency (and so without Pillow); missing ones are replaced by inert stub
modules before ``import timm`` (see ``benchmarks/_timm_import.py``). No network access, no weights.
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _timm_import  # shared with benchmarks/torch_step.py

if TYPE_CHECKING:
    import torch

IMAGE_SIZE = 32
PATCH_SIZE = 8
CHANNELS = 3
HIDDEN_SIZE = 32
DEPTH = 2
NUM_HEADS = 2
MLP_RATIO = 4.0
NUM_CLASSES = 10
BATCH = 4
LN_EPS = 1e-6
ROUND_TRIP_TOL = 1e-6

INSTALL_HELP = """\
This script needs torch and timm, which are deliberately not part of the project venv
(missing: {missing}). Install them into a throwaway venv and run the script with it:
    python3 -m venv /tmp/torchenv
    /tmp/torchenv/bin/pip install torch==2.13.0
    /tmp/torchenv/bin/pip install --no-deps timm
    /tmp/torchenv/bin/pip install pyyaml huggingface_hub safetensors numpy
    /tmp/torchenv/bin/python tests/make_timm_fixture.py"""


def _import_torch_and_timm() -> tuple[types.ModuleType, types.ModuleType, list[str]]:
    """Import torch and timm, or exit with status 2 and install instructions if missing."""
    try:
        timm = _timm_import.import_timm()
    except _timm_import.TorchMissingError as err:
        print(INSTALL_HELP.format(missing=", ".join(err.missing)), file=sys.stderr)
        sys.exit(2)
    import torch

    return torch, timm, _timm_import.stubbed_packages()


# --- model -------------------------------------------------------------------------------------


def build_model(seed: int) -> torch.nn.Module:
    """Tiny timm ViT in eval mode with every parameter drawn from `seed` (non-trivial values)."""
    import torch
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(seed)
    model = VisionTransformer(
        img_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        in_chans=CHANNELS,
        num_classes=NUM_CLASSES,
        embed_dim=HIDDEN_SIZE,
        depth=DEPTH,
        num_heads=NUM_HEADS,
        mlp_ratio=MLP_RATIO,
        qkv_bias=True,
        class_token=True,
        global_pool="token",
        pre_norm=False,
        fc_norm=None,  # timm: no fc_norm for token pooling; the final norm acts on all tokens
        drop_rate=0.0,
        pos_drop_rate=0.0,
        proj_drop_rate=0.0,
        attn_drop_rate=0.0,
        drop_path_rate=0.0,
    )
    randomize_parameters(model, torch.Generator().manual_seed(seed))
    check_numerics(model)
    return model.float().eval()


def randomize_parameters(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Overwrite every parameter so that any mis-mapped tensor changes the outputs.

    Weights: N(0, 1/fan_in), so activations and attention logits are O(1) and attention is far
    from uniform. Biases: N(0, 0.1^2). LayerNorm: scale 1 + 0.1 N(0, 1), bias 0.1 N(0, 1).
    cls token and position embedding: N(0, 0.5^2), comparable to the patch embeddings.
    """
    import torch

    layer_norm_params = {
        id(p) for m in model.modules() if isinstance(m, torch.nn.LayerNorm) for p in m.parameters()
    }
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
            if id(param) in layer_norm_params:
                value = 1.0 + 0.1 * noise if name.endswith("weight") else 0.1 * noise
            elif name in ("cls_token", "pos_embed"):
                value = 0.5 * noise
            elif param.ndim >= 2:
                value = noise / float(np.prod(param.shape[1:])) ** 0.5
            else:
                value = 0.1 * noise
            param.copy_(value)


def check_numerics(model: torch.nn.Module) -> None:
    """Fail if the model does not use exact GELU and LayerNorm eps 1e-6 (the docstring's claims)."""
    import torch

    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    gelus = [m for m in model.modules() if isinstance(m, torch.nn.GELU)]
    if len(norms) != 2 * DEPTH + 1 or any(m.eps != LN_EPS for m in norms):
        raise RuntimeError(f"expected {2 * DEPTH + 1} LayerNorms with eps {LN_EPS}: {norms}")
    if len(gelus) != DEPTH or any(m.approximate != "none" for m in gelus):
        raise RuntimeError(f"expected {DEPTH} exact (erf) GELUs: {gelus}")


def make_images() -> np.ndarray:
    """Input batch, NCHW float32, uniform in [-1, 1], numpy seed 0."""
    rng = np.random.default_rng(0)
    shape = (BATCH, CHANNELS, IMAGE_SIZE, IMAGE_SIZE)
    return rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)


def run_model(model: torch.nn.Module, images_nchw: np.ndarray) -> dict[str, np.ndarray]:
    """timm's tokens (after final norm), pre-logits class-token features and logits."""
    import torch

    x = torch.from_numpy(images_nchw)
    with torch.no_grad():
        tokens = model.forward_features(x)
        features = model.forward_head(tokens, pre_logits=True)
        logits = model(x)
    return {
        "tokens": tokens.numpy(),
        "features": features.numpy(),
        "logits": logits.numpy(),
    }


# --- torch -> augreg .npz layout ---------------------------------------------------------------


def to_augreg(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """Map timm's state dict to augreg .npz keys and shapes (Flax kernels are (in, out))."""
    sd = {k: v.detach().cpu().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    d, h = HIDDEN_SIZE, NUM_HEADS
    dh = d // h

    def dense(prefix: str) -> dict[str, np.ndarray]:
        return {"kernel": sd[f"{prefix}.weight"].T, "bias": sd[f"{prefix}.bias"]}

    def layer_norm(prefix: str) -> dict[str, np.ndarray]:
        return {"scale": sd[f"{prefix}.weight"], "bias": sd[f"{prefix}.bias"]}

    def add(out: dict[str, np.ndarray], prefix: str, tensors: dict[str, np.ndarray]) -> None:
        out.update({f"{prefix}/{name}": value for name, value in tensors.items()})

    out: dict[str, np.ndarray] = {
        "cls": sd["cls_token"],  # (1, 1, D)
        # torch conv weight (O=D, I=C, H=P, W=P) -> Flax HWIO (P, P, C, D)
        "embedding/kernel": sd["patch_embed.proj.weight"].transpose(2, 3, 1, 0),
        "embedding/bias": sd["patch_embed.proj.bias"],
        "Transformer/posembed_input/pos_embedding": sd["pos_embed"],  # (1, N+1, D), cls first
    }
    add(out, "Transformer/encoder_norm", layer_norm("norm"))
    for i in range(DEPTH):
        blk, key = f"blocks.{i}", f"Transformer/encoderblock_{i}"
        add(out, f"{key}/LayerNorm_0", layer_norm(f"{blk}.norm1"))
        add(out, f"{key}/LayerNorm_2", layer_norm(f"{blk}.norm2"))
        add(out, f"{key}/MlpBlock_3/Dense_0", dense(f"{blk}.mlp.fc1"))
        add(out, f"{key}/MlpBlock_3/Dense_1", dense(f"{blk}.mlp.fc2"))
        # Fused qkv rows are [q; k; v], each indexed head-major (head * Dh + d).
        qkv_w = sd[f"{blk}.attn.qkv.weight"].reshape(3, h, dh, d)
        qkv_b = sd[f"{blk}.attn.qkv.bias"].reshape(3, h, dh)
        mha = f"{key}/MultiHeadDotProductAttention_1"
        for j, name in enumerate(("query", "key", "value")):
            out[f"{mha}/{name}/kernel"] = qkv_w[j].transpose(2, 0, 1)  # (D, H, Dh)
            out[f"{mha}/{name}/bias"] = qkv_b[j]  # (H, Dh)
        # proj input features are the concatenated heads (head * Dh + d).
        out[f"{mha}/out/kernel"] = sd[f"{blk}.attn.proj.weight"].T.reshape(h, dh, d)
        out[f"{mha}/out/bias"] = sd[f"{blk}.attn.proj.bias"]
    add(out, "head", dense("head"))
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def fixture_arrays(model: torch.nn.Module, images_nchw: np.ndarray) -> dict[str, np.ndarray]:
    """Inputs (NHWC), timm's outputs and the architecture as 0-d int arrays."""
    outputs = run_model(model, images_nchw)
    config = {
        "patch_size": PATCH_SIZE,
        "hidden_size": HIDDEN_SIZE,
        "depth": DEPTH,
        "num_heads": NUM_HEADS,
        "mlp_dim": model.blocks[0].mlp.fc1.out_features,
        "image_size": IMAGE_SIZE,
        "num_classes": NUM_CLASSES,
    }
    arrays = {"images": images_nchw.transpose(0, 2, 3, 1), **outputs}
    out = {f"fixture/{k}": np.ascontiguousarray(v, dtype=np.float32) for k, v in arrays.items()}
    out.update({f"fixture/{k}": np.array(v, dtype=np.int64) for k, v in config.items()})
    return out


# --- verification with timm's own augreg loader ------------------------------------------------


def verify_round_trip(path: Path, reference: torch.nn.Module, images_nchw: np.ndarray) -> float:
    """Load `path` into a fresh model with timm's `_load_weights`; return the max logit diff."""
    import torch
    from timm.models.vision_transformer import _load_weights

    model = build_model(seed=1)
    expected = run_model(reference, images_nchw)["logits"]
    before = np.abs(run_model(model, images_nchw)["logits"] - expected).max()
    if before < 1e-2:
        raise RuntimeError(f"fresh model already matches the reference (diff {before:.2e})")
    _load_weights(model, str(path))
    ref_sd = reference.state_dict()
    for name, tensor in model.state_dict().items():
        if not torch.equal(tensor, ref_sd[name]):
            raise RuntimeError(f"round trip through timm's _load_weights changed {name!r}")
    diff = float(np.abs(run_model(model, images_nchw)["logits"] - expected).max())
    if not diff < ROUND_TRIP_TOL:
        raise RuntimeError(f"round-trip logits differ by {diff:.3e} >= {ROUND_TRIP_TOL}")
    return diff


def save_safetensors(model: torch.nn.Module, path: Path) -> None:
    """`model`'s weights as timm writes them for the hub, checked by timm's own loader."""
    import safetensors.torch
    import torch
    from timm.models import load_checkpoint

    # timm's save_for_hf writes the weights with exactly this call (its config.json needs a
    # pretrained_cfg, which a bare VisionTransformer lacks, and is not read here).
    safetensors.torch.save_file(model.state_dict(), str(path), metadata={"format": "pt"})
    fresh = build_model(seed=1)
    load_checkpoint(fresh, str(path))
    for name, tensor in fresh.state_dict().items():
        if not torch.equal(tensor, model.state_dict()[name]):
            raise RuntimeError(f"timm's load_checkpoint of {path} changed {name!r}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures/timm_tiny_vit.npz"))
    parser.add_argument("--io-out", type=Path, default=Path("tests/fixtures/timm_tiny_vit_io.npz"))
    parser.add_argument(
        "--safetensors-out", type=Path, default=Path("tests/fixtures/timm_tiny_vit.safetensors")
    )
    args = parser.parse_args(argv)

    torch, timm, stubbed = _import_torch_and_timm()
    print(f"timm {timm.__version__}, torch {torch.__version__}, numpy {np.__version__}")
    if stubbed:
        print(f"stubbed missing packages: {', '.join(stubbed)}")
    torch.set_num_threads(1)  # deterministic CPU reductions

    model = build_model(seed=0)
    images = make_images()
    files = {args.out: to_augreg(model), args.io_out: fixture_arrays(model, images)}
    for path, arrays in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:  # file handle: np.savez must not touch the name
            np.savez(f, **arrays)

    save_safetensors(model, args.safetensors_out)
    print(f"wrote {args.safetensors_out} ({args.safetensors_out.stat().st_size} bytes)")
    diff = verify_round_trip(args.out, model, images)
    print(f"round trip via timm _load_weights: max |logits diff| = {diff:.3e}")
    for path in files:
        with np.load(path) as data:
            for key in data.files:
                print(f"  {key:70s} {data[key].dtype} {data[key].shape}")
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
