"""Generate tests/fixtures/timm_tiny_{dinov2,clip}.safetensors and their `_io.npz`: tiny, randomly
initialised timm models of the DINOv2 and CLIP ViT families, built by timm's own model functions
(`vit_base_patch14_dinov2`, `vit_base_patch16_clip_quickgelu_224`, the architecture of
`vit_base_patch14_dinov2.lvd142m` and `vit_base_patch16_clip_224.openai`) with the width, depth
and image size overridden:

* dinov2: patch 14, 42x42 RGB input (3x3 patches), width 32, depth 2, 2 heads, MLP 128, layer
  scale (`blocks.i.ls1.gamma`, `ls2.gamma`), LayerNorm eps 1e-6, exact GELU;
* clip: patch 8, 32x32 input (4x4 patches), width 32, depth 2, 2 heads, MLP 128, `norm_pre`
  before the blocks, no patch-embedding bias, QuickGELU, LayerNorm eps 1e-5.

Every parameter is overwritten with non-trivial random values (`make_timm_fixture`'s
`randomize_parameters`; layer-scale gammas 0.5 + 0.1 N(0, 1) so both branches count). Each file
is written as timm writes the hub's weights (`safetensors.torch.save_file(state_dict)`) and
checked by loading it back with `timm.models.load_checkpoint`.

``timm_tiny_<family>_io.npz`` holds:

* ``images``: (4, S, S, 3) NHWC float32 uniform in [-1, 1] (numpy seed 0), fed to timm as NCHW;
* ``features``: ``model.forward_head(model.forward_features(x), pre_logits=True)`` (4, 32);
* ``patch_size``, ``hidden_size``, ``depth``, ``num_heads``, ``mlp_dim``, ``image_size``: 0-d
  ints.

Regenerate with torch and timm in a venv of their own (see tests/make_timm_fixture.py):

    .venv-timm/bin/python tests/make_timm_family_fixtures.py

Generated with timm 1.0.31, torch 2.13.0+cpu (CPU); no network, no weights.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from make_timm_fixture import _import_torch_and_timm, randomize_parameters

HIDDEN_SIZE = 32
DEPTH = 2
NUM_HEADS = 2
MLP_DIM = 128
BATCH = 4
FAMILIES = {
    # family: (timm model function, patch size, image size, expected LayerNorm eps)
    "dinov2": ("vit_base_patch14_dinov2", 14, 42, 1e-6),
    "clip": ("vit_base_patch16_clip_quickgelu_224", 8, 32, 1e-5),
}


def build(timm, torch, family: str, seed: int):
    name, patch, size, eps = FAMILIES[family]
    torch.manual_seed(seed)
    model = timm.create_model(
        name,
        pretrained=False,
        num_classes=0,
        img_size=size,
        patch_size=patch,
        embed_dim=HIDDEN_SIZE,
        depth=DEPTH,
        num_heads=NUM_HEADS,
        mlp_ratio=MLP_DIM / HIDDEN_SIZE,
    )
    gen = torch.Generator().manual_seed(seed)
    randomize_parameters(model, gen)
    with torch.no_grad():
        for pname, param in model.named_parameters():
            if pname.endswith(".gamma"):
                noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
                param.copy_(0.5 + 0.1 * noise)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    if not norms or any(m.eps != eps for m in norms):
        raise RuntimeError(f"{family}: expected LayerNorm eps {eps}: {norms}")
    return model.float().eval()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).parent / "fixtures")
    args = parser.parse_args(argv)
    torch, timm, stubbed = _import_torch_and_timm()
    import safetensors.torch
    from timm.models import load_checkpoint

    print(f"timm {timm.__version__}, torch {torch.__version__}, stubbed: {stubbed or 'none'}")
    torch.set_num_threads(1)
    for family, (_, patch, size, _) in FAMILIES.items():
        model = build(timm, torch, family, seed=0)
        path = args.out_dir / f"timm_tiny_{family}.safetensors"
        safetensors.torch.save_file(model.state_dict(), str(path), metadata={"format": "pt"})
        fresh = build(timm, torch, family, seed=1)
        load_checkpoint(fresh, str(path))
        for name, tensor in fresh.state_dict().items():
            if not torch.equal(tensor, model.state_dict()[name]):
                raise RuntimeError(f"timm's load_checkpoint of {path} changed {name!r}")
        images = np.random.default_rng(0).uniform(-1, 1, (BATCH, 3, size, size))
        images = images.astype(np.float32)
        with torch.no_grad():
            x = torch.from_numpy(images)
            features = model.forward_head(model.forward_features(x), pre_logits=True).numpy()
        arrays = {
            "images": images.transpose(0, 2, 3, 1),
            "features": features,
            **{
                k: np.array(v, np.int64)
                for k, v in dict(
                    patch_size=patch,
                    hidden_size=HIDDEN_SIZE,
                    depth=DEPTH,
                    num_heads=NUM_HEADS,
                    mlp_dim=MLP_DIM,
                    image_size=size,
                ).items()
            },
        }
        io_path = args.out_dir / f"timm_tiny_{family}_io.npz"
        with io_path.open("wb") as f:
            np.savez(f, **arrays)
        keys = sorted(model.state_dict())
        print(f"wrote {path} ({path.stat().st_size} bytes, {len(keys)} tensors) and {io_path}")
        print("  " + ", ".join(k for k in keys if not k.startswith("blocks.1.")))


if __name__ == "__main__":
    main()
