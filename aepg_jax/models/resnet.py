"""ResNets for 32x32 images (paper Table 4, docs/algorithm.md §9, §16), Flax Linen.

torchvision's ResNet with a CIFAR stem: `conv3x3(64, stride 1) + BN + ReLU`, no max-pool; then
four stages (widths `w, 2w, 4w, 8w`, stride 2 at the first block of stages 2-4, in the 3x3
conv), global average pooling and a Dense head. Blocks:

    basic       x -> conv3x3 BN ReLU conv3x3 BN (+ shortcut) ReLU                  (expansion 1)
    bottleneck  x -> conv1x1 BN ReLU conv3x3 BN ReLU conv1x1(4 w) BN (+ shortcut) ReLU  (exp. 4)

The shortcut is the identity, or `conv1x1(stride) + BN` when the shape changes. Presets:
`resnet50` (bottleneck, [3, 4, 6, 3]: 23,705,252 parameters with 100 classes, 23,520,842 with
10), `resnet18` (basic, [2, 2, 2, 2]) and `resnet_small` (basic, [1, 1, 1], width 16: a few
seconds per 1,000 images on a CPU).

PyTorch defaults: convolutions have no bias and Kaiming-normal fan-out init
(`std = sqrt(2 / (k * k * out))`); BatchNorm scale 1, bias 0, `eps = 1e-5` and running
statistics `r <- 0.9 r + 0.1 batch` (torch momentum 0.1 is Flax momentum 0.9) kept in the
`batch_stats` collection; Dense kernel and bias `U(-1/sqrt(in), 1/sqrt(in))`. One difference:
Flax's running variance is the biased batch variance, torch's the unbiased one (a factor
`n / (n - 1)` with n = batch x H x W values per channel: 1.0000038 for 32 x 32 maps at batch
256; 1.00024 at n = 4,096, the smallest n of these runs: 4 x 4 maps at batch 256, or 8 x 8 at
the scratch default's batch 64). `train=True` normalises with the
batch statistics and updates the running ones (apply with `mutable=['batch_stats']`);
`train=False` uses the running ones.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

BLOCKS = ("basic", "bottleneck")
PRESETS: dict[str, dict[str, Any]] = {
    "resnet50": dict(block="bottleneck", stage_sizes=(3, 4, 6, 3), width=64),
    "resnet18": dict(block="basic", stage_sizes=(2, 2, 2, 2), width=64),
    "resnet_small": dict(block="basic", stage_sizes=(1, 1, 1), width=16),
}

conv_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")  # kaiming_normal_ fan_out
dense_kernel_init = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


def torch_dense_bias_init(fan_in: int) -> nn.initializers.Initializer:
    """torch `nn.Linear` bias: `U(-1/sqrt(fan_in), 1/sqrt(fan_in))`."""
    bound = 1.0 / fan_in**0.5

    def init(key: jax.Array, shape: Sequence[int], dtype: Any = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


def _norm(train: bool, name: str | None = None) -> nn.BatchNorm:
    """BatchNorm with torch's defaults (momentum 0.1, eps 1e-5)."""
    return nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5, name=name)


def _conv(features: int, kernel: int, stride: int = 1, name: str | None = None) -> nn.Conv:
    pad = (kernel - 1) // 2
    return nn.Conv(
        features,
        (kernel, kernel),
        (stride, stride),
        padding=((pad, pad), (pad, pad)),
        use_bias=False,
        kernel_init=conv_init,
        name=name,
    )


class BasicBlock(nn.Module):
    """Two 3x3 convs; expansion 1."""

    width: int
    stride: int = 1
    expansion = 1

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        out = self.width * self.expansion
        y = nn.relu(_norm(train)(_conv(self.width, 3, self.stride)(x)))
        y = _norm(train)(_conv(out, 3)(y))
        return nn.relu(y + _shortcut(x, out, self.stride, train))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carries the stride, torchvision v1.5), 1x1 expand x4."""

    width: int
    stride: int = 1
    expansion = 4

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        out = self.width * self.expansion
        y = nn.relu(_norm(train)(_conv(self.width, 1)(x)))
        y = nn.relu(_norm(train)(_conv(self.width, 3, self.stride)(y)))
        y = _norm(train)(_conv(out, 1)(y))
        return nn.relu(y + _shortcut(x, out, self.stride, train))


def _shortcut(x: jax.Array, out: int, stride: int, train: bool) -> jax.Array:
    """Identity, or a projection `conv1x1(stride) + BN` when the shape changes.

    Called inside a block's compact `__call__`, so its modules are the block's submodules.
    """
    if stride == 1 and x.shape[-1] == out:
        return x
    return _norm(train, "proj_norm")(_conv(out, 1, stride, name="proj_conv")(x))


class ResNet(nn.Module):
    """CIFAR ResNet: `(B, H, W, C)` float images -> `(B, num_classes)` float32 logits."""

    num_classes: int
    block: str = "bottleneck"
    stage_sizes: Sequence[int] = (3, 4, 6, 3)
    width: int = 64

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        chex.assert_rank(x, 4)
        block_cls = {"basic": BasicBlock, "bottleneck": Bottleneck}[self.block]
        x = nn.relu(_norm(train)(_conv(self.width, 3, name="stem_conv")(x)))
        for stage, count in enumerate(self.stage_sizes):
            for i in range(count):
                stride = 2 if stage > 0 and i == 0 else 1
                x = block_cls(self.width * 2**stage, stride, name=f"stage{stage}_block{i}")(
                    x, train
                )
        features = jnp.mean(x, axis=(1, 2))
        logits = nn.Dense(
            self.num_classes,
            kernel_init=dense_kernel_init,
            bias_init=torch_dense_bias_init(features.shape[-1]),
            name="head",
        )(features)
        chex.assert_shape(logits, (x.shape[0], self.num_classes))
        return logits


@dataclasses.dataclass(frozen=True)
class ResNetSpec:
    """The config fields of a ResNet (see `ResNet`)."""

    block: str
    stage_sizes: tuple[int, ...]
    width: int


def preset(name: str) -> ResNetSpec:
    """The `ResNetSpec` of a preset name (resnet50 | resnet18 | resnet_small)."""
    if name not in PRESETS:
        raise ValueError(f"Unknown ResNet preset {name!r}; valid: {', '.join(PRESETS)}.")
    p = PRESETS[name]
    return ResNetSpec(p["block"], tuple(p["stage_sizes"]), p["width"])


def build(spec: ResNetSpec, num_classes: int) -> ResNet:
    """The `ResNet` module of `spec` with a `num_classes`-way head."""
    if spec.block not in BLOCKS:
        raise ValueError(f"Unknown block {spec.block!r}; valid: {', '.join(BLOCKS)}.")
    return ResNet(num_classes, spec.block, tuple(spec.stage_sizes), spec.width)


def init_variables(
    model: ResNet, key: jax.Array, image_size: int, channels: int = 3
) -> dict[str, Any]:
    """`{'params': ..., 'batch_stats': ...}` of `model` for `image_size` square inputs."""
    return model.init(key, jnp.zeros((1, image_size, image_size, channels)), train=False)


def init_seeds(model: ResNet, keys: jax.Array, image_size: int) -> dict[str, Any]:
    """`init_variables` for a stack of keys `(S, 2)`: variables with a leading seed axis.

    One jitted, vmapped program (entry i equals `init_variables(model, keys[i], ...)`), traced
    with `jax.threefry_partitionable(False)`: XLA:CPU compiles the partitionable threefry of the
    initialisers about 3x slower (9 s for a tiny ResNet); the values stay a pure function of the
    key.
    """
    chex.assert_rank(keys, 2)
    init = jax.vmap(functools.partial(init_variables, model, image_size=image_size))
    with jax.threefry_partitionable(False):
        return jax.jit(init)(keys)


@functools.cache
def _count(spec: ResNetSpec, num_classes: int, image_size: int) -> int:
    shapes = jax.eval_shape(
        functools.partial(init_variables, build(spec, num_classes), image_size=image_size),
        jax.random.PRNGKey(0),
    )
    return sum(x.size for x in jax.tree.leaves(shapes["params"]))


def count_params(spec: ResNetSpec, num_classes: int, image_size: int = 32) -> int:
    """Trainable parameters (batch statistics excluded), without allocating any."""
    return _count(spec, num_classes, image_size)
