"""A typed column (Parquet int64 ``cls``) in a batch whose other samples come
from shards without it: those samples read None, never the uninitialised
memory of the column's buffer; shards that hold the field as bytes (tar) are
refused by name, since no one column can hold both."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from shardfeed.formats import ShardError, ShardWriter, open_index
from shardfeed.formats.engine import column_gather
from shardfeed.formats.engine.batch import BatchReader
from shardfeed.formats.index import write_index
from shardfeed.loader import Loader, ShardDataset


def _part(root, name, fmt, n, with_cls, cls_bytes=False):
    """One shard of ``n`` samples written by ShardWriter into ``root/name``."""
    tmp = f"{root}/.{name}"
    with ShardWriter(tmp, format=fmt) as w:
        for i in range(n):
            s = {"__key__": f"{name}{i:03d}", "bin": bytes([i % 251]) * (i % 5 + 1)}
            if with_cls:
                s["cls"] = str(1000 + i).encode() if cls_bytes else 1000 + i
            w.write(s)
    idx = open_index(tmp)
    infos = []
    for k in range(len(idx.names)):
        info = idx.shard(k)
        for f in os.listdir(tmp):
            if f.startswith(info.name):  # the shard and its sidecar
                os.rename(f"{tmp}/{f}", f"{root}/{name}-{f}")
        infos.append(type(info)(f"{name}-{info.name}", info.format, info.samples, info.bytes, info.hash))
    shutil.rmtree(tmp)
    return infos


def _dataset(tmp_path, second):
    root = str(tmp_path / "mixed")
    os.makedirs(root)
    shards = _part(root, "a", "parquet", 40, True)
    if second == "parquet without cls":
        shards += _part(root, "b", "parquet", 40, False)
    elif second == "tar without cls":
        shards += _part(root, "b", "tar", 40, False)
    else:
        shards += _part(root, "b", "tar", 40, True, cls_bytes=True)
    write_index(root, shards)
    return root


@pytest.mark.parametrize("second", ["parquet without cls", "tar without cls"])
@pytest.mark.parametrize("path", ["one call", "group by group"])
def test_samples_without_the_typed_field_read_none(tmp_path, monkeypatch, second, path):
    root = _dataset(tmp_path, second)
    if path == "group by group":
        monkeypatch.setattr(column_gather.ColumnGather, "of", classmethod(lambda cls, *a: None))
    # a fresh heap full of a marker makes stale memory visible if a slot is never written
    junk = np.full(1 << 16, 0x5A5A5A5A5A, np.int64)
    del junk
    reader = BatchReader(open_index(root))
    ids = np.random.default_rng(4).permutation(80)
    batch = reader.read(ids)
    reader.close()
    cls = batch.fields["cls"][1].tolist()
    want = [1000 + i if i < 40 else None for i in ids.tolist()]
    assert cls == want


@pytest.mark.parametrize("path", ["one call", "group by group"])
def test_a_field_typed_in_one_shard_and_bytes_in_another_is_refused_by_name(tmp_path, monkeypatch, path):
    root = _dataset(tmp_path, "tar with cls as bytes")
    if path == "group by group":
        monkeypatch.setattr(column_gather.ColumnGather, "of", classmethod(lambda cls, *a: None))
    reader = BatchReader(open_index(root))
    with pytest.raises(ShardError, match=r"b-shard-000000\.tar.*'cls' is bytes here but a typed column"):
        reader.read(np.arange(30, 50))
    # batches within one kind of shard still read
    assert reader.read(np.arange(0, 20)).fields["cls"][1].tolist() == list(range(1000, 1020))
    reader.close()


def test_the_loader_delivers_none_for_the_samples_without_it(tmp_path):
    root = _dataset(tmp_path, "tar without cls")
    got = {}
    for batch in Loader(ShardDataset(root, shuffle="global", seed=1), batch_size=16):
        got.update(zip(batch["__key__"], batch["cls"]))
    assert len(got) == 80
    assert {k: v for k, v in got.items() if k.startswith("a")} == {f"a{i:03d}": 1000 + i for i in range(40)}
    assert all(got[f"b{i:03d}"] is None for i in range(40))
