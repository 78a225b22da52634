"""The eager PyTorch/timm reference train step that `bench_step.py` times ours
against; see `bench_step.py`'s docstring for what it computes.

torch and timm are optional (not project dependencies): `load_torch_and_timm()` prints the
install commands and exits with status 2 without them.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import _timm_import
from step_harness import TOTAL_STEPS, Runner, make_batch, run_config

from aepg_jax.models import vit

TIMM_NAMES = {"vit_b16": "vit_base_patch16_224"}
TORCH_STYLES = ("timm", "lae")

INSTALL_HELP = """\
The PyTorch reference step needs torch and timm (missing: {missing}). Install them into the
project venv (CPU wheel; a plain `pip install timm` would pull a CUDA torch):
    .venv/bin/pip install torch==2.13.0
    .venv/bin/pip install --no-deps timm
    .venv/bin/pip install pyyaml huggingface_hub safetensors
or run only the JAX side with --jax-only."""


def load_torch_and_timm() -> tuple[Any, Any]:
    """`(torch, timm)`, or print the install commands and exit with status 2."""
    try:
        timm = _timm_import.import_timm()
    except _timm_import.TorchMissingError as err:
        print(INSTALL_HELP.format(missing=", ".join(err.missing)), file=sys.stderr)
        sys.exit(2)
    import torch

    return torch, timm


def _torch_peft_attention(torch: Any) -> type:
    """The attention module with LoRA / prefix / adapter that replaces timm's in PEFT blocks."""
    nn, F = torch.nn, torch.nn.functional

    def uniform(shape: tuple[int, ...], low: float, high: float) -> Any:
        return nn.Parameter(torch.empty(shape).uniform_(low, high))

    class PeftAttention(nn.Module):
        """timm `Attention` (its qkv/proj modules reused) plus one PEFT module
        (docs/algorithm.md §5).

        The adapter sits here because its input, LN1 x, is the attention's input: the block
        computes `x + Attn(LN1 x) + s Up(GELU(Down(LN1 x)))`.
        """

        def __init__(self, attn: Any, kind: str, peft: Any, style: str) -> None:
            super().__init__()
            self.qkv, self.proj = attn.qkv, attn.proj
            self.num_heads, self.head_dim = attn.num_heads, attn.head_dim
            self.kind, self.style = kind, style
            width = attn.qkv.in_features
            bound = 1.0 / math.sqrt(width)
            if kind == "lora":
                r = peft.lora_rank
                self.lora_a = nn.ParameterList([uniform((r, width), -bound, bound) for _ in "kv"])
                self.lora_b = nn.ParameterList([nn.Parameter(torch.zeros(width, r)) for _ in "kv"])
                self.lora_s = nn.ParameterList([nn.Parameter(torch.tensor(1.0)) for _ in "kv"])
            elif kind == "adapter":
                self.down = nn.Linear(width, peft.adapter_dim)
                self.up = nn.Linear(peft.adapter_dim, width)
                with torch.no_grad():
                    self.down.weight.uniform_(-bound, bound)
                    self.down.bias.zero_()
                    self.up.weight.zero_()
                    self.up.bias.zero_()
                self.adapter_s = nn.Parameter(torch.tensor(1.0))
            elif kind == "prefix":
                self.length = peft.prefix_length
                self.prefix = nn.ParameterList(
                    [uniform((self.length, width), 0.0, 0.01) for _ in "kv"]
                )
                self.prefix_s = nn.ParameterList([nn.Parameter(torch.tensor(1.0)) for _ in "kv"])
            else:
                raise ValueError(f"Unknown PEFT kind {kind!r}.")

        def _qkv(self, x: Any) -> tuple[Any, Any, Any]:
            if self.kind == "lora" and self.style == "lae":
                # LAE's KVLoRA: the low-rank update merged into the fused qkv weight.
                delta = torch.cat(
                    [
                        s * (b @ a)
                        for s, a, b in zip(self.lora_s, self.lora_a, self.lora_b, strict=True)
                    ],
                    0,
                )
                weight = self.qkv.weight + torch.cat(
                    [torch.zeros_like(self.qkv.weight)[: -delta.shape[0]], delta], 0
                )
                return F.linear(x, weight, self.qkv.bias).chunk(3, dim=-1)
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            if self.kind == "lora":
                dk, dv = (
                    s * ((x @ a.t()) @ b.t())
                    for s, a, b in zip(self.lora_s, self.lora_a, self.lora_b, strict=True)
                )
                k, v = k + dk, v + dv
            elif self.kind == "prefix":
                batch = x.shape[0]
                pk, pv = (
                    (s * p).expand(batch, -1, -1)
                    for s, p in zip(self.prefix_s, self.prefix, strict=True)
                )
                k = torch.cat([k[:, :1], pk, k[:, 1:]], dim=1)
                v = torch.cat([v[:, :1], pv, v[:, 1:]], dim=1)
            return q, k, v

        def forward(self, x: Any, attn_mask: Any = None, is_causal: bool = False) -> Any:
            del attn_mask, is_causal  # timm's Block passes them; a ViT uses neither
            batch, n, width = x.shape
            q, k, v = self._qkv(x)
            heads = lambda t: t.reshape(batch, -1, self.num_heads, self.head_dim).transpose(1, 2)
            q, k, v = heads(q), heads(k), heads(v)
            if self.kind == "prefix" or self.style == "lae":
                weights = ((q * self.head_dim**-0.5) @ k.transpose(-2, -1)).softmax(dim=-1)
                if self.kind == "prefix":
                    s, t = 1, 1 + self.length
                    lam = weights[..., s:t].sum(dim=-1, keepdim=True).clamp(min=1e-12)
                    weights = torch.cat(
                        [weights[..., :s], weights[..., s:t] / lam, weights[..., t:]], dim=-1
                    )
                out = weights @ v
            else:
                out = F.scaled_dot_product_attention(q, k, v)
            out = self.proj(out.transpose(1, 2).reshape(batch, n, width))
            if self.kind == "adapter":
                out = out + self.adapter_s * self.up(F.gelu(self.down(x)))
            return out

    return PeftAttention


def _torch_augment(torch: Any, gen: Any, images: Any, out: int, cfg: Any) -> Any:
    """RandomResizedCrop + flip + normalise of a uint8 NHWC batch -> float32 NCHW, torch ops.

    The box follows torchvision's `RandomResizedCrop.get_params` (10 attempts, then the
    centered fallback); the resize is `F.interpolate(bilinear, antialias=True)`, torchvision's
    tensor path.
    """
    F = torch.nn.functional
    batch, height, width, _ = images.shape
    area = height * width
    (s_lo, s_hi), (r_lo, r_hi) = cfg.data.crop_scale, cfg.data.crop_ratio
    log_lo, log_hi = math.log(r_lo), math.log(r_hi)
    x = images.permute(0, 3, 1, 2)
    crops = []
    for i in range(batch):
        box = None
        for _ in range(10):
            u = torch.rand(4, generator=gen).tolist()
            target = area * (s_lo + (s_hi - s_lo) * u[0])
            aspect = math.exp(log_lo + (log_hi - log_lo) * u[1])
            w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                box = (int(u[2] * (height - h + 1)), int(u[3] * (width - w + 1)), h, w)
                break
        if box is None:  # torchvision's fallback for a square image: the whole image
            side = min(height, width)
            box = ((height - side) // 2, (width - side) // 2, side, side)
        top, left, h, w = box
        crop = x[i : i + 1, :, top : top + h, left : left + w].float()
        crop = F.interpolate(
            crop, size=(out, out), mode="bilinear", align_corners=False, antialias=True
        )
        if torch.rand(1, generator=gen).item() < cfg.data.flip_prob:
            crop = crop.flip(-1)
        crops.append(crop)
    return ((torch.cat(crops).clamp_(0, 255) / 255.0 - 0.5) / 0.5).clamp_(-1.0, 1.0)


def _torch_model(torch: Any, timm: Any, cfg: Any, model: str, num_classes: int) -> Any:
    m = cfg.model
    if model in TIMM_NAMES:
        net = timm.create_model(
            TIMM_NAMES[model], pretrained=False, num_classes=num_classes, img_size=m.image_size
        )
    else:
        from timm.models.vision_transformer import VisionTransformer

        net = VisionTransformer(
            img_size=m.image_size,
            patch_size=m.patch_size,
            embed_dim=m.hidden_size,
            depth=m.depth,
            num_heads=m.num_heads,
            mlp_ratio=m.mlp_dim / m.hidden_size,
            num_classes=num_classes,
        )
    with torch.no_grad():
        net.head.weight.normal_(0.0, 1e-3)
        net.head.bias.zero_()
    return net


def make_torch_runner(
    torch: Any,
    timm: Any,
    model: str = "vit_b16",
    kind: str = "lora",
    batch: int = 8,
    image_size: int | None = None,
    num_classes: int = 20,
    loss: str = "ce",
    style: str = "timm",
    seed: int = 0,
    dtype: str = "float32",
) -> Runner:
    """The eager PyTorch reference step (see the module docstring) on the same uint8 batch."""
    if style not in TORCH_STYLES:
        raise ValueError(f"Unknown torch style {style!r}; valid: {', '.join(TORCH_STYLES)}.")
    start = time.perf_counter()
    cfg = run_config(model, kind, loss, image_size, dtype)
    torch.manual_seed(seed)
    net = _torch_model(torch, timm, cfg, model, num_classes)
    for p in net.parameters():
        p.requires_grad_(False)
    peft_cfg = vit.peft_from_config(cfg.model.peft)
    attention = _torch_peft_attention(torch)
    for i, blk in enumerate(net.blocks):
        if i in peft_cfg.blocks:
            blk.attn = attention(blk.attn, kind, peft_cfg, style)
        elif style == "lae":
            blk.attn.fused_attn = False  # LAE's own Attention computes the softmax explicitly
    for p in net.head.parameters():
        p.requires_grad_(True)
    net.train()
    trainable = [p for p in net.parameters() if p.requires_grad]
    o = cfg.optim
    optimizer = torch.optim.Adam(trainable, lr=o.learning_rate, betas=(o.b1, o.b2), eps=o.eps)
    host_batch = make_batch(batch, cfg.data.store_size, num_classes, seed)
    images = torch.from_numpy(host_batch["image"])
    labels = torch.from_numpy(host_batch["label"]).long()
    gen = torch.Generator().manual_seed(seed)
    tau = cfg.schedule.tau
    counter = {"t": 0}

    def step() -> None:
        x = _torch_augment(torch, gen, images, cfg.model.image_size, cfg)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
            logits = net(x)
        ce = torch.nn.functional.cross_entropy(logits.float(), labels, reduction="none")
        if loss == "aepg":
            t = counter["t"]
            alpha = 1.0 / (1.0 + math.exp(-tau * (TOTAL_STEPS - 2 * t) / TOTAL_STEPS))
            p_y = torch.exp(-ce)
            value = (alpha * ce - (1.0 - alpha) * p_y).mean()
        else:
            value = ce.mean()
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        optimizer.step()
        counter["t"] += 1

    return Runner("torch", step, time.perf_counter() - start, batch, net)
