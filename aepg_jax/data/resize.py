"""Host-side resizing with PIL, matching torchvision's `Resize(int)` and `CenterCrop` on PIL images.

`Resize(size)` with an int scales the *shorter* side to `size` and the longer one to
`int(size * long / short)` (truncation, as torchvision's `_compute_resized_output_size`), with
PIL bilinear (antialiased when downscaling). `CenterCrop(crop)` cuts at
`top = int(round((H - crop) / 2.0))`, `left = int(round((W - crop) / 2.0))` (Python's
round-half-to-even).

`store_resize` gives the decode-once cache its storage resolution (`Resize(S)` + `CenterCrop(S)`);
the device-side `augment.test_transform` then center-crops that to the model's input size.
`pil_resize_center_crop` is the reference test transform as PyTorch peers run it.
"""

from __future__ import annotations

import numpy as np
from PIL import Image


def resized_shape(height: int, width: int, size: int) -> tuple[int, int]:
    """(H', W') of torchvision `Resize(size)`: short side -> `size`, long -> `int(size*long/short)`.

    The long side is truncated, as in torchvision's `_compute_resized_output_size`.
    """
    if size <= 0:
        raise ValueError(f"size must be positive; got {size}.")
    if height <= 0 or width <= 0:
        raise ValueError(f"Cannot resize an empty image of shape ({height}, {width}).")
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(size * long / short)
    return (new_long, size) if width <= height else (size, new_long)


def center_crop_offsets(height: int, width: int, crop: int) -> tuple[int, int]:
    """(top, left) of torchvision `CenterCrop(crop)`: `int(round((H - crop) / 2.0))` per axis."""
    if crop > height or crop > width:
        raise ValueError(
            f"Cannot center-crop {crop}x{crop} from a {height}x{width} image (torchvision would "
            "pad; this pipeline never should)."
        )
    return round((height - crop) / 2.0), round((width - crop) / 2.0)


def _check_image(image: np.ndarray) -> np.ndarray:
    image = np.asarray(image)
    if image.dtype != np.uint8:
        raise TypeError(f"Images must be uint8; got {image.dtype}.")
    if image.ndim != 3 or image.shape[-1] not in (1, 3):
        raise ValueError(f"Images must be (H, W, 3) or (H, W, 1); got shape {image.shape}.")
    return image


def pil_resize(image: np.ndarray, size: int) -> np.ndarray:
    """torchvision `Resize(size)` on a PIL image: uint8 (H, W, C) -> uint8 `resized_shape(H, W)`.

    PIL bilinear (`Image.BILINEAR`): triangle filter widened by the scale factor when
    downscaling, so it antialiases; a no-op when the short side already equals `size`.
    """
    image = _check_image(image)
    height, width, channels = image.shape
    new_h, new_w = resized_shape(height, width, size)
    pil = Image.fromarray(image[..., 0] if channels == 1 else image)
    out = np.asarray(pil.resize((new_w, new_h), Image.BILINEAR))
    return out.reshape(new_h, new_w, channels)


def center_crop(image: np.ndarray, crop: int) -> np.ndarray:
    """torchvision `CenterCrop(crop)`: the `crop x crop` window at `center_crop_offsets`."""
    top, left = center_crop_offsets(image.shape[0], image.shape[1], crop)
    return image[top : top + crop, left : left + crop]


def pil_resize_center_crop(image: np.ndarray, resize: int, crop: int) -> np.ndarray:
    """Reference test transform `Resize(resize)` + `CenterCrop(crop)`: uint8 (crop, crop, C)."""
    return np.ascontiguousarray(center_crop(pil_resize(image, resize), crop))


def store_resize(image: np.ndarray, size: int = 256) -> np.ndarray:
    """Storage-resolution image of the decode-once cache: uint8 (H, W, C) -> (size, size, C).

    `Resize(size)` (shorter side to `size`, PIL bilinear) then `CenterCrop(size)`, so the stored
    image is the central square of the resized image, cut at torchvision's offsets.
    """
    return pil_resize_center_crop(image, size, size)
