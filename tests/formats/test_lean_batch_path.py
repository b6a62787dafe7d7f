"""The lean steady batch path gives what the generic code gives: the fused
layout kernel against DatasetIndex.locate and cumulative sizes, the plan's
fast positions against its generic machinery (padding included), the feed's
per-epoch cache across epoch changes and elastic resets, the byte-list
conversion against a plain reference, and the errors the steady path must
still raise."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shardfeed.formats import ShardWriter, open_index
from shardfeed.formats.engine.batch import BatchReader
from shardfeed.formats.engine.kernels import tar_sizes
from shardfeed.formats.engine.kernels_batch import (
    DST_POS,
    KPOS,
    LOCAL,
    NOT_OPEN,
    OK,
    OUT_OF_RANGE,
    SHARD,
    SLOT,
    tar_layout,
)
from shardfeed.loader import Loader, ShardDataset
from shardfeed.loader.collate import Blob
from shardfeed.loader.feeds.epoch import EpochFeed
from shardfeed.loader.schedule import BatchSchedule
from shardfeed.shuffling import Topology, make_plan
from shardfeed.shuffling.spec import PlanSpec
from tests.conftest import labelled_sample


@pytest.fixture
def uneven(tmp_path):
    """Shards of 1 to 9 samples, one lacking a field now and then."""
    root = str(tmp_path / "uneven")
    with ShardWriter(root, max_shard_samples=9) as w:
        for i in range(61):
            s = labelled_sample(i, payload_bytes=10 + (i * 53) % 200)
            if i % 5 == 2:
                del s["txt"]
            w.write(s)
    return root


def _layout(reader: BatchReader, ids: np.ndarray):
    n, nf = len(ids), len(reader.field_ids)
    work, present, uniq = reader._steady.scratch(n, nf)
    fpos = np.zeros((2, nf, n), np.int64)
    status, m = tar_layout(reader.index.offsets, reader.shards.slot_of, reader.shards.table, ids, work, fpos,
                           present, uniq)
    return status, m, work, fpos, present[:nf].copy(), uniq[:m].copy()


def test_layout_matches_locate_and_sizes(uneven):
    index = open_index(uneven)
    reader = BatchReader(index)
    rng = np.random.default_rng(1)
    n = index.num_samples
    batches = [np.arange(n), rng.permutation(n)[:40], rng.integers(0, n, 33), np.array([5, 5, 60, 0])]
    status, *_ = _layout(reader, batches[0])
    assert status == NOT_OPEN  # nothing open yet: the general path must read it
    reader.read(np.arange(n))  # opens every shard
    for ids in batches:
        ids = np.ascontiguousarray(ids, np.int64)
        status, m, work, fpos, present, uniq = _layout(reader, ids)
        assert status == OK
        k = len(ids)
        shard, local = index.locate(ids)
        assert work[SHARD, :k].tolist() == shard.tolist() and work[LOCAL, :k].tolist() == local.tolist()
        assert uniq.tolist() == np.unique(shard).tolist() and m == len(uniq)
        slot = reader.shards.slot_of[shard]
        assert work[SLOT, :k].tolist() == slot.tolist()
        sizes, ksizes = np.empty(k, np.int64), np.empty(k, np.int64)
        assert tar_sizes(reader.shards.table, slot, local, sizes, ksizes) == -1
        assert work[DST_POS, :k + 1].tolist() == [0] + np.cumsum(sizes).tolist()
        assert work[KPOS, :k + 1].tolist() == [0] + np.cumsum(ksizes + 1).tolist()
        assert (fpos == -1).all()
        lacks_txt = all(i % 5 == 2 for i in ids.tolist())
        names = reader._field_names()
        assert {names[f] for f in np.flatnonzero(present)} == {"bin", "cls", "txt"} - ({"txt"} if lacks_txt else set())
    for bad in ([0, n], [-1, 3]):
        assert _layout(reader, np.array(bad, np.int64))[0] == OUT_OF_RANGE
    reader.close()


def test_steady_path_raises_like_the_general_path_for_ids_out_of_range(uneven):
    index = open_index(uneven)
    reader = BatchReader(index)
    reader.read(np.arange(index.num_samples))
    n = index.num_samples
    for ids in ([0, 3, n], [-1, 0]):
        with pytest.raises(IndexError, match=rf"sample ids must lie in 0\.\.{n - 1}"):
            reader.read(np.array(ids))
    got = reader.read(np.array([3, 1, 3]))  # and reading goes on
    assert got.keys == [labelled_sample(i)["__key__"] for i in (3, 1, 3)]
    reader.close()


COUNTS = np.array([7, 0, 13, 5, 9, 11, 4, 8], dtype=np.int64)


@pytest.mark.parametrize("order", ["none", "global"])
@pytest.mark.parametrize("world", [1, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("start", [None, 2])
def test_fast_positions_equal_the_generic_ones(order, world, drop_last, start):
    """Every [a, b) of every rank, across the padding at the end of the epoch,
    also for a plan starting at a later shard (ids offset by its first id)."""
    for rank in range(world):
        plan = make_plan(COUNTS, order, seed=5, epoch=1, topology=Topology(rank, world), drop_last=drop_last,
                         start=start)
        n = plan.num_samples
        generic = (plan._lane_ids(rank, np.arange(n, dtype=np.int64)) if order == "global"
                   else plan._contiguous_ids(rank, 0, n))
        for a in range(n + 1):
            for b in range(a, min(n, a + 9) + 1):
                assert plan.positions(a, b).tolist() == generic[a:b].tolist()
        with pytest.raises(IndexError):
            plan.positions(0, n + 1)
        other = plan.for_rank((rank + 1) % world)  # the fast path is kept per rank
        assert other.positions(0, other.num_samples).tolist() == make_plan(
            COUNTS, order, seed=5, epoch=1, topology=Topology((rank + 1) % world, world),
            drop_last=drop_last, start=start).positions(0, other.num_samples).tolist()


def _feed(rank=0, world=1, order="global"):
    fp = {"samples": int(COUNTS.sum()), "shards": len(COUNTS), "order": order, "seed": 3, "drop_last": False}
    return EpochFeed(PlanSpec(COUNTS, order, 3), BatchSchedule.of(4), rank, world, None, fp)


def test_feed_items_follow_epoch_changes_and_elastic_resets():
    f = _feed()
    first = [f.next().ids().tolist() for _ in range(3)]
    f.set_epoch(2)
    fresh = _feed()
    fresh.set_epoch(2)
    assert [it.ids().tolist() for it in f] == [it.ids().tolist() for it in fresh]
    f.set_epoch(0)
    assert [f.next().ids().tolist() for _ in range(3)] == first
    # a state saved by 2 ranks, loaded by 1: history changes, so does the plan
    two = _feed(0, 2)
    two.next()
    state = json.loads(json.dumps(two.get_state()))
    f.reset(state)
    g = _feed()
    g.reset(state)
    assert [it.ids().tolist() for it in f] == [it.ids().tolist() for it in g]
    assert f.get_state() == g.get_state()


def _reference(buf: np.ndarray, starts, sizes, text=False) -> list:
    raw = buf.tobytes()
    out = []
    for a, s in zip(starts, sizes):
        v = None if s < 0 else raw[a:a + s]
        out.append(v.decode() if text and v is not None else v)
    return out


@pytest.mark.parametrize("text", [False, True])
def test_blob_to_list_matches_a_plain_reference(text):
    rng = np.random.default_rng(3)
    buf = np.frombuffer(("".join(chr(97 + i % 26) for i in range(100_000))).encode(), np.uint8)
    cases = [([], []), ([5], [0]), ([10, 0, 40], [3, 7, -1]), ([0, 50, 20], [-1, -1, -1]),
             (sorted(rng.integers(0, 90_000, 50).tolist()), rng.integers(0, 300, 50).tolist()),
             (rng.integers(0, 60_000, 20).tolist(), rng.integers(-1, 30_000, 20).tolist()),  # large items, out of order
             ([70_000, 100], [20_000, 10])]  # a span mostly holding other bytes
    for starts, sizes in cases:
        b = Blob(buf, np.array(starts, np.int64), np.array(sizes, np.int64), text)
        assert b.to_list() == _reference(buf, starts, sizes, text)


def test_equal_sized_values_come_back_exact_whatever_their_layout():
    """The equal-size fast path (a strided void view): NUL bytes at a value's end are kept (a
    bytes dtype would strip them), and any layout other than one constant stride is sliced."""
    buf = np.frombuffer(bytes(range(256)) * 40, np.uint8).copy()
    buf[::7] = 0
    n = len(buf)
    cases = [(list(range(0, 2049 * 4, 2049)), [2048] * 4),  # one after the other, other bytes between
             (list(range(6, 6 + 16 * 50, 16)), [16] * 50),  # values ending in NUL (buf[76] == 0...)
             ([n - 30, n - 20, n - 10], [10] * 3),  # the last value ends at the buffer's end
             ([300, 200, 100], [50] * 3),  # a negative stride
             ([0, 10, 30], [10] * 3), ([0, 10, 20, 35], [10] * 4),  # strides that change
             ([5, 5, 5], [9] * 3), ([0, 4], [8, 8]),  # repeats, overlapping values
             ([17], [1000]), ([0, 100], [100, 99])]
    for starts, sizes in cases:
        got = Blob(buf, np.array(starts, np.int64), np.array(sizes, np.int64)).to_list()
        assert got == _reference(buf, starts, sizes, False) and all(type(g) is bytes for g in got), (starts, sizes)


def test_int_column_with_a_missing_or_bad_value_still_reports_it(tmp_path):
    root = str(tmp_path / "ints")
    with ShardWriter(root, max_shard_samples=4) as w:
        for i in range(8):
            s = {"__key__": f"k{i}", "bin": bytes([i]), "cls": i}
            if i == 3:
                s["cls"] = b"x7"  # written as bytes: not an integer
            if i == 5:
                del s["cls"]
            w.write(s)
    with pytest.raises(Exception, match="'cls' is not an integer"):
        list(Loader(ShardDataset(root, shuffle="none"), 8))
    got = [b for b in Loader(ShardDataset(root, shuffle="none", on_error="skip"), 8)]
    assert got[0]["__key__"] == ["k0", "k1", "k2", "k4", "k5", "k6", "k7"]
    assert got[0]["cls"] == [0, 1, 2, 4, None, 6, 7]
