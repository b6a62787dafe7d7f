"""Hardening, class "damaged bytes delivered": whatever the format and
whether or not a side file is there, a damaged byte is a ShardError (or a
counted skip), never data."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

from conftest import flip_byte
from shardfeed.formats import ShardError, ShardWriter, open_index, open_shard, verify_shard
from shardfeed.formats.engine.batch import BatchReader
from shardfeed.formats.readers import shard_keys
from shardfeed.loader import ShardDataset

pytestmark = pytest.mark.hostile  # bounded time and memory (conftest.py)


def _payload_offset(path: str, needle: bytes) -> int:
    raw = open(path, "rb").read()
    at = raw.find(needle)
    assert at > 0, "payload not found in the shard"
    return at


def _arrow_dataset(tmp_path, n=40, per_shard=20):
    root = str(tmp_path / "arrow")
    with ShardWriter(root, format="arrow", max_shard_samples=per_shard) as w:
        for i in range(n):
            w.write({"__key__": f"k{i:04d}", "cls": i, "bin": bytes([i % 251]) * 50 + b"MARK%04d" % i})
    return root


def test_arrow_payload_flip_is_caught_by_the_batch_checksum(tmp_path):
    """Regression: Arrow IPC had no checksum, a flipped payload byte was delivered silently."""
    root = _arrow_dataset(tmp_path)
    idx = open_index(root)
    path = idx.path(0)
    flip_byte(path, _payload_offset(path, b"MARK0007"), 1)
    with pytest.raises(ShardError, match="fails its checksum") as ei:
        with open_shard(idx, 0) as r:
            list(r)
    assert os.path.basename(path) in ei.value.shard
    reader = BatchReader(idx)  # the batch fast path reads through the same check
    try:
        with pytest.raises(ShardError, match="fails its checksum"):
            reader.read(np.arange(5))
        assert len(reader.read(np.arange(20, 25))) == 5  # the other shard is intact
    finally:
        reader.close()
    with pytest.raises(ShardError):
        verify_shard(idx, 0)
    with pytest.raises(ShardError, match="checksum"):
        shard_keys(idx, 0)


def test_arrow_damage_under_skip_is_counted_not_delivered(tmp_path):
    root = _arrow_dataset(tmp_path)
    idx = open_index(root)
    flip_byte(idx.path(1), _payload_offset(idx.path(1), b"MARK0031"), 1)
    reader = BatchReader(idx, skip=True)
    try:
        got = reader.read(np.arange(40))
    finally:
        reader.close()
    assert sorted(got.keys) == [f"k{i:04d}" for i in range(20)]
    assert sum(e.samples for e in got.errors) == 20 and "checksum" in got.errors[0].reason


def test_intact_arrow_shards_read_back_exactly(tmp_path):
    root = _arrow_dataset(tmp_path)
    idx = open_index(root)
    with open_shard(idx, 1) as r:
        rows = list(r)
    assert [row["cls"] for row in rows] == list(range(20, 40))
    assert rows[3]["bin"].endswith(b"MARK0023")


def test_arrow_shard_without_checksums_is_refused(tmp_path):
    """An Arrow file written by another tool (no per-batch checksums) cannot be
    checked, so it is refused rather than read unchecked."""
    root = _arrow_dataset(tmp_path, n=10, per_shard=10)
    idx = open_index(root)
    path = idx.path(0)
    with pa.memory_map(path) as src:
        tbl = pa.ipc.open_file(src).read_all()
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, tbl.schema.remove_metadata()) as w:
        w.write_table(tbl)
    with pytest.raises(ShardError, match="no per-batch checksums"):
        from shardfeed.formats.readers import ColumnarShardReader
        with ColumnarShardReader(path, "arrow") as r:
            list(r)


@pytest.mark.parametrize("bit", range(8))
def test_every_bit_of_an_arrow_value_is_covered(tmp_path, bit):
    """A flipped bit in an int column (not just payload bytes) is caught."""
    root = str(tmp_path / "a")
    with ShardWriter(root, format="arrow") as w:
        for i in range(8):
            w.write({"__key__": f"k{i}", "cls": 0x1234567800 + i})
    path = open_index(root).path(0)
    raw = open(path, "rb").read()
    at = raw.find(np.array([0x1234567803], np.int64).tobytes())
    flip_byte(path, at, 1 << bit)
    with pytest.raises(ShardError):
        with open_shard(open_index(root), 0) as r:
            list(r)


def test_missing_sidecar_of_an_indexed_dataset_is_an_error(make_dataset):
    """Regression: a missing sidecar made the reader rescan the tar and deliver
    its samples unchecked (damaged ones included)."""
    idx = open_index(make_dataset(n=20, shard_samples=10))
    os.remove(idx.path(0) + ".idx")
    with pytest.raises(ShardError, match="sidecar shard-000000.tar.idx is missing"):
        open_shard(idx, 0)
    with pytest.raises(ShardError, match="is missing"):
        shard_keys(idx, 0)
    reader = BatchReader(idx, skip=True)
    try:
        got = reader.read(np.arange(20))
    finally:
        reader.close()
    assert len(got) == 10 and got.errors[0].samples == 10 and "missing" in got.errors[0].reason


def test_missing_sidecar_under_skip_is_counted_by_the_dataset(make_dataset):
    root = make_dataset(n=20, shard_samples=10)
    os.remove(open_index(root).path(1) + ".idx")
    ds = ShardDataset(root, shuffle="none", on_error="skip", decode=False)
    keys = [s["__key__"] for s in ds]
    assert keys == [f"{i:08d}" for i in range(10)]


@pytest.mark.parametrize("values", [
    np.arange(-5, 300, dtype=np.int64), np.arange(7, dtype=np.uint8), np.linspace(0, 1, 9, dtype=np.float32),
    np.array([True, False, True, True, False, False, False, True, True], dtype=np.bool_),
    np.array([3, 1, 2], dtype="datetime64[ms]"),
])
def test_digest_bytes_without_pandas_equal_to_numpy(values):
    """Index and sidecar digests read fixed-width columns from their buffers (to_numpy imports
    pandas: 0.4 s of start-up); the bytes must be the ones to_numpy gave, sliced or not."""
    import pyarrow as pa

    from shardfeed.formats.sidecar import fixed_width_values

    arr = pa.array(values)
    for a in (arr, arr.slice(1), arr.slice(2, 3)):
        want = np.ascontiguousarray(a.to_numpy(zero_copy_only=False)).tobytes()
        assert bytes(memoryview(fixed_width_values(a)).cast("B")) == want
