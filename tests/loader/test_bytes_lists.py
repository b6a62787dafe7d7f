"""Byte fields as lists of ``bytes`` (the default ``bytes_as="bytes"``): the fast ways of
making them (collate.Blob.to_list) give exactly what slicing the buffer gives, whatever the
layout, and a Loader delivers the written payloads through them."""

from __future__ import annotations

import numpy as np
import pytest

from shardfeed.formats import ShardWriter
from shardfeed.loader import Loader, ShardDataset
from shardfeed.loader.collate import _ITEM_MIN_BYTES, Blob, _equal_size_list


def _reference(buf: np.ndarray, starts, sizes) -> list:
    raw = buf.tobytes()
    return [None if s < 0 else raw[a:a + s] for a, s in zip(starts, sizes)]


def _irregular(rng, n: int, size: int, gap_max: int = 4) -> np.ndarray:
    """Starts of n values of one size with gaps of 1..gap_max-1 bytes between them (the tar
    layout: a label of 1-3 digits after each payload)."""
    starts = np.zeros(n, np.int64)
    starts[1:] = np.cumsum(size + rng.integers(1, gap_max, n))[:-1]
    return starts


@pytest.mark.parametrize("size", [_ITEM_MIN_BYTES - 1, _ITEM_MIN_BYTES, 2048, 5000])
def test_equal_sized_values_at_uneven_strides_come_back_exact(size):
    rng = np.random.default_rng(size)
    n = 64
    starts = _irregular(rng, n, size)
    buf = rng.integers(0, 256, int(starts[-1]) + size, dtype=np.uint8)  # the last value ends the buffer
    buf[starts + size - 1] = 0  # every value ends in NUL (a bytes dtype would strip it)
    sizes = np.full(n, size, np.int64)
    assert _equal_size_list(buf, starts, size) is not None  # a fast path served, not the slicing fallback
    for order in (np.arange(n), rng.permutation(n), np.repeat(np.arange(4), 3)):  # any order, repeats
        got = Blob(buf, starts[order], sizes[order]).to_list()
        assert got == _reference(buf, starts[order], sizes[order])
        assert all(type(v) is bytes for v in got)


def test_values_outside_the_buffer_fall_back_to_slicing():
    rng = np.random.default_rng(1)
    buf = rng.integers(0, 256, 10_000, dtype=np.uint8)
    for starts in ([0, 2051, 9_000], [-1, 3000, 6000]):  # past the end; a negative start
        starts = np.array(starts, np.int64)
        assert _equal_size_list(buf, starts, 2048) is None
    starts = np.array([0, 2051, 9_000], np.int64)
    sizes = np.full(3, 2048, np.int64)
    assert Blob(buf, starts, sizes).to_list() == _reference(buf, starts, sizes)  # as sliced: the last one short


def test_absent_and_unequal_values_still_exact():
    rng = np.random.default_rng(2)
    buf = rng.integers(0, 256, 20_000, dtype=np.uint8)
    starts = _irregular(rng, 6, 2048)
    for sizes in ([2048, -1, 2048, 2048, 2048, 2048], [2048, 2047, 2048, 2048, 2048, 2048], [0] * 6):
        sizes = np.array(sizes, np.int64)
        assert Blob(buf, starts, sizes).to_list() == _reference(buf, starts, sizes)


@pytest.mark.parametrize("shuffle", ["none", "global"])
def test_loader_delivers_written_payloads_with_labels_of_any_width(tmp_path, shuffle):
    """Labels of 1-4 digits make the payloads' strides in the batch buffer uneven: the
    one-by-one path, not the in-place view, serves; every payload comes back as written."""
    root = str(tmp_path / "ds")
    rng = np.random.default_rng(7)
    written = {}
    with ShardWriter(root, max_shard_samples=50) as w:
        for i in range(200):
            payload = rng.bytes(2048)
            key = f"{i:06d}"
            written[key] = (payload, int(rng.choice([3, 42, 517, 9999])))
            w.write({"__key__": key, "bin": payload, "cls": written[key][1]})
    seen = 0
    for batch in Loader(ShardDataset(root, shuffle=shuffle, seed=3), batch_size=64):
        for key, payload, cls in zip(batch["__key__"], batch["bin"], batch["cls"].tolist()):
            assert type(payload) is bytes and (payload, cls) == written[key]
            seen += 1
    assert seen == 200
