"""The published ViT-B backbones by name: their family, input normalisation and where to get them.

`model.weights=NAME` names one of `WEIGHTS` (a timm model name with its pretrained tag). The
file is `model.checkpoint` when that is set (a local `.safetensors` or `.npz`), else the
`model.safetensors` of `hf-hub:timm/NAME` in the local Hugging Face cache (never downloaded:
`hf download timm/NAME model.safetensors` fetches it once). results.json records the name, the
family and the file's sha256; a file whose sha256 differs from a known one is refused.

| name | family | pretraining | mean / std |
|---|---|---|---|
| vit_base_patch16_224.augreg_in21k | vit | ImageNet-21K (augreg) | 0.5 / 0.5 |
| vit_base_patch16_224.augreg_in21k_ft_in1k | vit | IN-21K, ft IN-1K (the paper's) | 0.5 / 0.5 |
| vit_base_patch16_224.augreg2_in21k_ft_in1k | vit | IN-21K, IN-1K fine-tuned again | 0.5 / 0.5 |
| vit_base_patch16_224.dino | vit | DINO, self-supervised on IN-1K | ImageNet |
| vit_base_patch14_dinov2.lvd142m | dinov2 | DINOv2, self-supervised on LVD-142M | ImageNet |
| vit_base_patch16_clip_224.openai | clip | CLIP, image-text pairs (WIT-400M) | CLIP |

The normalisation is the `input.normalize` mode the weights were trained with (mean and std in
`data/augment.py`'s `MEAN_STD`): 0.5 / 0.5 is `minus_one_one`, ImageNet's (0.485, 0.456,
0.406) / (0.229, 0.224, 0.225) `imagenet`, CLIP's (0.481, 0.458, 0.408) / (0.269, 0.261,
0.276) `clip`. timm's plain `vit_base_patch16_224` means `augreg2_in21k_ft_in1k` in timm >= 0.9;
the official codes of LAE (timm 0.5.4), CODA-Prompt (timm 0.4.12) and InfLoRA (timm 0.6.7) call
it (docs/data.md).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Weights:
    """One published backbone: `name` is timm's `<model>.<tag>` (the Hugging Face repo
    `timm/<name>`)."""

    name: str
    family: str
    pretraining: str
    normalize: str  # input.normalize mode: minus_one_one | imagenet | clip
    patch_size: int
    image_size: int  # the size it was trained at (the position embedding's grid)
    original: str  # where its authors published it
    sha256: str | None = None  # of timm's model.safetensors, where known

    @property
    def hub_id(self) -> str:
        return f"timm/{self.name}"

    @property
    def checkpoint(self) -> str:
        return f"hf-hub:{self.hub_id}"


_AUGREG = "https://storage.googleapis.com/vit_models/augreg/"
WEIGHTS: dict[str, Weights] = {
    w.name: w
    for w in (
        Weights(
            "vit_base_patch16_224.augreg_in21k",
            "vit",
            "ImageNet-21K (augreg, 300 epochs)",
            "minus_one_one",
            16,
            224,
            _AUGREG + "B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0.npz",
        ),
        Weights(
            "vit_base_patch16_224.augreg_in21k_ft_in1k",
            "vit",
            "ImageNet-21K, fine-tuned on ImageNet-1K (augreg; the paper's backbone)",
            "minus_one_one",
            16,
            224,
            _AUGREG + "B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0--imagenet2012"
            "-steps_20k-lr_0.01-res_224.npz",
        ),
        Weights(
            "vit_base_patch16_224.augreg2_in21k_ft_in1k",
            "vit",
            "ImageNet-21K, fine-tuned on ImageNet-1K again by timm (timm >= 0.9's default of "
            "vit_base_patch16_224)",
            "minus_one_one",
            16,
            224,
            "https://huggingface.co/timm/vit_base_patch16_224.augreg2_in21k_ft_in1k",
        ),
        Weights(
            "vit_base_patch16_224.dino",
            "vit",
            "DINO, self-supervised on ImageNet-1K",
            "imagenet",
            16,
            224,
            "https://dl.fbaipublicfiles.com/dino/dino_vitbase16_pretrain/"
            "dino_vitbase16_pretrain.pth",
        ),
        Weights(
            "vit_base_patch14_dinov2.lvd142m",
            "dinov2",
            "DINOv2, self-supervised on LVD-142M",
            "imagenet",
            14,
            518,
            "https://dl.fbaipublicfiles.com/dinov2/dinov2_vitb14/dinov2_vitb14_pretrain.pth",
        ),
        Weights(
            "vit_base_patch16_clip_224.openai",
            "clip",
            "CLIP image tower, OpenAI (image-text pairs, WIT-400M)",
            "clip",
            16,
            224,
            "https://openaipublic.azureedge.net/clip/models/"
            "5806e77cd80f8b59890b7e101eabd078d9fb84e6937f9e85e4ecb61988df416f/ViT-B-16.pt",
        ),
    )
}


def get(name: str) -> Weights:
    """The entry of `model.weights=name`; an unknown name is refused naming the known ones."""
    if name not in WEIGHTS:
        raise ValueError(f"model.weights={name!r} is unknown; valid: {', '.join(WEIGHTS)}.")
    return WEIGHTS[name]


def family_of_names(names) -> tuple[str, str]:
    """`(family, evidence)` of a checkpoint from its Linen parameter names: a pre-norm without
    a patch-embedding bias is clip, layer scales are dinov2, anything else vit."""
    names = set(names)
    if any("/LayerScale_" in n for n in names):
        return "dinov2", "layer scale ls1/ls2"
    if "Transformer/pre_norm/scale" in names and "embedding/bias" not in names:
        return "clip", "norm_pre, no patch-embedding bias"
    return "vit", "no layer scale, no norm_pre"
