"""Parquet/Arrow rows of a batch placed by one jitted call over all their row
groups (formats/engine/column_gather.py) give exactly what the group-by-group
path gives: keys, bytes, text and typed values, in every order."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardfeed.formats import ShardWriter, open_index
from shardfeed.formats.engine import column_gather, decoded_budget
from shardfeed.formats.engine.batch import BatchReader
from shardfeed.formats.engine.columns import DECODED
from shardfeed.formats.index import ShardInfo, write_index
from shardfeed.formats.readers import hash_file
from shardfeed.formats.writer import _ColumnarShard


def _write(root, fmt, n=300, per_shard=120, rows_per_group=16):
    rng = np.random.default_rng(3)
    old = _ColumnarShard.ROWS_PER_GROUP
    _ColumnarShard.ROWS_PER_GROUP = rows_per_group  # many groups: a global batch touches most of them
    try:
        with ShardWriter(root, format=fmt, max_shard_samples=per_shard) as w:
            for i in range(n):
                w.write({"__key__": f"k{i:05d}", "bin": rng.bytes(int(rng.integers(0, 90))), "cls": i % 9,
                         "txt": "é" * (i % 4)})
    finally:
        _ColumnarShard.ROWS_PER_GROUP = old
    return root


def _content(batch):
    out = [batch.ids.tolist(), list(batch.keys)]
    for name, spec in batch.fields.items():
        if spec[0] == "array":
            out.append((name, "array", spec[1].dtype.str, spec[1].tolist()))
        else:
            out.append((name, spec[0], [None if s < 0 else bytes(batch.buf[a:a + s])
                                        for a, s in zip(spec[1].tolist(), spec[2].tolist())]))
    return out


def _orders(n):
    rng = np.random.default_rng(0)
    yield rng.permutation(n), (1, 7, 64)
    yield np.arange(n), (5, 64)  # stored order: runs through groups
    yield rng.integers(0, n, 200), (50,)  # repeats


def _both_paths(monkeypatch, root, n):
    fast, slow = [], []
    calls = []
    place = column_gather.ColumnGather.place

    def counted(self, *a, **k):
        calls.append(len(self.gi))
        return place(self, *a, **k)

    monkeypatch.setattr(column_gather.ColumnGather, "place", counted)
    for out, patch in ((fast, False), (slow, True)):
        if patch:
            monkeypatch.setattr(column_gather.ColumnGather, "of", classmethod(lambda cls, *a: None))
        reader = BatchReader(open_index(root))
        for order, sizes in _orders(n):
            for bs in sizes:
                out += [_content(reader.read(order[i:i + bs])) for i in range(0, len(order), bs)]
        reader.close()
    return fast, slow, calls


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_one_call_gather_equals_the_group_by_group_path(tmp_path, monkeypatch, fmt):
    root = _write(str(tmp_path / fmt), fmt)
    fast, slow, calls = _both_paths(monkeypatch, root, 300)
    assert calls and sum(calls) >= 3 * 300  # the fast path placed every sample of the fast pass
    assert fast == slow
    first = fast[0]
    assert first[1] == [f"k{first[0][0]:05d}"] and [f[0] for f in first[2:]] == ["bin", "cls", "txt"]


@pytest.mark.parametrize("case", ["typed nulls", "NUL in a key", "binary nulls only"])
def test_columns_it_cannot_take_keep_the_group_by_group_path(tmp_path, monkeypatch, case):
    """Typed nulls, a NUL in a key: the batch is placed group by group, values right
    (binary nulls the one call takes: size -1, as the group-by-group path gives)."""
    root = str(tmp_path / "foreign")
    os.makedirs(root)
    keys = [f"n{i:03d}" if i != 5 or case != "NUL in a key" else "n\0five" for i in range(100)]
    bins = [None if i % 11 == 0 else bytes([i]) * (i % 7) for i in range(100)]
    cls = [None if i % 13 == 0 and case == "typed nulls" else i for i in range(100)]
    pq.write_table(pa.table({"__key__": keys, "bin": pa.array(bins, pa.binary()), "cls": pa.array(cls, pa.int64())}),
                   f"{root}/a.parquet", row_group_size=10)
    write_index(root, [ShardInfo("a.parquet", "parquet", 100, os.path.getsize(f"{root}/a.parquet"),
                                 hash_file(f"{root}/a.parquet"))])
    answers = []
    of = column_gather.ColumnGather.of.__func__
    monkeypatch.setattr(column_gather.ColumnGather, "of",
                        classmethod(lambda cls, *a: answers.append(of(cls, *a)) or answers[-1]))
    reader = BatchReader(open_index(root))
    ids = np.random.default_rng(1).permutation(100)
    batch = reader.read(ids)
    reader.close()
    assert (answers == [None]) == (case != "binary nulls only")
    assert batch.keys == [keys[i] for i in ids]
    starts, sizes = batch.fields["bin"][1:]
    assert [None if s < 0 else bytes(batch.buf[a:a + s]) for a, s in zip(starts, sizes)] == [bins[i] for i in ids]
    assert batch.fields["cls"][1].tolist() == [cls[i] for i in ids]


def test_decoded_row_groups_stay_within_the_budget(tmp_path, monkeypatch):
    """A global pass with a budget of a few groups: held decoded bytes never exceed it, batches still right."""
    root = _write(str(tmp_path / "pq"), "parquet", n=400, per_shard=400, rows_per_group=20)
    reader = BatchReader(open_index(root))
    ids = np.random.default_rng(2).permutation(400)
    want = [_content(reader.read(ids[i:i + 32])) for i in range(0, 400, 32)]
    group_bytes = max(n for _, n in DECODED._groups.values())
    reader.close()
    limit = 3 * group_bytes + decoded_budget.used()
    monkeypatch.setattr(decoded_budget, "LIMIT", limit)
    reader = BatchReader(open_index(root))
    got, peak = [], 0
    for i in range(0, 400, 32):
        got.append(_content(reader.read(ids[i:i + 32])))
        peak = max(peak, sum(dec.nbytes for dec, _ in DECODED._groups.values()))
    reader.close()
    assert got == want
    assert peak <= limit
