"""Small synthetic labelled image datasets for demos, tests and benchmarks.

Each class is a colour and a stripe orientation plus noise, so a small model
can learn it in seconds and accuracy shows whether labels travelled with
their images.
"""

from __future__ import annotations

import io
import os

import numpy as np


def class_image(label: int, num_classes: int, size: int, rng: np.random.Generator) -> np.ndarray:
    hue = label / max(1, num_classes)
    base = np.array([np.cos(2 * np.pi * hue), np.cos(2 * np.pi * (hue + 1 / 3)),
                     np.cos(2 * np.pi * (hue + 2 / 3))]) * 80 + 128
    yy, xx = np.mgrid[0:size, 0:size]
    angle = np.pi * (label % 4) / 4
    stripes = np.sin((xx * np.cos(angle) + yy * np.sin(angle)) * (2 + label % 3) * np.pi / size * 2)
    img = base[None, None, :] + 40 * stripes[..., None] + rng.normal(0, 12, (size, size, 3))
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
                  class_order: bool = True):
    """Samples ``{"__key__", ext: encoded image, "cls": label}``; class by class when ``class_order``
    (the worst case for cheap shuffles)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    per = -(-num_samples // num_classes)
    fmt = {"jpg": "JPEG", "jpeg": "JPEG"}.get(ext, ext.upper())
    for i in range(num_samples):
        label = i // per if class_order else i % num_classes
        buf = io.BytesIO()
        Image.fromarray(class_image(label, num_classes, size, rng)).save(buf, format=fmt)
        yield {"__key__": f"{i:09d}", ext: buf.getvalue(), "cls": label}
