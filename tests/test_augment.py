"""Tests for aepg_jax.data.augment and .resize: crop statistics, flips, identities, PIL parity."""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from aepg_jax.data import augment, resize

S = 32  # storage size of the small test batches
OUT = 24  # model input size for them
N_BOXES = 4096
# Jitted once per static configuration; eager dispatch of the sampler is slower than compiling it.
_sample_boxes = jax.jit(augment.sample_crop_boxes, static_argnums=(1, 2, 3, 4, 5))
_crop_and_resize = jax.jit(augment.crop_and_resize, static_argnums=5)


def _images(seed=0, batch=8, size=S, channels=3):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (batch, size, size, channels), dtype=np.uint8)


def _smooth_image(height, width, seed=0):
    """A smooth random uint8 RGB image: coarse noise upsampled bicubically."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (height // 32 + 2, width // 32 + 2, 3), dtype=np.uint8)
    return np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC))


def _boxes(*box, batch=1):
    return tuple(jnp.full((batch,), v, jnp.float32) for v in box)


def _to_uint8(x, mode="minus_one_one"):
    """Inverse of `normalize`, rounded back to uint8 levels."""
    x = np.asarray(x, np.float64)
    x = x * 0.5 + 0.5 if mode == "minus_one_one" else x
    return np.round(x * 255.0).astype(np.uint8)


def _reference_boxes(rng, n, height, width, scale=(0.05, 1.0), ratio=(3 / 4, 4 / 3)):
    """NumPy float64 transcription of torchvision RandomResizedCrop.get_params, one per draw."""
    out = np.zeros((n, 4))
    for k in range(n):
        for _ in range(10):
            area = height * width * rng.uniform(*scale)
            r = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
            w, h = round(math.sqrt(area * r)), round(math.sqrt(area / r))
            if 0 < w <= width and 0 < h <= height:
                out[k] = rng.integers(0, height - h + 1), rng.integers(0, width - w + 1), h, w
                break
        else:
            out[k] = 0, 0, height, width  # not reached for the image sizes used here
    return out


# ----------------------------------------------------------------------------------------------
# train_augment


class TrainAugmentTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_shape_dtype_range_and_determinism(self):
        fn = self.variant(functools.partial(augment.train_augment, out_size=OUT))
        images = _images()
        x = fn(jax.random.key(1), images)
        chex.assert_shape(x, (8, OUT, OUT, 3))
        chex.assert_type(x, jnp.float32)
        assert float(x.min()) >= -1.0 and float(x.max()) <= 1.0
        assert float(x.max()) - float(x.min()) > 1.0  # not degenerate
        np.testing.assert_array_equal(fn(jax.random.key(1), images), x)  # same key, same batch
        assert not np.allclose(fn(jax.random.key(2), images), x)

    def test_full_box_without_flip_is_normalize(self):
        """scale = ratio = 1, out = S, no flip, mode 'none': the whole image, in [0, 1]."""
        fn = jax.jit(
            functools.partial(
                augment.train_augment,
                out_size=S,
                scale=(1.0, 1.0),
                ratio=(1.0, 1.0),
                flip_prob=0.0,
                normalize_mode="none",
            )
        )
        images = _images()
        x = fn(jax.random.key(3), images)
        assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0
        np.testing.assert_allclose(np.asarray(x) * 255.0, images, atol=1e-4)

    def test_grayscale_channel(self):
        x = jax.jit(augment.train_augment, static_argnums=2)(
            jax.random.key(0), _images(channels=1), OUT
        )
        chex.assert_shape(x, (8, OUT, OUT, 1))

    def test_rejects_float_images(self):
        with pytest.raises(AssertionError):
            augment.train_augment(jax.random.key(0), _images().astype(np.float32), OUT)


# ----------------------------------------------------------------------------------------------
# Crop boxes


@pytest.mark.parametrize("height,width", [(64, 64), (48, 64)])
def test_crop_boxes_follow_random_resized_crop(height, width):
    top, left, h, w = (
        np.asarray(v) for v in _sample_boxes(jax.random.key(0), N_BOXES, height, width)
    )
    for v in (top, left, h, w):
        assert v.dtype == np.float32 and v.shape == (N_BOXES,)
        np.testing.assert_array_equal(v, np.round(v))  # integer pixel boxes
    # Inside the image.
    assert (top >= 0).all() and (left >= 0).all() and (h >= 1).all() and (w >= 1).all()
    assert (top + h <= height).all() and (left + w <= width).all()
    # Area fraction in [0.05, 1] and aspect ratio in [3/4, 4/3], up to rounding w and h by 1/2.
    area = height * width
    assert ((w - 0.5) * (h - 0.5) <= area).all()
    assert ((w + 0.5) * (h + 0.5) >= 0.05 * area).all()
    assert ((w - 0.5) / (h + 0.5) <= 4 / 3).all() and ((w + 0.5) / (h - 0.5) >= 3 / 4).all()
    # Distribution: matches a float64 transcription of torchvision's sampler.
    ref = _reference_boxes(np.random.default_rng(0), N_BOXES, height, width)
    frac, ref_frac = h * w / area, ref[:, 2] * ref[:, 3] / area
    assert 0.4 < frac.mean() < 0.55  # E[U(0.05, 1)] = 0.525, less the rejected large boxes
    stats = {
        "area fraction": (frac, ref_frac),
        "log aspect": (np.log(w / h), np.log(ref[:, 3] / ref[:, 2])),
        "top / (H - h)": (
            top / np.maximum(height - h, 1),
            ref[:, 0] / np.maximum(height - ref[:, 2], 1),
        ),
        "left / (W - w)": (
            left / np.maximum(width - w, 1),
            ref[:, 1] / np.maximum(width - ref[:, 3], 1),
        ),
    }
    for name, (ours, theirs) in stats.items():
        stderr = math.sqrt((ours.var() + theirs.var()) / N_BOXES)
        assert abs(ours.mean() - theirs.mean()) < 5 * stderr, name


@pytest.mark.parametrize(
    "height,width,expected",
    [
        (32, 64, (0, 10, 32, 43)),  # too wide: ratio clamped to 4/3, w = round(32 * 4/3)
        (64, 32, (10, 0, 43, 32)),  # too tall: h = round(32 / (3/4))
        (40, 48, (0, 0, 40, 48)),  # ratio 1.2 in range: the whole image
    ],
)
def test_crop_boxes_fallback_is_centered_clamped_crop(height, width, expected):
    """No attempt can fit when every area fraction exceeds 1: torchvision's fallback box."""
    boxes = _sample_boxes(jax.random.key(0), 16, height, width, (1.5, 2.0))
    for v, e in zip(boxes, expected, strict=True):
        np.testing.assert_array_equal(v, np.full(16, e, np.float32))


@pytest.mark.parametrize("bad", [{"scale": (0.5, 0.1)}, {"scale": (0.0, 1.0)}, {"ratio": (2, 1)}])
def test_crop_boxes_reject_bad_intervals(bad):
    with pytest.raises(ValueError, match="0 < lo <= hi"):
        augment.sample_crop_boxes(jax.random.key(0), 4, S, S, **bad)


# ----------------------------------------------------------------------------------------------
# crop_and_resize


def test_full_box_reproduces_input_exactly():
    images = _images()
    out = _crop_and_resize(images, *_boxes(0, 0, S, S, batch=8), S)
    chex.assert_type(out, jnp.float32)
    np.testing.assert_array_equal(out, images.astype(np.float32))
    x = augment.normalize(out, "minus_one_one")
    np.testing.assert_allclose((np.asarray(x) * 0.5 + 0.5) * 255.0, images, atol=1e-4)


def test_crop_box_with_out_equal_to_crop_is_slicing():
    images = _images()
    top = jnp.arange(8, dtype=jnp.float32)
    left = 7.0 - top
    out = _crop_and_resize(
        images, top, left, jnp.full(8, OUT, jnp.float32), jnp.full(8, OUT, jnp.float32), OUT
    )
    for i in range(8):
        t, lft = int(top[i]), int(left[i])
        np.testing.assert_array_equal(out[i], images[i, t : t + OUT, lft : lft + OUT])


@pytest.mark.parametrize(
    "box,out_size",
    [((0, 0, 64, 64), 24), ((5, 9, 40, 50), 24), ((5, 9, 40, 50), 56), ((10, 3, 13, 17), 24)],
)
def test_resize_matches_pil_bilinear_away_from_crop_edges(box, out_size):
    """PIL crops then resizes; scale_and_translate also sees pixels just outside the box.

    Away from the box's edge (2 output pixels) the two agree to one uint8 level (PIL rounds to
    uint8 between its horizontal and vertical passes and uses fixed-point weights).
    """
    image = _images(batch=1, size=64)[0]
    t, lft, h, w = box
    ours = np.asarray(_crop_and_resize(image[None], *_boxes(*box), out_size))[0]
    pil = Image.fromarray(image).crop((lft, t, lft + w, t + h))
    ref = np.asarray(pil.resize((out_size, out_size), Image.BILINEAR), np.float64)
    diff = np.abs(np.round(ours) - ref)
    assert diff[2:-2, 2:-2].max() <= 1
    if box == (0, 0, 64, 64):  # the box is the image: no crop edge, agree everywhere
        assert diff.max() <= 1


# ----------------------------------------------------------------------------------------------
# random_flip


def test_flip_probability_and_mirroring():
    n = N_BOXES
    images = jnp.broadcast_to(jnp.arange(5, dtype=jnp.float32)[None, None, :, None], (n, 2, 5, 1))
    out = np.asarray(augment.random_flip(jax.random.key(0), images, 0.5))
    flipped = out[:, 0, 0, 0] == 4
    np.testing.assert_array_equal(out[flipped], np.asarray(images[flipped])[:, :, ::-1])
    np.testing.assert_array_equal(out[~flipped], np.asarray(images[~flipped]))
    assert abs(flipped.mean() - 0.5) < 5 * math.sqrt(0.25 / n)
    rate = np.asarray(augment.random_flip(jax.random.key(1), images, 0.2))[:, 0, 0, 0] == 4
    assert abs(rate.mean() - 0.2) < 5 * math.sqrt(0.16 / n)
    np.testing.assert_array_equal(augment.random_flip(jax.random.key(0), images, 0.0), images)


# ----------------------------------------------------------------------------------------------
# normalize and test_transform


def test_normalize_modes_and_errors():
    x = jnp.array([0.0, 127.5, 255.0])
    np.testing.assert_allclose(augment.normalize(x, "minus_one_one"), [-1.0, 0.0, 1.0])
    np.testing.assert_allclose(augment.normalize(x, "none"), [0.0, 0.5, 1.0])
    chex.assert_type(augment.normalize(jnp.asarray([3], jnp.uint8), "none"), jnp.float32)
    with pytest.raises(ValueError, match="Valid modes: minus_one_one, none, imagenet, clip"):
        augment.normalize(x, "zscore")
    with pytest.raises(ValueError, match="Valid modes"):
        augment.train_augment(jax.random.key(0), _images(), OUT, normalize_mode="zscore")


def test_test_transform_center_crops_and_normalizes():
    images = _images()
    x = augment.test_transform(images, OUT, "none")
    chex.assert_shape(x, (8, OUT, OUT, 3))
    chex.assert_type(x, jnp.float32)
    np.testing.assert_array_equal(_to_uint8(x, "none"), images[:, 4 : 4 + OUT, 4 : 4 + OUT])
    x = jax.jit(augment.test_transform, static_argnums=(1, 2))(images, S, "minus_one_one")
    np.testing.assert_allclose((np.asarray(x) * 0.5 + 0.5) * 255.0, images, atol=1e-4)
    assert float(x.min()) >= -1.0 and float(x.max()) <= 1.0


def test_test_transform_rejects_storage_smaller_than_input():
    with pytest.raises(ValueError, match="storage size must be >= the input size"):
        augment.test_transform(_images(), S + 1)


def _composes(long, resize_to, crop):
    """Whether CenterCrop(crop) of CenterCrop(resize_to) lands where CenterCrop(crop) does."""
    return round((long - resize_to) / 2) + round((resize_to - crop) / 2) == round((long - crop) / 2)


@pytest.mark.parametrize(
    "height,width,resize_to,crop,composes",
    [
        (300, 400, 256, 224, True),  # landscape, long side int(256 * 400 / 300) = 341
        (400, 300, 256, 224, True),  # portrait
        (333, 517, 256, 224, True),  # odd long-side difference 141
        (300, 401, 255, 224, True),  # odd storage-crop difference 31
        (300, 403, 256, 223, True),  # both differences odd (87, 33)
        (256, 256, 256, 224, True),  # already at storage size
        (299, 400, 256, 223, False),  # documented: one pixel off along the long side
        (301, 399, 255, 224, False),
    ],
)
@pytest.mark.parametrize("mode", ["minus_one_one", "none"])
def test_test_transform_equals_pil_resize_center_crop(
    height, width, resize_to, crop, composes, mode
):
    image = _smooth_image(height, width, seed=height + width)
    stored = resize.store_resize(image, resize_to)
    assert stored.shape == (resize_to, resize_to, 3) and stored.dtype == np.uint8
    ours = _to_uint8(augment.test_transform(stored[None], crop, mode)[0], mode)
    # Independent PIL reference: torchvision's Resize(int) size rule, then CenterCrop offsets.
    short, long = min(height, width), max(height, width)
    new_long = int(resize_to * long / short)
    new_h, new_w = (new_long, resize_to) if height > width else (resize_to, new_long)
    resized = np.asarray(Image.fromarray(image).resize((new_w, new_h), Image.BILINEAR))
    assert _composes(max(new_h, new_w), resize_to, crop) == composes
    ref = resize.pil_resize_center_crop(image, resize_to, crop)
    top, left = round((new_h - crop) / 2), round((new_w - crop) / 2)
    np.testing.assert_array_equal(ref, resized[top : top + crop, left : left + crop])
    # The stored image is the central square of the same PIL resize.
    s_top, s_left = round((new_h - resize_to) / 2), round((new_w - resize_to) / 2)
    np.testing.assert_array_equal(
        stored, resized[s_top : s_top + resize_to, s_left : s_left + resize_to]
    )
    if composes:
        np.testing.assert_array_equal(ours, ref)
    else:
        c = round((resize_to - crop) / 2)
        top, left = s_top + c, s_left + c
        assert (top, left) != (round((new_h - crop) / 2), round((new_w - crop) / 2))
        np.testing.assert_array_equal(ours, resized[top : top + crop, left : left + crop])


def test_store_resize_handles_single_channel_and_rejects_bad_input():
    gray = _smooth_image(40, 60)[..., :1]
    out = resize.store_resize(gray, 32)
    assert out.shape == (32, 32, 1)
    ref = np.asarray(Image.fromarray(gray[..., 0]).resize((48, 32), Image.BILINEAR))
    np.testing.assert_array_equal(out[..., 0], ref[:, 8:40])
    with pytest.raises(TypeError, match="uint8"):
        resize.store_resize(gray.astype(np.float32), 32)
    with pytest.raises(ValueError, match="Cannot center-crop"):
        resize.pil_resize_center_crop(gray, 32, 40)
