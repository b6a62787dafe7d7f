"""Large byte fields gathered straight into the ``bytes`` handed out (formats/engine/into_bytes.py):
the same values, the same checks and the same errors as the buffer path, whatever the order, the
read mode, a split gather, or the number of workers."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from conftest import flip_byte
from shardfeed.formats import ShardError, ShardWriter, open_index
from shardfeed.formats.engine import into_bytes
from shardfeed.formats.engine.batch import BatchReader
from shardfeed.formats.engine.into_bytes import MIN_MEAN_BYTES, IntoBytes
from shardfeed.loader import Loader, ShardDataset

pytestmark = pytest.mark.skipif(not IntoBytes.available(), reason="no streaming xxh3 or not CPython")

N = 150
BATCH = 32


def _payload(i: int) -> bytes | None:
    if i % 17 == 5:
        return None  # this sample has no "bin"
    if i == 9:
        return b""
    size = MIN_MEAN_BYTES + (i * 7919) % (24 << 10)  # 16..40 KiB, every size different: no fixed stride
    return i.to_bytes(4, "little") + np.random.default_rng(i).integers(0, 256, size - 4, np.uint8).tobytes()


def _sample(i: int) -> dict:
    s = {"__key__": f"k{i:05d}", "cls": i % 7, "txt": f"t{i}" * (i % 3)}
    if _payload(i) is not None:
        s["bin"] = _payload(i)
    return s


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("into") / "ds")
    with ShardWriter(root, max_shard_samples=23) as w:  # batches span shards
        for i in range(N):
            w.write(_sample(i))
    return root


def _expected_rows() -> dict:
    return {f"k{i:05d}": (_payload(i), i % 7, f"t{i}" * (i % 3)) for i in range(N)}


def _rows(batches) -> list:
    out = []
    for b in batches:
        assert type(b["bin"]) is list  # the default form: a plain list of bytes (None where absent)
        cls = b["cls"].tolist() if isinstance(b["cls"], torch.Tensor) else list(b["cls"])
        out += list(zip(b["__key__"], b["bin"], cls, b["txt"]))
    return out


@pytest.fixture
def count_plans(monkeypatch):
    """How many batches were gathered into bytes objects."""
    made = []
    plan = IntoBytes.plan

    def counted(self, *a):
        out = plan(self, *a)
        made.append(out is not None)
        return out

    monkeypatch.setattr(IntoBytes, "plan", counted)
    return made


def _epoch(root, workers, order="none", read_mode="pread", **kw) -> list:
    ds = ShardDataset(root, shuffle=order, seed=3, read_mode=read_mode, **kw)
    with Loader(ds, batch_size=BATCH, num_workers=workers) as loader:
        batches = list(loader)  # every batch kept: values must not change after they are handed out
    return _rows(batches)


@pytest.mark.parametrize("order,read_mode", [("none", "pread"), ("global", "pread"), ("none", "mmap")])
def test_values_equal_the_buffer_path_and_the_workers(large, order, read_mode, count_plans, monkeypatch):
    direct = _epoch(large, 0, order, read_mode)
    assert count_plans and all(count_plans)  # every batch went into bytes objects
    expected = _expected_rows()
    assert len(direct) == N
    for key, b, c, t in direct:
        assert (b, c, t) == expected[key], key
        assert b is None or type(b) is bytes
    two = _epoch(large, 2, order, read_mode)
    assert two == direct  # same order, same values
    monkeypatch.setattr(IntoBytes, "available", staticmethod(lambda: False))
    count_plans.clear()
    assert _epoch(large, 0, order, read_mode) == direct
    assert not count_plans


def test_small_values_stay_in_the_buffer(tmp_path, count_plans):
    root = str(tmp_path / "small")
    with ShardWriter(root, max_shard_samples=50) as w:
        for i in range(100):
            w.write({"__key__": f"{i:04d}", "bin": bytes([i]) * 2048, "cls": i})
    reader = BatchReader(open_index(root))
    try:
        assert reader.gather_into_bytes(lambda name: True)
        raw = reader.read(np.arange(100))
    finally:
        reader.close()
    assert {spec[0] for spec in raw.fields.values()} == {"bytes"}
    assert count_plans == [False]


def test_only_the_fields_asked_for_and_large_enough(large):
    reader = BatchReader(open_index(large))
    try:
        assert reader.gather_into_bytes(lambda name: name in ("bin", "txt"))
        ids = np.arange(N)[::-1].copy()
        for _ in range(2):  # shards to open (the general path), then all open (the steady path)
            raw = reader.read(ids)
            assert raw.fields["bin"][0] == "objects"
            assert raw.fields["txt"][0] == "bytes" and raw.fields["cls"][0] == "bytes"  # small, not asked
            assert raw.fields["bin"][1] == [_payload(i) for i in ids.tolist()]
            assert raw.keys == [f"k{i:05d}" for i in ids.tolist()]
    finally:
        reader.close()


def test_a_split_gather_fills_the_same_objects(large):
    ids = np.random.default_rng(0).permutation(np.tile(np.arange(N), 2))  # 300 ids, repeats, ~300 runs
    plain = BatchReader(open_index(large))
    split = BatchReader(open_index(large))
    try:
        assert split.gather_into_bytes(lambda name: name == "bin")
        split.allow_threads(2)
        g = split._tar_gather
        g.split, g._wait = True, 10 ** 9  # as if split were measured faster, never trying one call
        plain.read(ids)  # open every shard: the second read takes the steady path
        split.read(ids)
        want = plain.read(ids)
        got = split.read(ids)
        assert g.seen[1] >= 2
    finally:
        plain.close()
        split.close()
    _, starts, sizes = want.fields["bin"]
    buf = want.buf.tobytes()
    assert got.fields["bin"][0] == "objects"
    assert got.fields["bin"][1] == [None if z < 0 else buf[a:a + z] for a, z in zip(starts.tolist(), sizes.tolist())]


def _damaged_copy(large, tmp_path, member: str) -> tuple[str, str]:
    """A copy of the dataset with one byte of sample 40's ``member`` flipped; (root, shard path)."""
    import shutil

    root = str(tmp_path / f"damaged-{member}")
    shutil.copytree(large, root)
    idx = open_index(root)
    shard = int(np.searchsorted(idx.offsets, 40, side="right") - 1)
    path = idx.path(shard)
    raw = open(path, "rb").read()
    if member == "bin":
        at = raw.find(_payload(40)[:64]) + len(_payload(40)) // 2
    else:  # the small member the checksum covers after the payload: "cls" (5) of sample 40
        at = raw.find(b"k00040.cls")
        at = raw.index(b"5", at + 512)
    assert at > 0
    flip_byte(path, at, 1)
    return root, path


@pytest.mark.parametrize("member", ["bin", "cls"])
def test_a_damaged_sample_raises_naming_its_shard(large, tmp_path, member, count_plans):
    root, path = _damaged_copy(large, tmp_path, member)
    with pytest.raises(ShardError, match="fails its checksum") as ei:
        _epoch(root, 0)
    assert os.path.basename(path) in str(ei.value) and "k00040" in str(ei.value)
    assert any(count_plans)  # the batches before it went into bytes objects


@pytest.mark.parametrize("member", ["bin", "cls"])
def test_a_damaged_sample_is_skipped_exactly_as_before(large, tmp_path, member, count_plans, monkeypatch):
    root, _ = _damaged_copy(large, tmp_path, member)
    direct = _epoch(root, 0, on_error="skip")
    assert any(count_plans)
    expected = _expected_rows()
    assert [r[0] for r in direct] == [k for k in expected if k != "k00040"]
    assert all((b, c, t) == expected[k] for k, b, c, t in direct)
    assert _epoch(root, 2, on_error="skip") == direct
    monkeypatch.setattr(IntoBytes, "available", staticmethod(lambda: False))
    assert _epoch(root, 0, on_error="skip") == direct


def test_the_bytes_api_finds_the_data_of_a_fresh_object():
    new, off = into_bytes.bytes_api()
    b = new(None, 1000)
    assert type(b) is bytes and len(b) == 1000
    import ctypes

    ctypes.memmove(id(b) + off, b"\x07" * 1000, 1000)  # unshared: writable, as the C-API documents
    assert b == b"\x07" * 1000


def test_the_first_batch_is_not_kept_for_the_whole_epoch():
    """Regression: first_gc_paused held the first item for the whole iteration; with values gathered
    into bytes objects that kept a whole batch of them alive (a third batch of heap faulted in)."""
    import weakref

    from shardfeed.formats.base.lazy import first_gc_paused

    class Item:
        pass

    gen = first_gc_paused(Item() for _ in range(2))
    first = next(gen)
    ref = weakref.ref(first)
    del first
    next(gen)
    assert ref() is None
