"""The open-shard table: pins hold shards open against eviction, the slot
table grows on demand, and a reader follows a grown index."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from test_formats_batch import _as_samples, _expected

from conftest import labelled_sample
from shardfeed.formats import ShardError, ShardWriter, open_index
from shardfeed.formats.engine.batch import BatchReader
from shardfeed.formats.engine.open_shards import INITIAL_SLOTS, OpenShards
from shardfeed.formats.errors import ReadError
from shardfeed.formats.key_blob import Keys
from shardfeed.formats.own_tables import read_sidecar
from shardfeed.formats.sidecar import SIDECAR_SUFFIX, write_sidecar
from shardfeed.loader.error_policy import ErrorPolicy


def _is_open(view) -> bool:
    return view.src is not None  # TarView.close() drops its bytes


def test_pins_are_counted_and_an_unmatched_unpin_is_refused(make_dataset):
    t = OpenShards(open_index(make_dataset(20, shard_samples=5)))
    v = t.pin(1)
    assert t.pin(1) is v and t.is_pinned(1) and t.pinned() == {1}
    t.unpin(1)
    assert t.is_pinned(1)  # one holder left
    t.unpin(1)
    assert not t.is_pinned(1) and t.pinned() == frozenset()
    with pytest.raises(ValueError, match="not pinned"):
        t.unpin(1)
    with t.holding([0, 2]) as views:
        assert t.pinned() == {0, 2} and all(_is_open(w) for w in views)
    assert t.pinned() == frozenset()
    t.close()
    t.close()  # twice is fine


def test_eviction_never_closes_a_pinned_shard(make_dataset):
    t = OpenShards(open_index(make_dataset(30, shard_samples=5)), max_open=2)  # 6 shards
    held = t.pin(0)
    for s in range(1, 6):
        t.get(s)
        t.evict()
    assert _is_open(held) and t.views[0] is held  # the least recently used, but pinned
    assert len(t.views) == 2 and 5 in t.views
    with t.holding(range(6)):
        t.evict()
        assert len(t.views) == 6  # all pinned: over max_open, nothing closed
    t.evict()
    assert _is_open(held) and len(t.views) == 2
    t.unpin(0)
    t.get(4)
    t.evict()
    assert not _is_open(held) and 0 not in t.views  # unpinned, it goes like any other
    t.close()


def test_a_shard_retired_while_pinned_closes_at_its_last_unpin(make_dataset):
    root = make_dataset(10, shard_samples=5)
    t = OpenShards(open_index(root))
    v = t.pin(1)
    t.retire(1, "damaged")
    assert _is_open(v) and 1 not in t.views
    with pytest.raises(ShardError, match="damaged"):
        t.get(1)  # never handed out again
    t.unpin(1)
    assert not _is_open(v)
    t.close()


def test_a_reader_never_closes_a_shard_pinned_by_another_holder(make_dataset):
    root = make_dataset(40, shard_samples=5)  # 8 shards
    r = BatchReader(open_index(root), max_open=1)
    held = r.shards.pin(0)
    for start in range(5, 40, 5):
        ids = np.arange(start, start + 5)
        assert _as_samples(r.read(ids)) == _expected(root, ids)
        assert r._open[0] is held and _is_open(held)
    assert _as_samples(r.read([1, 2])) == _expected(root, [1, 2])  # read through the held view
    assert r.shards.pinned() == {0}  # the reader's own pins are all released after a read
    r.shards.unpin(0)
    r.read([39])
    assert not _is_open(held) and list(r._open) == [7]
    r.close()


def test_the_slot_table_grows_on_demand_not_sized_from_the_index(make_dataset):
    root = make_dataset(3 * INITIAL_SLOTS * 2, shard_samples=2)  # 3 x INITIAL_SLOTS shards
    index = open_index(root)
    r = BatchReader(index)
    assert len(r.shards.table) == INITIAL_SLOTS < len(index)
    ids = np.arange(index.num_samples)[::-1]
    assert _as_samples(r.read(ids)) == _expected(root, ids)  # every shard open in one batch
    assert len(r.shards.table) >= len(index) and len(r._open) == len(index)
    r.close()


@pytest.mark.parametrize("read_mode", ["pread", "mmap"])
def test_a_reader_given_a_grown_index_reads_the_new_shards(make_dataset, read_mode):
    root = make_dataset(20, shard_samples=5)
    r = BatchReader(open_index(root), read_mode=read_mode)
    r.read(np.arange(20))  # the old shards open
    with ShardWriter(root, append=True, max_shard_samples=5, prefix="more") as w:
        for i in range(20, 32):
            w.write(labelled_sample(i))
    grown = open_index(root)
    assert len(grown) == 7 and grown.num_samples == 32
    with pytest.raises(IndexError):
        r.read([25])  # not there yet for this reader
    r.update_index(grown)
    ids = np.array([31, 3, 20, 19, 27, 0, 25])
    assert _as_samples(r.read(ids)) == _expected(root, ids)
    assert r.read(ids).keys == [f"{i:08d}" for i in ids]
    r.close()


def test_an_index_that_is_not_a_grown_one_is_refused(make_dataset):
    a, b = open_index(make_dataset(20, shard_samples=5)), open_index(make_dataset(20, shard_samples=4))
    r = BatchReader(a)
    with pytest.raises(ValueError, match="does not start with the 4 shards"):
        r.update_index(b)
    assert r.index is a
    r.close()


def test_skipped_samples_come_back_as_read_error_records(make_dataset, caplog):
    root = make_dataset(20, shard_samples=5)
    path = open_index(root).path(2)
    with open(path, "r+b") as f:
        f.truncate(1024)
    r = BatchReader(open_index(root), skip=True)
    raw = r.read(np.arange(20))
    r.close()
    assert len(raw) == 15
    (e,) = raw.errors
    assert isinstance(e, ReadError) and e.shard == path and e.samples == 5 and e.reason
    assert tuple(e) == (e.shard, e.reason, e.samples)
    with caplog.at_level(logging.WARNING, logger="shardfeed.loader"):
        assert ErrorPolicy("skip").report([e, ReadError(path, "again", 2)]) == 7
    assert sum(path in m for m in caplog.messages) == 1  # logged once per shard


@pytest.mark.parametrize("read_mode", ["pread", "mmap"])
def test_a_shard_opened_from_its_sidecar_makes_no_per_sample_key_strings(make_dataset, read_mode):
    """The keys go to the gather as the sidecar's UTF-8 blob: opening shards for a batch builds no str per
    sample (16 shards of 4,096 made 65,536 of them at a fresh process's first batch)."""
    root = make_dataset(40, shard_samples=10)
    r = BatchReader(open_index(root), read_mode=read_mode)
    ids = np.array([37, 2, 15, 22, 9])
    assert r.read(ids).keys == [f"{i:08d}" for i in ids]
    views = list(r.shards.views.values())
    assert len(views) == 4 and all(isinstance(v.keys, Keys) and v.keys._list is None for v in views)
    assert list(r.shards.views[3].keys) == [f"{i:08d}" for i in range(30, 40)]  # made when asked for
    r.close()


def test_a_sidecar_key_holding_a_nul_is_refused_at_open(make_dataset):
    root = make_dataset(10, shard_samples=10)
    index = open_index(root)
    path = index.path(0)
    table, meta = read_sidecar(path + SIDECAR_SUFFIX, path)
    keys = list(table.keys)
    keys[3] = "000\x0003"  # a forged sidecar: its digest is recomputed, so only the key check can see it
    table.keys = keys
    write_sidecar(path + SIDECAR_SUFFIX, table, meta["shard_bytes"], meta["shard_hash"])
    r = BatchReader(index)
    with pytest.raises(ShardError, match="NUL byte"):
        r.read([0])
    r.close()
