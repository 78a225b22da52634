"""Device-side augmentation of uint8 image batches (B, S, S, C), in pure, jittable JAX.

Images come from the decode-once cache at the storage resolution `S` (`resize.store_resize`);
sizes are static Python ints, randomness comes from explicit keys.

    * train: torchvision `RandomResizedCrop(out, scale, ratio, BILINEAR)` + `RandomHorizontalFlip`
      + `normalize`; the crop is drawn from the stored `S x S` image (not the original one).
    * test:  `CenterCrop(out)` of the stored image + `normalize`; with `S = 256`, `out = 224`
      this is exactly torchvision's `Resize(256)` + `CenterCrop(224)` (see `test_transform`).

Geometry uses continuous pixel-edge coordinates: input pixel `i` covers `[i, i + 1)` with its
center at `i + 0.5`. A crop box `(top, left, h, w)` maps onto the `out x out` output by
`y_out = (y_in - top) * out / h` (same for x), i.e. `jax.image.scale_and_translate` with
`scale = out / h` and `translation = -top * scale`; that function samples input position
`(o + 0.5 - translation) / scale - 0.5` (in pixel-center units) for output pixel `o`, so a box
with `out == h` samples exactly the integer pixels `top + o` and reproduces slicing.
"""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp

Array = jax.Array

NORMALIZE_MODES = ("minus_one_one", "none", "imagenet", "clip")
# (mean, std) per RGB channel of the modes that standardise.
MEAN_STD = {
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "clip": ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
}
_ATTEMPTS = 10  # torchvision RandomResizedCrop.get_params tries 10 boxes before its fallback.


def normalize(images: Array, mode: str = "minus_one_one") -> Array:
    """Float pixels in [0, 255] -> float32 model input.

    `'minus_one_one'`: `(x / 255 - 0.5) / 0.5` in [-1, 1] (the augreg ViT weights' input);
    `'none'`: `x / 255` in [0, 1] (what the LAE codebase fed, `ToTensor()` only);
    `'imagenet'` / `'clip'`: `(x / 255 - mean) / std` per channel with ImageNet's or CLIP's
    mean and std (`MEAN_STD`; DINO, DINOv2 and CLIP weights' input).
    """
    if mode not in NORMALIZE_MODES:
        raise ValueError(
            f"Unknown normalize mode {mode!r}. Valid modes: {', '.join(NORMALIZE_MODES)}."
        )
    x = jnp.asarray(images).astype(jnp.float32) / 255.0
    if mode in MEAN_STD:
        mean, std = (jnp.asarray(v, jnp.float32) for v in MEAN_STD[mode])
        return (jnp.clip(x, 0.0, 1.0) - mean) / std
    if mode == "minus_one_one":
        x = (x - 0.5) / 0.5
    # Clip the float rounding (XLA turns `/ 255` into `* (1 / 255)`: 255 -> 1.0000001).
    return jnp.clip(x, -1.0 if mode == "minus_one_one" else 0.0, 1.0)


def _check_interval(name: str, interval: tuple[float, float]) -> tuple[float, float]:
    lo, hi = (float(v) for v in interval)
    if not 0.0 < lo <= hi:
        raise ValueError(f"{name} must be an interval (lo, hi) with 0 < lo <= hi; got {interval}.")
    return lo, hi


def _fallback_box(height: int, width: int, ratio: tuple[float, float]) -> tuple[int, ...]:
    """torchvision's fallback: the whole image with its aspect ratio clamped to `ratio`, centered.

    Offsets use floor division `(H - h) // 2` (not `CenterCrop`'s rounding), as torchvision does.
    """
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def sample_crop_boxes(
    key: Array,
    batch: int,
    height: int,
    width: int,
    scale: tuple[float, float] = (0.05, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[Array, Array, Array, Array]:
    """`batch` boxes `(top, left, crop_h, crop_w)`, float32 (B,) each, integer-valued.

    torchvision `RandomResizedCrop.get_params`: per sample, 10 attempts with area fraction
    `s ~ U(scale)` and `log r ~ U(log ratio)`, `w = round(sqrt(s H W r))`,
    `h = round(sqrt(s H W / r))` (round half to even, like Python's `round`); the first attempt
    with `0 < w <= W` and `0 < h <= H` is kept and placed at `top ~ U{0..H-h}`,
    `left ~ U{0..W-w}`. If none fits, the fallback is the whole image with its aspect ratio
    clamped to `ratio`, centered. All attempts are drawn at once (no loop over samples).
    """
    scale = _check_interval("scale", scale)
    ratio = _check_interval("ratio", ratio)
    # One draw of 2 * 10 + 2 uniforms per sample (area, log ratio per attempt; top, left).
    u = jax.random.uniform(key, (batch, 2 * _ATTEMPTS + 2), jnp.float32)
    frac = scale[0] + (scale[1] - scale[0]) * u[:, :_ATTEMPTS]
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = jnp.exp(log_lo + (log_hi - log_lo) * u[:, _ATTEMPTS : 2 * _ATTEMPTS])
    target_area = (height * width) * frac
    w = jnp.round(jnp.sqrt(target_area * aspect))
    h = jnp.round(jnp.sqrt(target_area / aspect))
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = jnp.argmax(fits, axis=1)[:, None]  # index of the first fitting attempt (0 if none)
    found = jnp.any(fits, axis=1)
    fb_top, fb_left, fb_h, fb_w = _fallback_box(height, width, ratio)
    crop_h = jnp.where(found, jnp.take_along_axis(h, first, axis=1)[:, 0], fb_h)
    crop_w = jnp.where(found, jnp.take_along_axis(w, first, axis=1)[:, 0], fb_w)
    # Uniform integer offsets in {0, ..., H - h}: floor(u * (H - h + 1)), guarded against u*n == n.
    top = jnp.minimum(jnp.floor(u[:, -2] * (height - crop_h + 1)), height - crop_h)
    left = jnp.minimum(jnp.floor(u[:, -1] * (width - crop_w + 1)), width - crop_w)
    top = jnp.where(found, top, fb_top)
    left = jnp.where(found, left, fb_left)
    f32 = jnp.float32
    return top.astype(f32), left.astype(f32), crop_h.astype(f32), crop_w.astype(f32)


def crop_and_resize(
    images: Array, top: Array, left: Array, crop_h: Array, crop_w: Array, out_size: int
) -> Array:
    """Bilinear resize of each box to `out x out`: (B, H, W, C) -> float32 (B, out, out, C).

    Per sample `jax.image.scale_and_translate(scale=out/h, translation=-top*out/h, 'linear',
    antialias=True)` (and likewise in x): a triangle filter, widened by `h/out` when
    downscaling, like PIL's `BILINEAR` behind torchvision's `resized_crop`. Unlike PIL, which
    crops first, filter taps just outside the box still see the neighbouring image pixels (the
    weights are renormalised only at the image border). Values stay in [0, 255] (clipped against
    float rounding). A box equal to the image (or any box with `out == h == w`) is exact.
    """
    chex.assert_rank(images, 4)
    batch, channels = images.shape[0], images.shape[-1]
    for v in (top, left, crop_h, crop_w):
        chex.assert_shape(v, (batch,))
    x = jnp.asarray(images).astype(jnp.float32)

    def one(image: Array, t: Array, lft: Array, h: Array, w: Array) -> Array:
        sy = out_size / h.astype(jnp.float32)
        sx = out_size / w.astype(jnp.float32)
        return jax.image.scale_and_translate(
            image,
            (out_size, out_size, channels),
            (0, 1),
            jnp.stack([sy, sx]),
            jnp.stack([-t * sy, -lft * sx]),
            method="linear",
            antialias=True,
            precision=jax.lax.Precision.HIGHEST,  # no TF32/bf16 passes: identity boxes stay exact
        )

    out = jax.vmap(one)(x, top, left, crop_h, crop_w)
    chex.assert_shape(out, (batch, out_size, out_size, channels))
    return jnp.clip(out, 0.0, 255.0)


def random_flip(key: Array, images: Array, prob: float = 0.5) -> Array:
    """torchvision `RandomHorizontalFlip(prob)` per sample: `x[:, ::-1]` with probability `prob`."""
    chex.assert_rank(images, 4)
    flip = jax.random.bernoulli(key, prob, (images.shape[0],))
    return jnp.where(flip[:, None, None, None], images[:, :, ::-1], images)


def train_augment(
    key: Array,
    images: Array,
    out_size: int,
    *,
    scale: tuple[float, float] = (0.05, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    flip_prob: float = 0.5,
    normalize_mode: str = "minus_one_one",
) -> Array:
    """`RandomResizedCrop(out, scale, ratio)` + `RandomHorizontalFlip(flip_prob)` + `normalize`.

    uint8 (B, S, S, C) -> float32 (B, out, out, C). `key` is split internally into the crop and
    flip keys, so the same key gives the same batch. Jit with `out_size` (and any of the keyword
    options passed) static.
    """
    chex.assert_rank(images, 4)
    chex.assert_type(images, jnp.uint8)
    batch, height, width, channels = images.shape
    k_crop, k_flip = jax.random.split(key)
    boxes = sample_crop_boxes(k_crop, batch, height, width, scale, ratio)
    x = crop_and_resize(images, *boxes, out_size)
    x = normalize(random_flip(k_flip, x, flip_prob), normalize_mode)
    chex.assert_shape(x, (batch, out_size, out_size, channels))
    chex.assert_type(x, jnp.float32)
    return x


def test_transform(images: Array, out_size: int, normalize_mode: str = "minus_one_one") -> Array:
    """`CenterCrop(out)` of the stored images + `normalize`: uint8 (B, S, S, C) -> float32.

    The window starts at `int(round((S - out) / 2))` (torchvision `CenterCrop`); for `S == out`
    this is just `normalize`. With storage `S = store_resize` size `R`, the result equals
    torchvision `Resize(R)` + `CenterCrop(out)` whenever the two centerings compose,
    `round((L - R) / 2) + round((R - out) / 2) == round((L - out) / 2)` along the resized long
    side `L`; that always holds when `(R - out) / 2` is an even integer (256 -> 224: 16), else
    the window can sit one pixel off. Raises ValueError if `S < out`.
    """
    chex.assert_rank(images, 4)
    chex.assert_type(images, jnp.uint8)
    batch, height, width, channels = images.shape
    if height < out_size or width < out_size:
        raise ValueError(
            f"Stored images are {height}x{width}, smaller than the model input {out_size}: the "
            "cache's storage size must be >= the input size (rebuild the cache at a larger size)."
        )
    top = round((height - out_size) / 2.0)
    left = round((width - out_size) / 2.0)
    x = normalize(images[:, top : top + out_size, left : left + out_size], normalize_mode)
    chex.assert_shape(x, (batch, out_size, out_size, channels))
    return x


test_transform.__test__ = False  # not a pytest test, even when imported into a test module


# ------------------------------------------------------------- CIFAR-style (train from scratch)


def random_crop_padded(key: Array, images: Array, pad: int) -> Array:
    """torchvision `RandomCrop(S, padding=pad)` per sample (zero padding): (B, S, S, C) -> same.

    Each image is zero-padded by `pad` pixels on every side and an `S x S` window is cut at an
    offset drawn uniformly from `{0, ..., 2 pad}` in each direction. Any dtype; `pad = 0` is the
    identity.
    """
    chex.assert_rank(images, 4)
    if pad < 0:
        raise ValueError(f"pad must be >= 0; got {pad}.")
    if pad == 0:
        return images
    batch, height, width, channels = images.shape
    padded = jnp.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    offsets = jax.random.randint(key, (batch, 2), 0, 2 * pad + 1)

    def one(image: Array, offset: Array) -> Array:
        return jax.lax.dynamic_slice(image, (offset[0], offset[1], 0), (height, width, channels))

    out = jax.vmap(one)(padded, offsets)
    chex.assert_equal_shape((out, images))
    return out


def standardize(images: Array, mean: tuple[float, ...], std: tuple[float, ...]) -> Array:
    """`(x / 255 - mean) / std` per channel (torchvision `ToTensor` + `Normalize`): float32."""
    chex.assert_rank(images, 4)
    channels = images.shape[-1]
    if len(mean) != channels or len(std) != channels:
        raise ValueError(f"mean {mean} and std {std} need {channels} values (one per channel).")
    x = jnp.asarray(images).astype(jnp.float32) / 255.0
    return (x - jnp.asarray(mean, jnp.float32)) / jnp.asarray(std, jnp.float32)


def cifar_train_augment(
    key: Array,
    images: Array,
    *,
    pad: int,
    flip_prob: float,
    mean: tuple[float, ...],
    std: tuple[float, ...],
) -> Array:
    """`RandomCrop(S, padding=pad)` + `RandomHorizontalFlip(flip_prob)` + `standardize`:
    uint8 (B, S, S, C) -> float32 (B, S, S, C)."""
    chex.assert_type(images, jnp.uint8)
    k_crop, k_flip = jax.random.split(key)
    x = random_flip(k_flip, random_crop_padded(k_crop, images, pad), flip_prob)
    return standardize(x, mean, std)
