"""RandomResizedCropFlip (loader/image_crops.py): without draft its output is exactly the reference (full
decode, crop, bilinear resize, flip: what torchvision does, in PIL); with draft it stays within a small
mean difference of the reference at the low-res stages; crops are seeded per batch by the Loader."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
from PIL import Image

from shardfeed.formats import ShardWriter
from shardfeed.loader import BatchSchedule, Loader, ShardDataset, Stage
from shardfeed.loader.image_crops import RandomResizedCropFlip, crop_box, reference


def _photo(seed: int, w: int = 500, h: int = 375) -> bytes:
    """A photograph-like JPEG (smooth shapes, edges and sensor noise), quality 90."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.zeros((h, w, 3), np.float32)
    for c in range(3):
        fx, fy, ph = rng.uniform(0.005, 0.03, 2).tolist() + [rng.uniform(0, 6)]
        img[..., c] = 128 + 90 * np.sin(fx * x + ph) * np.cos(fy * y)
    for _ in range(6):
        cx, cy, r = rng.integers(0, w), rng.integers(0, h), rng.integers(20, 90)
        img[(x - cx) ** 2 + (y - cy) ** 2 < r * r] = rng.integers(0, 256, 3)
    img += rng.normal(0, 6, img.shape)
    buf = io.BytesIO()
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _expected(data: bytes, size: int, seed: int, t: RandomResizedCropFlip) -> np.ndarray:
    rng = random.Random(seed)
    box = crop_box(*Image.open(io.BytesIO(data)).size, t.scale, t.ratio, rng)
    return reference(data, size, box, rng.random() < t.flip)


@pytest.mark.parametrize("size", [224, 160, 128])
def test_without_draft_the_output_is_exactly_the_reference(size):
    t = RandomResizedCropFlip(size, draft=False, resize="pil")
    for seed in range(12):
        data = _photo(seed)
        random.seed(seed)
        got = t({"jpg": data})["jpg"]
        assert got.shape == (3, size, size) and got.dtype == np.uint8
        np.testing.assert_array_equal(got, _expected(data, size, seed, t))


@pytest.mark.parametrize("size", [224, 160, 128])
def test_torchs_resize_stays_within_a_level_or_two_of_pillows(size):
    """The default resize (torch's antialiased bilinear on uint8) against the exact reference: the same
    crops and flips, pixels within 2 levels of 255 (measured: at most 1, on up to a fifth of the pixels)."""
    t = RandomResizedCropFlip(size, draft=False)
    for seed in range(12):
        data = _photo(seed)
        random.seed(seed)
        got = t({"jpg": data})["jpg"]
        assert got.shape == (3, size, size) and got.dtype == np.uint8 and got.flags.c_contiguous
        diff = np.abs(got.astype(np.int16) - _expected(data, size, seed, t).astype(np.int16))
        assert diff.max() <= 2 and diff.mean() < 0.25, (seed, diff.max(), diff.mean())  # rounding: 1 level


def test_resize_must_be_torch_or_pil():
    with pytest.raises(ValueError, match="resize='cv2' must be one of 'torch', 'pil'"):
        RandomResizedCropFlip(224, resize="cv2")


@pytest.mark.parametrize("size", [224, 160, 128])
def test_with_draft_the_output_stays_close_to_the_reference(size):
    t = RandomResizedCropFlip(size, draft=True, scale=(0.5, 1.0))  # large crops: the scales draft reduces
    diffs = []
    for seed in range(12):
        data = _photo(seed, 1000, 750)
        random.seed(seed)
        got = t({"jpg": data})["jpg"].astype(np.int16)
        diffs.append(np.abs(got - _expected(data, size, seed, t).astype(np.int16)).mean())
    assert max(diffs) < 6.0, diffs  # levels of 255: resampling of a reduced decode, not a different crop
    assert min(diffs) > 0  # draft did reduce some decodes (exact otherwise)


def test_in_the_loader_workers_deliver_cropped_chw_images(tmp_path):
    """The crops are drawn in the workers from per-batch seeds: the same images for 0 and 2 workers."""
    with ShardWriter(str(tmp_path), format="tar", max_shard_samples=8) as w:
        for i in range(24):
            w.write({"__key__": f"{i:04d}", "jpg": _photo(i, 200, 150), "cls": i})
    keys, pixels = {}, {}
    for workers in (0, 2):
        ds = ShardDataset(str(tmp_path), shuffle="global", seed=4, decode=False, transform=RandomResizedCropFlip(64))
        with Loader(ds, batch_size=6, num_workers=workers) as loader:
            batches = list(loader)
        keys[workers] = [k for b in batches for k in b["__key__"]]
        images = np.stack([np.asarray(x) for b in batches for x in b["jpg"]])
        assert images.shape == (24, 3, 64, 64) and images.dtype == np.uint8
        assert len({x.tobytes() for x in images}) == 24
        pixels[workers] = images
    assert keys[0] == keys[2]
    assert np.array_equal(pixels[0], pixels[2])


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_progressive_run_draws_the_same_crops_at_the_stage_size(tmp_path, workers):
    """Progressive resizing (128 px for epoch 0, 160 for epoch 1), killed mid-epoch 1 and resumed from
    its state: the rest of the epoch has the keys and the pixels of the uninterrupted run, at 160."""
    with ShardWriter(str(tmp_path), format="tar", max_shard_samples=8) as w:
        for i in range(24):
            w.write({"__key__": f"{i:04d}", "jpg": _photo(100 + i, 240, 180), "cls": i})
    schedule = BatchSchedule([Stage(6, image_size=128), Stage(6, image_size=160)])

    def make():
        ds = ShardDataset(str(tmp_path), shuffle="global", seed=9, decode=False, transform=RandomResizedCropFlip())
        return Loader(ds, batch_size=schedule, num_workers=workers)

    def images(batches):
        return [(b["__key__"], np.stack([np.asarray(x) for x in b["jpg"]])) for b in batches]

    with make() as ref:
        ref.set_epoch(0)
        assert images(ref)[0][1].shape == (6, 3, 128, 128)
        ref.set_epoch(1)
        whole = images(ref)
    with make() as a:
        a.set_epoch(1)
        it = iter(a)
        head = images([next(it), next(it)])
        state = a.state_dict()
    with make() as b:
        b.load_state_dict(state)
        rest = images(b)
    assert len(rest) == 2 and rest[0][1].shape == (6, 3, 160, 160)
    for (k1, x1), (k2, x2) in zip(head + rest, whole):
        assert k1 == k2
        np.testing.assert_array_equal(x1, x2)
