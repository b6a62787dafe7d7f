"""The ImageNet training transform in the workers: JPEG decode + RandomResizedCrop + horizontal flip ->
uint8 CHW, as a ShardDataset ``transform``, with reduced-size decoding for low-resolution stages.

    ds = ShardDataset(root, decode=False, transform=RandomResizedCropFlip(224, field="jpg"))
    # with Loader(BatchSchedule([Stage(128, image_size=128, ...), ...])) the stage's size is used

What it computes is torchvision's ``RandomResizedCrop(size) + RandomHorizontalFlip() + PILToTensor()``
on a PIL image (torchvision is not needed): the crop box is drawn as torchvision's ``get_params`` draws
it (10 tries of a scale in ``scale`` and a log-uniform aspect ratio in ``ratio``, then the central crop of
the clamped ratio), the box is resized to ``size x size`` with bilinear filtering, flipped with
probability 0.5. Its random draws use Python's ``random``, which the Loader seeds per batch from (seed,
epoch, step, rank): the same crops for any ``num_workers`` and after a resume.

``draft=True`` (the default) lets libjpeg decode at 1/2, 1/4 or 1/8 scale when the crop, scaled to the
output, needs no more pixels than that (pillow's ``Image.draft``): a 500x375 photo cropped to 128 is
decoded at a fraction of the cost. The crop box is then mapped onto the reduced image, so the output
differs from the full decode by the resampling only (measured on real photographs: mean absolute
difference of a few levels of 255; tests/loader/test_image_crops.py holds the bound).

``resize="torch"`` (the default) resizes a crop decoded at full size with torch's antialiased bilinear
``interpolate`` on uint8 (what torchvision's tensor transforms run), not pillow's: the same filter, within
2 levels of 255 of pillow's output (1 level on up to a fifth of the pixels, the rest equal), 2.3-3.7x
faster on this machine (500x375 photos to 224: 0.36-0.59 ms against pillow's 0.83-2.2 ms, about as long
as the decode itself). A reduced decode's fractional box stays with pillow, on an image a quarter of the
size or less. ``draft=False, resize="pil"`` is exact: torchvision's
computation on a PIL image, pixel for pixel.
"""

from __future__ import annotations

import io
import math
import random

import numpy as np


def crop_box(width: int, height: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), rng=random) -> tuple:
    """(left, top, crop width, crop height) as torchvision's RandomResizedCrop.get_params draws them."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, width - w), rng.randint(0, height - h), w, h
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


class RandomResizedCropFlip:
    """``transform(sample, image_size=None)``: the sample with ``field`` (JPEG/PNG bytes) replaced by a
    ``(3, size, size)`` uint8 array; ``size`` is the Loader stage's image size when it has one."""

    def __init__(self, size: int = 224, field: str = "jpg", scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
                 flip: float = 0.5, draft: bool = True, resize: str = "torch"):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size={size!r} must be an int >= 1")
        if not (0 < scale[0] <= scale[1] <= 1) or not (0 < ratio[0] <= ratio[1]):
            raise ValueError(f"scale={scale!r} must satisfy 0 < lo <= hi <= 1 and ratio={ratio!r} 0 < lo <= hi")
        if resize not in RESIZERS:
            raise ValueError(f"resize={resize!r} must be one of {', '.join(map(repr, RESIZERS))}")
        self.size, self.field, self.scale, self.ratio, self.flip, self.draft = size, field, scale, ratio, flip, draft
        self.resize = resize

    def __call__(self, sample: dict, image_size: int | None = None) -> dict:
        from PIL import Image

        size = image_size or self.size
        data = sample[self.field]
        img = Image.open(io.BytesIO(data if isinstance(data, (bytes, bytearray)) else bytes(data)))
        width, height = img.size
        left, top, w, h = crop_box(width, height, self.scale, self.ratio)
        flip = random.random() < self.flip
        if self.draft and img.format == "JPEG":
            # the smallest JPEG scale whose crop still holds size x size pixels
            img.draft("RGB", (max(1, math.ceil(width * size / w)), max(1, math.ceil(height * size / h))))
        img = img.convert("RGB") if img.mode != "RGB" else img  # convert of an RGB image is a copy of it
        if img.size == (width, height):  # decoded at full size: exactly torchvision's crop, then resize
            crop = img.crop((left, top, left + w, top + h))
            if self.resize == "torch":  # np.array: writable (torch.from_numpy warns on a read-only view)
                return {**sample, self.field: _resized_chw(np.array(crop), size, flip)}
            out = crop.resize((size, size), Image.BILINEAR)
        else:  # the box on the reduced image (fractional: resize reads the pixels under it)
            sx, sy = img.size[0] / width, img.size[1] / height
            box = (left * sx, top * sy, (left + w) * sx, (top + h) * sy)
            out = img.resize((size, size), Image.BILINEAR, box=box)
        if flip:
            out = out.transpose(Image.FLIP_LEFT_RIGHT)
        return {**sample, self.field: np.ascontiguousarray(np.asarray(out).transpose(2, 0, 1))}


RESIZERS = ("torch", "pil")


def _resized_chw(crop: np.ndarray, size: int, flip: bool) -> np.ndarray:
    """An (H, W, 3) uint8 crop resized to (3, size, size) uint8 by torch's antialiased bilinear
    interpolate (its uint8 kernel reads the HWC layout as channels-last, no conversion), flipped."""
    import torch

    x = torch.from_numpy(crop).permute(2, 0, 1).unsqueeze(0)
    y = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)[0]
    if flip:
        y = y.flip(-1)
    return y.contiguous().numpy()


def reference(data: bytes, size: int, box: tuple, flip: bool) -> np.ndarray:
    """What torchvision does for one image, in plain PIL: full decode, RGB, crop the box, bilinear resize
    to size x size, flip, HWC -> CHW uint8 (the check of RandomResizedCropFlip and the peers' transform)."""
    from PIL import Image

    left, top, w, h = box
    img = Image.open(io.BytesIO(data)).convert("RGB").crop((left, top, left + w, top + h))
    img = img.resize((size, size), Image.BILINEAR)
    if flip:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return np.ascontiguousarray(np.asarray(img).transpose(2, 0, 1))
