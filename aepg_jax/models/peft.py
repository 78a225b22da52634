"""PEFT modules: LoRA, Adapter, Prefix (docs/algorithm.md §5, LAE's versions).

Each ViT block listed in `PeftConfig.blocks` gets its own module; their parameters live under
names containing `/lora/`, `/adapter/` or `/prefix/`, which `partition.py` labels `peft`.
D is the token width, H the number of heads, Dh = D / H.

  LoRA (K and V)        k = x W_k + s_k (x A_k^T) B_k^T,  v likewise; A (r, D) ~ U(+-1/sqrt(D)),
                        B (D, r) = 0, s = 1: the identity at initialisation. `lora_targets`
                        names the projections (K and V by default; Q and V for SD-LoRA).
  Adapter (parallel)    `adapter_style=attn` (LAE's): x + Attn(LN x) + s Up(GELU(Down(LN x))),
                        hidden m, s a learned scalar (init 1);
                        `adapter_style=ffn` (AdaptFormer's, as APER / RanPAC / EASE use it): with
                        x' = x + Attn(LN x), the block returns
                        x' + MLP(LN x') + s Up(ReLU(Down x')),
                        s = `adapter_scale` fixed (0.1), the bottleneck reading x' unnormalised.
                        Both: Down ~ U(+-1/sqrt(D)), bias 0; Up = 0: the identity at initialisation.
  Prefix (compensated)  L learned keys and values, P_k, P_v (L, D) ~ U(0, 0.01), each times a
                        scalar (init 1), split into heads and inserted after the cls position.
                        With `lam` = the softmax mass on the prefix columns, the prefix weights
                        are divided by `lam`, so attention = (1 - lam) attn_original + attn_prefix.
                        NOT the identity at initialisation: every attention output is scaled by
                        (1 - lam) (lam ~ L / (L + N) for near-zero prefix keys) and moved by the
                        prefix values' mean (~0.005); tests/test_models.py measures the change.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

PEFT_KINDS = ("none", "lora", "adapter", "prefix")
LORA_TARGETS = ("query", "key", "value")
ADAPTER_STYLES = ("attn", "ffn")  # beside the attention (LAE's) | beside the MLP (AdaptFormer's)
_PREFIX_EPS = 1e-12


@dataclasses.dataclass(frozen=True)
class PeftConfig:
    """Which PEFT module, on which blocks, of what size (paper Table 5 defaults)."""

    kind: str = "none"
    blocks: tuple[int, ...] = (0, 1, 2, 3, 4)
    lora_rank: int = 4
    adapter_dim: int = 5
    prefix_length: int = 10
    adapter_style: str = "attn"
    adapter_scale: float = 0.1  # the fixed s of adapter_style=ffn (AdaptFormer's "0.1")
    lora_targets: tuple[str, ...] = ("key", "value")  # the projections LoRA updates

    def __post_init__(self):
        if self.kind not in PEFT_KINDS:
            raise ValueError(f"peft.kind={self.kind!r} is unknown; valid: {', '.join(PEFT_KINDS)}.")
        for name in ("lora_rank", "adapter_dim", "prefix_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"peft.{name} must be >= 1; got {getattr(self, name)}.")
        if self.adapter_style not in ADAPTER_STYLES:
            raise ValueError(
                f"peft.adapter_style={self.adapter_style!r} is unknown; valid: "
                f"{', '.join(ADAPTER_STYLES)}."
            )
        if not self.lora_targets or not set(self.lora_targets) <= set(LORA_TARGETS):
            raise ValueError(
                f"peft.lora_targets={self.lora_targets!r}: use a subset of {LORA_TARGETS}."
            )
        if len(set(self.blocks)) != len(self.blocks) or any(b < 0 for b in self.blocks):
            raise ValueError(
                f"peft.blocks must be distinct non-negative indices; got {self.blocks}."
            )

    def on_block(self, kind: str, block: int) -> bool:
        """True when block `block` carries a module of kind `kind`."""
        return self.kind == kind and block in self.blocks


def _symmetric_uniform(bound: float) -> nn.initializers.Initializer:
    """U(-bound, bound)."""

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


def _uniform(low: float, high: float) -> nn.initializers.Initializer:
    """U(low, high)."""

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, low, high)

    return init


def _matmul_f32(x: jax.Array, w: jax.Array) -> jax.Array:
    """`x @ w` (w 2-D) accumulated and returned in float32, x in any float dtype."""
    dims = (((x.ndim - 1,), (0,)), ((), ()))
    return jax.lax.dot_general(x, w, dims, preferred_element_type=jnp.float32)


class LoRA(nn.Module):
    """Low-rank updates of the `targets` projections: returns one delta per target, in order.

    `delta = s (x A^T) B^T` with A (r, D_in), B (D_out, r); outputs have x's shape [..., D].
    """

    rank: int
    targets: tuple[str, ...] = ("key", "value")

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, ...]:
        width = x.shape[-1]
        a_init = _symmetric_uniform(1.0 / math.sqrt(width))

        def branch(name: str) -> jax.Array:
            a = self.param(f"{name}_A", a_init, (self.rank, width))
            b = self.param(f"{name}_B", nn.initializers.zeros, (width, self.rank))
            scale = self.param(f"{name}_scale", nn.initializers.ones, ())
            # The low-rank products take the float32 parameters as they are and run in
            # float32 (in float32 mode exactly `(x A^T) B^T`): with a bfloat16 compute dtype
            # the gradients of A and B are then summed over the batch, and across devices,
            # in float32, so an update does not depend on the device count.
            # `s (h B^T) = h (s B)^T`: the scale multiplies the (D, r) matrix, so its gradient
            # is `sum(B * dB)` over D x r instead of a sum over every token's (D,) delta, which
            # made XLA write each delta out in full (ViT-B/16 on one H100: ~29 MB per image).
            h = _matmul_f32(x, a.T)
            return _matmul_f32(h, (scale * b).T).astype(x.dtype)

        return tuple(branch(name) for name in self.targets)


class Adapter(nn.Module):
    """Parallel bottleneck adapter `s Up(act(Down(y)))`: style `attn` GELU and a learned `s`
    (added to the attention output), style `ffn` ReLU and `s = fixed_scale` (added to the MLP
    output; AdaptFormer's `Adapter` with `ffn_adapter_layernorm_option="none"`)."""

    hidden_dim: int
    dtype: Any = jnp.float32  # the output's dtype; parameters stay float32
    style: str = "attn"
    fixed_scale: float = 0.1  # style ffn only

    # The bottleneck computes in float32 whatever the model's compute dtype (a few hidden
    # units: no cost), so its gradients are summed over the batch and devices in float32.

    @nn.compact
    def __call__(self, y: jax.Array) -> jax.Array:
        width = y.shape[-1]
        h = nn.Dense(
            self.hidden_dim,
            dtype=jnp.float32,
            kernel_init=_symmetric_uniform(1.0 / math.sqrt(width)),
            bias_init=nn.initializers.zeros,
            name="down",
        )(y)
        h = nn.relu(h) if self.style == "ffn" else nn.gelu(h, approximate=False)
        h = nn.Dense(
            width,
            kernel_init=nn.initializers.zeros,
            bias_init=nn.initializers.zeros,
            dtype=jnp.float32,
            name="up",
        )(h)
        if self.style == "ffn":
            return (self.fixed_scale * h).astype(self.dtype)
        scale = self.param("scale", nn.initializers.ones, ())
        return (scale * h).astype(self.dtype)


class Prefix(nn.Module):
    """Learned key and value prefixes `(s_k P_k, s_v P_v)`, each returned as (L, H, Dh)."""

    length: int
    num_heads: int

    @nn.compact
    def __call__(self, width: int) -> tuple[jax.Array, jax.Array]:
        head_dim = width // self.num_heads

        def branch(name: str) -> jax.Array:
            prefix = self.param(name, _uniform(0.0, 0.01), (self.length, width))
            scale = self.param(f"{name}_scale", nn.initializers.ones, ())
            return (scale * prefix).reshape(self.length, self.num_heads, head_dim)

        return branch("key"), branch("value")


def insert_prefix(tokens: jax.Array, prefix: jax.Array) -> jax.Array:
    """Inserts `prefix` (L, H, Dh) after the cls position of `tokens` (B, N, H, Dh)."""
    batch = tokens.shape[0]
    # Broadcast, then cast: the gradient's sum over the batch (and devices) stays float32.
    prefix = jnp.broadcast_to(prefix, (batch, *prefix.shape)).astype(tokens.dtype)
    return jnp.concatenate([tokens[:, :1], prefix, tokens[:, 1:]], axis=1)


def compensate_prefix(weights: jax.Array, length: int) -> jax.Array:
    """Divides the attention weights on the prefix columns `[1, 1 + L)` by their sum `lam`.

    `weights` (B, H, Q, K) are softmax outputs over [cls, prefix, tokens]; the result applied
    to the values gives `(1 - lam) attn_original + attn_prefix`. `lam` is clamped at 1e-12.
    """
    prefix = weights[..., 1 : 1 + length]
    lam = jnp.maximum(jnp.sum(prefix, axis=-1, keepdims=True), _PREFIX_EPS)
    return jnp.concatenate([weights[..., :1], prefix / lam, weights[..., 1 + length :]], axis=-1)


def num_params(cfg: PeftConfig, width: int) -> int:
    """Trainable PEFT scalars for token width D over `len(cfg.blocks)` blocks.

    LoRA: 2 (2 r D + 1) per block; Adapter: 2 m D + m + D + 1 (style ffn: no scale, one
    fewer); Prefix: 2 (L D + 1).
    """
    per_block = {
        "none": 0,
        "lora": 2 * (2 * cfg.lora_rank * width + 1),
        "adapter": 2 * cfg.adapter_dim * width
        + cfg.adapter_dim
        + width
        + (cfg.adapter_style != "ffn"),
        "prefix": 2 * (cfg.prefix_length * width + 1),
    }[cfg.kind]
    return per_block * len(cfg.blocks)
