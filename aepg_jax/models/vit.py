"""Vision Transformer (Linen) with the parameter names of google-research/vision_transformer.

Tree (docs/algorithm.md §3): `embedding` (patch conv), `cls`,
`Transformer/posembed_input/pos_embedding`,
`Transformer/encoderblock_i/{LayerNorm_0, MultiHeadDotProductAttention_0/{query,key,value,out},
LayerNorm_1, MlpBlock_0/{Dense_0,Dense_1}}`, `Transformer/encoder_norm`, and the growing
classifier `head/task_j`. PEFT modules add `.../lora`, `.../adapter` or `.../prefix` subtrees
(see `peft.py`). Numerics follow timm's `VisionTransformer` (the paper's reference): pre-norm
blocks, LayerNorm eps 1e-6, exact (erf) GELU, no dropout.

Families (`model.family`, `FAMILIES`), each timm's layout of its published weights:

    vit     the above (augreg / timm standard ViT: IN-21K, IN-21K-ft-IN-1K, DINO)
    dinov2  the above plus layer scale: `x + g1 * Attn(LN x)`, `x + g2 * MLP(LN x)`, with
            `encoderblock_i/LayerScale_{0,1}/scale` (D,) (timm's `ls1.gamma`, `ls2.gamma`)
    clip    a LayerNorm after the position embedding, before the blocks
            (`Transformer/pre_norm`, timm's `norm_pre`), no patch-embedding bias, QuickGELU
            `x * sigmoid(1.702 x)`, every LayerNorm eps 1e-5

    logits, out = model.apply({"params": params}, images)   # images (B, S, S, C), normalised
    out["features"]   # final-norm cls token (B, D)
    out["tokens"]     # final-norm token sequence (B, 1 + N, D), with return_tokens=True

External prefixes (the prompt baselines, docs/algorithm.md §10): `model.apply(..., prefixes={l:
(P_k, P_v)})` with P_k, P_v (B, L_p, D) appends L_p key and value tokens to the attention of
block l (split into heads like the keys; queries and sequence length unchanged; plain softmax,
no compensation). A block without an entry, or with L_p = 0, computes exactly what it would
without prefixes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from aepg_jax.models import head as head_lib
from aepg_jax.models import peft as peft_lib

LN_EPS = 1e-6


@dataclasses.dataclass(frozen=True)
class Family:
    """What a model family changes in the ViT (docstring above)."""

    ln_eps: float = LN_EPS
    activation: str = "gelu"  # gelu (exact erf) | quick_gelu
    patch_bias: bool = True
    pre_norm: bool = False
    layer_scale: bool = False


FAMILIES: dict[str, Family] = {
    "vit": Family(),
    "dinov2": Family(layer_scale=True),
    "clip": Family(ln_eps=1e-5, activation="quick_gelu", patch_bias=False, pre_norm=True),
}


def family_of(name: str) -> Family:
    """The `Family` of `model.family`; an unknown name is refused naming the valid ones."""
    if name not in FAMILIES:
        raise ValueError(f"model.family={name!r} is unknown; valid: {', '.join(FAMILIES)}.")
    return FAMILIES[name]


def quick_gelu(x: jax.Array) -> jax.Array:
    """CLIP's activation `x * sigmoid(1.702 x)`."""
    return x * jax.nn.sigmoid(1.702 * x)


# {block index: (key prefix, value prefix)}, each (B, L_p, D).
Prefixes = dict[int, tuple[jax.Array, jax.Array]]

PRESETS: dict[str, dict[str, int]] = {
    # ViT-B/16 at 224 px, the paper's backbone (augreg i21k weights).
    "vit_b16": dict(
        patch_size=16, hidden_size=768, depth=12, num_heads=12, mlp_dim=3072, image_size=224
    ),
    "vit_s16": dict(
        patch_size=16, hidden_size=384, depth=12, num_heads=6, mlp_dim=1536, image_size=224
    ),
    "vit_ti16": dict(
        patch_size=16, hidden_size=192, depth=12, num_heads=3, mlp_dim=768, image_size=224
    ),
    # CPU preset: 28 px grayscale-as-RGB images (Fashion-MNIST / digits), 16 patches.
    "vit_tiny": dict(
        patch_size=7, hidden_size=64, depth=4, num_heads=4, mlp_dim=256, image_size=28
    ),
}

# The architecture fields of a model config (a preset's fields and the input channels).
ARCH_FIELDS: tuple[str, ...] = (*PRESETS["vit_b16"], "num_channels")
DEFAULT_FAMILY = "vit"


def model_config(preset: str = "vit_b16", **overrides: Any) -> ml_collections.ConfigDict:
    """The model config of a preset, with top-level fields (or `peft={...}`) overridden.

    Fields: patch_size, hidden_size, depth, num_heads, mlp_dim, image_size, num_channels (3),
    family (vit | dinov2 | clip, `FAMILIES`), dtype (compute dtype: float32 | bfloat16;
    parameters, head and logits stay float32), and
    `peft` {kind (none|lora|adapter|prefix), blocks, lora_rank, adapter_dim,
    prefix_length, adapter_style (attn|ffn), adapter_scale (ffn's fixed scale)}, defaults
    from the paper's Table 5 (blocks 0-4, cut at the depth).
    """
    if preset not in PRESETS:
        raise ValueError(f"Unknown model preset {preset!r}; valid: {', '.join(PRESETS)}.")
    peft = dataclasses.asdict(peft_lib.PeftConfig())
    cfg = ml_collections.ConfigDict(
        {
            **PRESETS[preset],
            "num_channels": 3,
            "family": DEFAULT_FAMILY,
            "dtype": "float32",
            "peft": peft,
        }
    )
    for key, value in overrides.items():
        if key not in cfg:
            raise KeyError(f"Unknown model config field {key!r}; valid: {', '.join(cfg)}.")
        if key == "peft":
            unknown = sorted(set(value) - set(peft))
            if unknown:
                raise KeyError(f"Unknown peft field(s) {unknown}; valid: {', '.join(peft)}.")
            cfg.peft.update(value)
        else:
            cfg[key] = value
    if "blocks" not in overrides.get("peft", {}):
        # Default blocks 0-4, cut at the depth (the tiny preset has 4 blocks).
        cfg.peft.blocks = tuple(b for b in peft["blocks"] if b < cfg.depth)
    return cfg


class MlpBlock(nn.Module):
    """`Dense(mlp_dim) -> GELU -> Dense(D)`."""

    mlp_dim: int
    dtype: Any = jnp.float32  # compute dtype; parameters stay float32
    activation: str = "gelu"  # gelu (exact erf) | quick_gelu

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        width = x.shape[-1]
        dense = lambda features: nn.Dense(
            features,
            dtype=self.dtype,
            kernel_init=nn.initializers.xavier_uniform(),
            bias_init=nn.initializers.normal(stddev=1e-6),
        )
        x = dense(self.mlp_dim)(x)
        if self.activation == "quick_gelu":
            x = quick_gelu(x)
        else:
            x = nn.gelu(x, approximate=False)
        return dense(width)(x)


class MultiHeadDotProductAttention(nn.Module):
    """Self-attention `softmax(q k^T / sqrt(Dh)) v` with optional LoRA, PEFT prefix and an
    external (prompt) prefix.

    q/k/v kernels are (D, H, Dh) and the out kernel (H, Dh, D), as in the published checkpoints.
    """

    num_heads: int
    lora_rank: int | None = None
    prefix_length: int | None = None
    dtype: Any = jnp.float32
    lora_targets: tuple[str, ...] = ("key", "value")

    @nn.compact
    def __call__(
        self, x: jax.Array, prefix: tuple[jax.Array, jax.Array] | None = None
    ) -> jax.Array:
        width = x.shape[-1]
        if width % self.num_heads:
            raise ValueError(f"hidden_size {width} is not divisible by num_heads {self.num_heads}.")
        head_dim = width // self.num_heads
        proj = lambda name: nn.DenseGeneral(
            (self.num_heads, head_dim),
            dtype=self.dtype,
            kernel_init=nn.initializers.xavier_uniform(),
            name=name,
        )
        qkv = {name: proj(name)(x) for name in ("query", "key", "value")}
        if self.lora_rank:
            deltas = peft_lib.LoRA(self.lora_rank, self.lora_targets, name="lora")(x)
            for name, delta in zip(self.lora_targets, deltas, strict=True):
                qkv[name] = qkv[name] + delta.reshape(qkv[name].shape)
        q, k, v = qkv["query"], qkv["key"], qkv["value"]
        if self.prefix_length:
            prefix_k, prefix_v = peft_lib.Prefix(self.prefix_length, self.num_heads, name="prefix")(
                width
            )
            k = peft_lib.insert_prefix(k, prefix_k)
            v = peft_lib.insert_prefix(v, prefix_v)
        if prefix is not None and prefix[0].shape[1]:
            # Appended after every token: softmax is order-free, and the compensated PEFT
            # prefix keeps its columns [1, 1 + L).
            k, v = (append_prefix(t, p) for t, p in zip((k, v), prefix, strict=True))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(head_dim).astype(q.dtype)
        weights = jax.nn.softmax(scores.astype(jnp.float32), axis=-1)
        if self.prefix_length:
            weights = peft_lib.compensate_prefix(weights, self.prefix_length)
        attended = jnp.einsum("bhqk,bkhd->bqhd", weights.astype(v.dtype), v)
        return nn.DenseGeneral(
            width,
            axis=(-2, -1),
            dtype=self.dtype,
            kernel_init=nn.initializers.xavier_uniform(),
            name="out",
        )(attended)


class LayerScale(nn.Module):
    """DINOv2's per-channel scale `g * x`, `scale` (D,)."""

    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.param("scale", nn.initializers.constant(1e-5), (x.shape[-1],))
        return x * scale.astype(self.dtype)


class Encoder1DBlock(nn.Module):
    """Pre-norm block `x + Attn(LN x) [+ adapter(LN x)]`, then `x + MLP(LN x) [+ adapter(x)]`
    (the adapter beside the attention or the MLP by `peft.adapter_style`, `peft.py`); with the
    dinov2 family `Attn` and `MLP` are scaled by their layer scales (the adapter is not)."""

    num_heads: int
    mlp_dim: int
    block_index: int
    peft: peft_lib.PeftConfig
    dtype: Any = jnp.float32
    family: Family = Family()

    @nn.compact
    def __call__(
        self, x: jax.Array, prefix: tuple[jax.Array, jax.Array] | None = None
    ) -> jax.Array:
        on = lambda kind: self.peft.on_block(kind, self.block_index)
        eps = self.family.ln_eps
        y = nn.LayerNorm(epsilon=eps, dtype=self.dtype)(x)
        attn = MultiHeadDotProductAttention(
            self.num_heads,
            lora_rank=self.peft.lora_rank if on("lora") else None,
            prefix_length=self.peft.prefix_length if on("prefix") else None,
            dtype=self.dtype,
            lora_targets=self.peft.lora_targets,
        )(y, prefix)
        if self.family.layer_scale:
            attn = LayerScale(self.dtype, name="LayerScale_0")(attn)
        adapter = peft_lib.Adapter(
            self.peft.adapter_dim,
            self.dtype,
            self.peft.adapter_style,
            self.peft.adapter_scale,
            name="adapter",
        )
        ffn_adapter = on("adapter") and self.peft.adapter_style == "ffn"
        if on("adapter") and not ffn_adapter:
            attn = attn + adapter(y)
        x = x + attn
        y = nn.LayerNorm(epsilon=eps, dtype=self.dtype)(x)
        mlp = MlpBlock(self.mlp_dim, self.dtype, self.family.activation)(y)
        if self.family.layer_scale:
            mlp = LayerScale(self.dtype, name="LayerScale_1")(mlp)
        if ffn_adapter:  # AdaptFormer's parallel adapter reads the MLP's unnormalised input
            mlp = mlp + adapter(x)
        return x + mlp


class Encoder(nn.Module):
    """Learned position embedding, [the clip family's pre-norm,] `depth` blocks, final
    LayerNorm."""

    depth: int
    num_heads: int
    mlp_dim: int
    peft: peft_lib.PeftConfig
    dtype: Any = jnp.float32
    family: Family = Family()

    @nn.compact
    def __call__(self, x: jax.Array, prefixes: Prefixes | None = None) -> jax.Array:
        eps = self.family.ln_eps
        x = AddPositionEmbs(name="posembed_input")(x)
        if self.family.pre_norm:
            x = nn.LayerNorm(epsilon=eps, dtype=self.dtype, name="pre_norm")(x)
        prefixes = prefixes or {}
        for i in range(self.depth):
            x = Encoder1DBlock(
                self.num_heads,
                self.mlp_dim,
                i,
                self.peft,
                self.dtype,
                self.family,
                name=f"encoderblock_{i}",
            )(x, prefixes.get(i))
        return nn.LayerNorm(epsilon=eps, dtype=self.dtype, name="encoder_norm")(x)


class AddPositionEmbs(nn.Module):
    """Adds a learned position embedding (1, 1 + N, D), cls slot included."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        pe = self.param("pos_embedding", nn.initializers.normal(stddev=0.02), (1, *x.shape[1:]))
        return x + pe.astype(x.dtype)


class VisionTransformer(nn.Module):
    """ViT returning `(logits, {"features", ["tokens"]})`; logits concatenate every task head."""

    patch_size: int = 16
    hidden_size: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_dim: int = 3072
    head_sizes: tuple[int, ...] = ()
    peft: peft_lib.PeftConfig = peft_lib.PeftConfig()
    dtype: Any = jnp.float32  # compute dtype (bfloat16 option); params, head, logits: float32
    family: Family = Family()

    @nn.compact
    def __call__(
        self,
        images: jax.Array,
        *,
        return_tokens: bool = False,
        prefixes: Prefixes | None = None,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        chex.assert_rank(images, 4)
        _check_prefixes(prefixes, images.shape[0], self.hidden_size, self.depth)
        if self.peft.kind != "none" and max(self.peft.blocks, default=-1) >= self.depth:
            raise ValueError(
                f"peft.blocks {list(self.peft.blocks)} name blocks beyond depth {self.depth}; "
                f"use indices in [0, {self.depth})."
            )
        p = self.patch_size
        x = nn.Conv(
            self.hidden_size,
            (p, p),
            strides=(p, p),
            padding="VALID",
            use_bias=self.family.patch_bias,
            dtype=self.dtype,
            name="embedding",
        )(images)
        batch, gh, gw, width = x.shape
        x = x.reshape(batch, gh * gw, width)
        cls = self.param("cls", nn.initializers.zeros, (1, 1, width))
        x = jnp.concatenate([jnp.broadcast_to(cls.astype(x.dtype), (batch, 1, width)), x], 1)
        x = Encoder(
            self.depth,
            self.num_heads,
            self.mlp_dim,
            self.peft,
            self.dtype,
            self.family,
            name="Transformer",
        )(x, prefixes)
        x = x.astype(jnp.float32)
        features = x[:, 0]
        logits = head_lib.TaskHeads(self.head_sizes, name="head")(features)
        out = {"features": features}
        if return_tokens:
            out["tokens"] = x
        return logits, out


def append_prefix(tokens: jax.Array, prefix: jax.Array) -> jax.Array:
    """`concat(tokens, prefix)` on the token axis: tokens (B, N, H, Dh), prefix (B, L, H * Dh)."""
    batch, _, heads, head_dim = tokens.shape
    prefix = prefix.astype(tokens.dtype).reshape(batch, -1, heads, head_dim)
    return jnp.concatenate([tokens, prefix], axis=1)


def _check_prefixes(prefixes: Prefixes | None, batch: int, width: int, depth: int) -> None:
    """Each entry: a block in [0, depth), key and value prefixes of one shape (B, L_p, D)."""
    for block, (pk, pv) in (prefixes or {}).items():
        if not 0 <= block < depth:
            raise ValueError(f"A prefix names block {block}; use blocks in [0, {depth}).")
        chex.assert_shape(pk, (batch, None, width))
        chex.assert_equal_shape((pk, pv))


def peft_from_config(cfg: ml_collections.ConfigDict) -> peft_lib.PeftConfig:
    """`PeftConfig` from the `peft` section of a model config."""
    return peft_lib.PeftConfig(
        kind=cfg.kind,
        blocks=tuple(int(b) for b in cfg.blocks),
        lora_rank=int(cfg.lora_rank),
        adapter_dim=int(cfg.adapter_dim),
        prefix_length=int(cfg.prefix_length),
        adapter_style=str(cfg.get("adapter_style", "attn")),
        adapter_scale=float(cfg.get("adapter_scale", 0.1)),
        lora_targets=tuple(cfg.get("lora_targets", ("key", "value"))),
    )


COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def compute_dtype(name: str) -> Any:
    """The jnp dtype of `model.dtype` (float32 | bfloat16)."""
    if name not in COMPUTE_DTYPES:
        raise ValueError(f"model.dtype={name!r} is unknown; valid: {', '.join(COMPUTE_DTYPES)}.")
    return COMPUTE_DTYPES[name]


def build(cfg: ml_collections.ConfigDict, head_sizes: tuple[int, ...] = ()) -> VisionTransformer:
    """A `VisionTransformer` from a model config (see `model_config`), with task heads."""
    if cfg.image_size % cfg.patch_size:
        raise ValueError(
            f"image_size {cfg.image_size} is not a multiple of patch_size {cfg.patch_size}."
        )
    if cfg.hidden_size % cfg.num_heads:
        raise ValueError(
            f"hidden_size {cfg.hidden_size} is not divisible by num_heads {cfg.num_heads}."
        )
    return VisionTransformer(
        patch_size=cfg.patch_size,
        hidden_size=cfg.hidden_size,
        depth=cfg.depth,
        num_heads=cfg.num_heads,
        mlp_dim=cfg.mlp_dim,
        head_sizes=tuple(int(n) for n in head_sizes),
        peft=peft_from_config(cfg.peft),
        dtype=compute_dtype(cfg.get("dtype", "float32")),
        family=family_of(cfg.get("family", DEFAULT_FAMILY)),
    )


def dummy_images(cfg: ml_collections.ConfigDict, batch: int = 1) -> jax.Array:
    """Zeros of the model's input shape (batch, S, S, C), for `init`."""
    return jnp.zeros((batch, cfg.image_size, cfg.image_size, cfg.num_channels), jnp.float32)


def init_params(
    cfg: ml_collections.ConfigDict, rng: jax.Array, head_sizes: tuple[int, ...] = ()
) -> dict[str, Any]:
    """Random parameters of `build(cfg, head_sizes)`.

    Runs eagerly: op-by-op dispatch reuses JAX's per-primitive caches, which is faster than
    compiling a fresh jitted init for every config (ViT-B/16 on CPU: 4.4 s vs 6.7 s).
    """
    return build(cfg, head_sizes).init(rng, dummy_images(cfg))["params"]
