"""A global batch's missing Parquet row groups decoded on two threads (formats/engine/row_group_threads.py).

The helper only fills the decoded-group store: batches, keys and bytes are
those of one thread, and a damaged group raises (or is skipped) on the
reading thread exactly as without the helper.
"""

from __future__ import annotations

import threading

import numpy as np
import pyarrow.parquet as pq
import pytest

from conftest import flip_byte
from shardfeed.formats import ShardWriter, open_index
from shardfeed.formats.engine import columns
from shardfeed.formats.engine.batch import BatchReader
from shardfeed.formats.engine.columns import DECODED
from shardfeed.formats.errors import ShardError
from shardfeed.formats.writer import _ColumnarShard
from shardfeed.loader import Loader, ShardDataset

HELPER = "shardfeed-group-decode"


def _write(root, n=480, per_shard=120, rows_per_group=20):
    rng = np.random.default_rng(5)
    old = _ColumnarShard.ROWS_PER_GROUP
    _ColumnarShard.ROWS_PER_GROUP = rows_per_group  # 6 groups a shard: a global batch needs most of them
    try:
        with ShardWriter(root, format="parquet", max_shard_samples=per_shard) as w:
            for i in range(n):
                w.write({"__key__": f"k{i:05d}", "bin": rng.bytes(int(rng.integers(1, 300))), "cls": i % 7})
    finally:
        _ColumnarShard.ROWS_PER_GROUP = old
    return root


@pytest.fixture
def decoders(monkeypatch):
    """The threads that decoded each (shard path, group)."""
    seen: dict[tuple[str, int], set[str]] = {}
    real = columns.ColumnarView.decoded

    def spy(self, g, wait=True):
        if DECODED.get(self._id, g) is None:
            seen.setdefault((self.path, g), set()).add(threading.current_thread().name)
        return real(self, g, wait)

    monkeypatch.setattr(columns.ColumnarView, "decoded", spy)
    return seen


def _content(raw):
    out = [raw.ids.tolist(), list(raw.keys)]
    for name, spec in sorted(raw.fields.items()):
        if spec[0] == "array":
            out.append((name, spec[1].tolist()))
        else:
            out.append((name, [bytes(raw.buf[a:a + s]) for a, s in zip(spec[1].tolist(), spec[2].tolist())]))
    return out


def _read(root, threads, batches, skip=False):
    reader = BatchReader(open_index(root), skip=skip)
    reader.allow_threads(threads)
    try:
        out = []
        for ids in batches:
            raw = reader.read(ids)
            out.append((_content(raw), [(e.shard, e.reason, e.samples) for e in raw.errors]))
        return out
    finally:
        reader.close()


def _global_batches(n=480, size=64, seed=0):
    order = np.random.default_rng(seed).permutation(n)
    return [order[i:i + size] for i in range(0, n, size)]


def test_two_threads_decode_a_global_batch_and_deliver_what_one_thread_does(tmp_path, decoders):
    root = _write(str(tmp_path / "pq"))
    one = _read(root, 1, _global_batches())
    assert not [t for names in decoders.values() for t in names if t == HELPER]
    decoders.clear()
    two = _read(root, 2, _global_batches())
    assert two == one
    helped = {key for key, names in decoders.items() if HELPER in names}
    # the first batch needs most of the 24 groups of 4 shards: the helper took about half of them
    assert 6 <= len(helped) <= 18, sorted(helped)


def test_one_shards_groups_stay_on_one_thread(tmp_path, decoders):
    """Its ParquetFile (and its last-group memo) is never used by two threads at once."""
    root = _write(str(tmp_path / "pq"))
    _read(root, 2, [np.random.default_rng(1).permutation(480)[:240]])  # one batch: nearly every group
    by_shard: dict[str, set[str]] = {}
    for (path, _), names in decoders.items():
        by_shard.setdefault(path, set()).update(names)
    assert len(by_shard) == 4 and sum(len(v) for v in decoders.values()) == len(decoders)
    assert all(len(names) == 1 for names in by_shard.values()), by_shard
    assert sum(HELPER in names for names in by_shard.values()) == 2  # half the shards, half the groups


def test_batches_of_one_shard_stay_on_the_reading_thread(tmp_path, decoders):
    root = _write(str(tmp_path / "pq"))
    rng = np.random.default_rng(4)
    batches = [np.arange(i, i + 60) for i in range(0, 480, 60)]  # stored order, never across shards
    batches += [rng.permutation(120)[:60] + 120 * s for s in range(4)]  # shuffled inside one shard
    got = _read(root, 2, batches)
    assert got == _read(root, 1, batches)
    assert not [t for names in decoders.values() for t in names if t == HELPER]


def _damage_group(root, shard, group):
    path = open_index(root).path(shard)
    col = pq.ParquetFile(path).metadata.row_group(group).column(1)  # "bin": its data page
    flip_byte(path, col.data_page_offset + col.total_compressed_size // 2)
    return path


@pytest.mark.parametrize("threads", [1, 2])
def test_a_damaged_group_raises_on_the_reading_thread_naming_its_shard(tmp_path, threads):
    root = _write(str(tmp_path / "pq"))
    path = _damage_group(root, 2, 3)
    with pytest.raises(ShardError) as e:
        _read(root, threads, _global_batches())
    assert e.value.shard == path and "row group 3" in e.value.reason


def test_a_damaged_group_is_skipped_alike_with_two_threads(tmp_path):
    root = _write(str(tmp_path / "pq"))
    _damage_group(root, 1, 2)
    one = _read(root, 1, _global_batches(), skip=True)
    two = _read(root, 2, _global_batches(), skip=True)
    assert two == one
    assert sum(len(errors) for _, errors in one) >= 1  # the damaged group's shard was reported, not read


def test_the_loader_at_zero_workers_gives_the_same_batches_with_and_without_the_helper(tmp_path, monkeypatch,
                                                                                        decoders):
    root = _write(str(tmp_path / "pq"))

    def batches():
        with Loader(ShardDataset(root, shuffle="global", seed=2), batch_size=48) as ld:
            return [(b["__key__"], list(b["bin"]), b["cls"].tolist()) for b in ld]

    monkeypatch.setenv("SHARDFEED_READ_THREADS", "1")
    alone = batches()
    assert not [t for names in decoders.values() for t in names if t == HELPER]
    monkeypatch.delenv("SHARDFEED_READ_THREADS")
    assert batches() == alone
    assert [t for names in decoders.values() for t in names if t == HELPER]
    assert sorted(k for keys, _, _ in alone for k in keys) == [f"k{i:05d}" for i in range(480)]


def test_missing_groups_sees_groups_the_budget_took_back(tmp_path):
    """The per-shard count that spares the steady case a look per group follows every way a
    group leaves the store: reclaimed by the budget, dropped, the shard closed."""
    root = _write(str(tmp_path / "pq"))
    reader = BatchReader(open_index(root))
    try:
        reader.read(np.random.default_rng(0).permutation(480))  # every group of every shard decoded, kept
        view = reader.shards.get(0)
        everything = np.arange(120)
        assert view.missing_groups(everything) == [] and DECODED.kept[view._id] == 6
        DECODED.reclaim(1)  # the least recently used group: shard 0's first
        assert view.missing_groups(everything) == [0] and DECODED.kept[view._id] == 5
        DECODED.drop_group(view._id, 4)
        assert view.missing_groups(everything) == [0, 4]
        assert view.missing_groups(np.arange(20, 80)) == []  # rows of groups 1-3 only
        view.decoded(0)
        assert view.missing_groups(everything) == [4]
    finally:
        reader.close()
    assert DECODED.kept == {} and DECODED.nbytes() == 0
