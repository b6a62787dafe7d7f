"""A batch's gather split over two threads (formats/engine/split_gather.py) returns
exactly what one call returns, reports damage and truncation in either half
as one call does, keeps small or contiguous batches as one call, and works
in a forked child; the Loader allows it only at num_workers=0."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest

from shardfeed.formats import ShardError, ShardWriter, open_index
from shardfeed.formats.engine.batch import BatchReader
from shardfeed.formats.engine.split_gather import (
    EXPLORE_EVERY,
    EXPLORE_MAX,
    MIN_RUNS,
    TRY_BATCHES,
    SplitGather,
    _runs,
    threads_allowed,
)
from shardfeed.loader import Loader, ShardDataset
from tests.conftest import labelled_sample

N = 600


@pytest.fixture
def shards(tmp_path):
    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=97) as w:
        for i in range(N):
            s = labelled_sample(i, payload_bytes=30 + (i * 53) % 400)
            if i % 11 == 4:
                del s["txt"]
            w.write(s)
    return root


def _reader(index, split: bool, **kw) -> BatchReader:
    r = BatchReader(index, **kw)
    if split:
        r.allow_threads(2)
        g = r._tar_gather
        g.split, g._wait = True, 10 ** 9  # as if split were measured faster, with no try of one call
    return r


def _content(raw) -> list:
    buf = raw.buf.tobytes()
    out = []
    for r in range(len(raw)):
        fields = {name: (None if int(spec[2][r]) < 0 else buf[int(spec[1][r]):int(spec[1][r]) + int(spec[2][r])])
                  for name, spec in raw.fields.items()}
        out.append((int(raw.ids[r]), raw.keys[r], int(raw.shards[r]), fields))
    return out


def _shuffled(n_batches: int = 4, size: int = 256) -> list[np.ndarray]:
    rng = np.random.default_rng(9)
    return [rng.permutation(N)[:size] for _ in range(n_batches)] + [rng.integers(0, N, 300)]


def test_split_batches_equal_one_call(shards):
    index = open_index(shards)
    one, two = _reader(index, False), _reader(index, True)
    one.read(np.arange(N))  # open every shard: the steady path
    two.read(np.arange(N))
    batches = _shuffled()
    for ids in batches:
        got, want = two.read(ids), one.read(ids)
        assert _content(got) == _content(want)
        assert got.bytes_read == want.bytes_read and list(got.fields) == list(want.fields)
        for sid, key, _, fields in _content(got):
            assert key == f"{sid:08d}" and fields["bin"] == labelled_sample(sid, 30 + (sid * 53) % 400)["bin"]
    assert two._tar_gather.seen == [0, len(batches)]  # every shuffled batch was split
    assert one._tar_gather.seen == [0, 0]  # not allowed threads: never timed, never split
    # the general path (shards opening in the batch) splits too
    fresh = _reader(index, True)
    assert _content(fresh.read(batches[0])) == _content(one.read(batches[0]))
    assert fresh._tar_gather.seen == [0, 1]
    for r in (one, two, fresh):
        r.close()


def test_runs_tell_stored_from_shuffled_batches():
    """The split decision's count: one run for a stored batch inside a shard, one per shard
    crossed, about one per sample for a shuffled batch (and never many for a stored one)."""
    n = 256
    assert _runs(np.zeros(n, np.int64), np.arange(4000, 4000 + n)) == 1
    slot, local = np.repeat(np.array([3, 5]), n // 2), np.r_[np.arange(4000, 4128), np.arange(0, 128)]
    assert _runs(slot, local) == 2
    assert _runs(np.zeros(3, np.int64), np.array([7, 9, 8])) == 3  # ends 1 apart, not n - 1
    rng = np.random.default_rng(5)
    ids = rng.permutation(8 * 4096)[:n]
    assert _runs(ids // 4096, ids % 4096) >= n - 8 >= MIN_RUNS
    assert _runs(np.zeros(1, np.int64), np.array([3])) == 1 and _runs(np.zeros(0, np.int64), np.zeros(0, np.int64)) == 0


def test_contiguous_and_small_batches_stay_one_call(shards):
    index = open_index(shards)
    r = _reader(index, True)
    r.read(np.arange(0, 300))  # 4 runs (one per shard): memory bound, never split
    r.read(np.random.default_rng(1).permutation(N)[:2 * MIN_RUNS - 1])  # too few samples
    assert r._tar_gather.seen == [0, 0]  # neither batch was eligible
    r.close()


def _damage(index, shard: int, row: int) -> None:
    r = BatchReader(index)
    r.read(np.arange(N))
    view = r.shards.views[shard]
    off = int(view.offset[int(view.member_start[row])])
    r.close()
    with open(index.path(shard), "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0xFF]))


@pytest.mark.parametrize("half", [0, 1])
def test_damage_in_either_half_is_caught(shards, half):
    index = open_index(shards)
    ids = np.random.default_rng(3).permutation(N)[:256]
    victim = int(ids[10 if half == 0 else 200])
    shard, row = (int(a[0]) for a in index.locate(np.array([victim])))
    strict, skipping = _reader(index, True), _reader(index, True, skip=True)
    for r in (strict, skipping):
        r.read(np.arange(N))
    _damage(index, shard, row)
    with pytest.raises(ShardError, match="checksum") as e:
        strict.read(ids)
    assert index.path(shard) in str(e.value) and f"{victim:08d}" in str(e.value)
    raw = skipping.read(ids)
    assert victim not in raw.ids.tolist() and len(raw) == len(ids) - 1
    assert len(raw.errors) == 1 and "checksum" in raw.errors[0].reason
    assert strict._tar_gather.seen[1] >= 1
    for r in (strict, skipping):
        r.close()


def test_truncation_in_second_half_names_the_sample(shards):
    """A shard cut short after opening: the row reported is the batch's, not the half's."""
    index = open_index(shards)
    r = _reader(index, True)
    r.read(np.arange(N))
    last, row = (int(a[0]) for a in index.locate(np.array([N - 1])))
    ids = np.random.default_rng(4).permutation(N - row - 1)[:256]
    ids[-1] = N - 1  # the last sample of the last shard, in the second half
    with open(index.path(last), "r+b") as f:
        f.truncate(f.seek(0, 2) - 2048)
    with pytest.raises(ShardError, match="came up short") as e:
        r.read(ids)
    assert index.path(last) in str(e.value) and f"sample {row}" in str(e.value)
    assert r._tar_gather.seen[1] >= 1
    r.close()


def _child_read(reader, ids, out):
    out.put((_content(reader.read(ids)), reader._tar_gather.seen[1]))


def test_split_reader_works_in_a_forked_child(shards):
    index = open_index(shards)
    parent = _reader(index, True)
    ids = _shuffled(1)[0]
    parent.read(ids)  # the parent's helper thread is running when it forks
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    splits = parent._tar_gather.seen[1]
    p = ctx.Process(target=_child_read, args=(parent, ids, q))  # forked: the child uses the parent's reader
    p.start()
    got, child_splits = q.get(timeout=60)
    p.join(timeout=60)
    assert p.exitcode == 0
    assert child_splits == splits + 1  # split in the child, on a helper thread of its own
    assert got == _content(parent.read(ids))
    parent.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_allows_threads_only_at_zero_workers(shards, workers, monkeypatch):
    batches = [b["__key__"] for b in Loader(ShardDataset(shards, shuffle="global", seed=2), batch_size=200,
                                            num_workers=workers)]
    monkeypatch.setenv("SHARDFEED_READ_THREADS", "1")
    loader = Loader(ShardDataset(shards, shuffle="global", seed=2), batch_size=200, num_workers=workers)
    assert [b["__key__"] for b in loader] == batches
    if workers == 0:
        assert loader._maker.reader._tar_gather.threads == 1
    monkeypatch.delenv("SHARDFEED_READ_THREADS")
    loader = Loader(ShardDataset(shards, shuffle="global", seed=2), batch_size=200, num_workers=workers)
    assert [b["__key__"] for b in loader] == batches
    if workers == 0:
        assert loader._maker.reader._tar_gather.threads == threads_allowed()
        if threads_allowed() == 2:
            assert sum(loader._maker.reader._tar_gather.seen) == len(batches)  # every batch eligible and timed


def test_the_faster_way_is_kept_and_tries_back_off():
    """The choice logic on given timings: a try that beats the way in use by the
    margin switches to it; a try that does not doubles the wait for the next."""
    g = SplitGather(np.zeros((4, 2), np.int64), np.empty(16, np.uint8))
    g.cost = [2e-6, 0.0]
    g._tries = [1e-6, 9e-6, 1.2e-6]  # split tried: median 1.2 us against 2 us in use
    g._decide()
    assert g.split and g.cost[1] == 1.2e-6 and g._wait == EXPLORE_EVERY
    g._tries = [1.19e-6, 1.18e-6, 5e-6]  # one call tried: median 1.19 us, not 5% faster than 1.2 us
    g._decide()
    assert g.split and g.cost[0] == 1.19e-6 and g._wait == 2 * EXPLORE_EVERY
    for _ in range(20):
        g._tries = [9e-6] * TRY_BATCHES
        g._decide()
    assert g.split and g._wait == EXPLORE_MAX
    g._tries = [0.1e-6] * TRY_BATCHES  # the machine changed: one call now wins, tries come often again
    g._decide()
    assert not g.split and g._wait == EXPLORE_EVERY
