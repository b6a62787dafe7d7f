"""Small synthetic labelled image datasets for demos, tests and benchmarks.

``class_image``: a shape (disk, square, triangle, cross, ring) filled solid or
striped gives 10 classes; its colour, size, position and stripe phase are
random, and it sits on a noisy background with a random-coloured distractor
blob. Colour says nothing about the label, so a small CNN has to learn shape
and texture: well above chance after a few epochs, not 100% (so a bad shuffle
shows in the accuracy).
"""

from __future__ import annotations

import io
import os

import numpy as np

SHAPES = ("disk", "square", "triangle", "cross", "ring")


def _mask(shape: str, yy, xx, cy, cx, r) -> np.ndarray:
    dy, dx = yy - cy, xx - cx
    if shape == "disk":
        return dy * dy + dx * dx <= r * r
    if shape == "square":
        return (np.abs(dy) <= r * 0.8) & (np.abs(dx) <= r * 0.8)
    if shape == "triangle":
        return (dy <= r * 0.7) & (dy >= -r) & (np.abs(dx) <= (dy + r) * 0.6)
    if shape == "cross":
        w = max(1.0, r * 0.3)
        return ((np.abs(dy) <= w) & (np.abs(dx) <= r)) | ((np.abs(dx) <= w) & (np.abs(dy) <= r))
    d2 = dy * dy + dx * dx  # ring
    return (d2 <= r * r) & (d2 >= (0.55 * r) ** 2)


def class_image(label: int, num_classes: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """An RGB uint8 image of class ``label`` (labels past 10 reuse the 10 patterns)."""
    shape, striped = SHAPES[label % len(SHAPES)], (label // len(SHAPES)) % 2 == 1
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    img = rng.uniform(20, 100, 3)[None, None, :] + rng.normal(0, 14, (size, size, 3))
    by, bx, br = rng.uniform(0, size, 2).tolist() + [rng.uniform(0.06, 0.14) * size]
    img[(yy - by) ** 2 + (xx - bx) ** 2 <= br * br] = rng.uniform(0, 160, 3)  # a distractor blob
    r = rng.uniform(0.26, 0.4) * size
    cy, cx = rng.uniform(r, size - r, 2)
    m = _mask(shape, yy, xx, cy, cx, r)
    colour = rng.uniform(140, 255, 3)
    if striped:
        angle = rng.uniform(0, np.pi)
        period = rng.uniform(3.0, 5.0) * size / 32
        phase = np.sin((xx * np.cos(angle) + yy * np.sin(angle)) * 2 * np.pi / period + rng.uniform(0, 6.3))
        fill = np.where(phase[..., None] > 0, colour, colour * 0.35)
    else:
        fill = np.broadcast_to(colour, (size, size, 3))
    img[m] = fill[m] + rng.normal(0, 12, (int(m.sum()), 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def write_image_folder(root: str, num_samples: int, num_classes: int = 10, size: int = 32,
                       seed: int = 0, ext: str = "png") -> list[str]:
    """A folder of ``root/<class>/<n>.<ext>`` images (the layout `shardfeed convert` reads)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    classes = [f"class_{c:02d}" for c in range(num_classes)]
    for c in classes:
        os.makedirs(os.path.join(root, c), exist_ok=True)
    fmt = {"jpg": "JPEG", "jpeg": "JPEG"}.get(ext, ext.upper())
    for i in range(num_samples):
        label = i % num_classes
        buf = io.BytesIO()
        Image.fromarray(class_image(label, num_classes, size, rng)).save(buf, format=fmt)
        with open(os.path.join(root, classes[label], f"{i:07d}.{ext}"), "wb") as f:
            f.write(buf.getvalue())
    return classes


def image_samples(num_samples: int, num_classes: int = 10, size: int = 32, seed: int = 0, ext: str = "png",
                  class_order: bool = True, first_key: int = 0):
    """Samples ``{"__key__", ext: encoded image, "cls": label}``; class by class when ``class_order``
    (the worst case for cheap shuffles). Keys count from ``first_key``."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    per = -(-num_samples // num_classes)
    fmt = {"jpg": "JPEG", "jpeg": "JPEG"}.get(ext, ext.upper())
    for i in range(num_samples):
        label = i // per if class_order else i % num_classes
        buf = io.BytesIO()
        Image.fromarray(class_image(label, num_classes, size, rng)).save(buf, format=fmt)
        yield {"__key__": f"{first_key + i:09d}", ext: buf.getvalue(), "cls": label}
