"""A Mixture with a followed (growing) source beside fixed replay sources:
every published sample once, exact fixed counts per global batch, equal
steps per rank, exact and elastic resume mid-stream."""

from __future__ import annotations

import collections
import os
import threading
import time

import pytest

from loader_helpers import keys_of, step_together
from shardfeed.formats import ShardWriter
from shardfeed.formats.commit_log import LOG_DIR
from shardfeed.loader import Loader, Mixture, ShardDataset
from shardfeed.shuffling.apportion import apportion

FOLLOW = {"poll_s": 0.02, "idle_timeout_s": 60}


def _fixed(root, prefix, n, per):
    with ShardWriter(root, max_shard_samples=per) as w:
        for i in range(n):
            w.write({"__key__": f"{prefix}-{i:04d}", "cls": i})
    return str(root)


def _append(root, start, n, per=7, end=False, pause=0.0):
    w = ShardWriter(root, append=True, max_shard_samples=per, prefix=f"p{start}")
    for i in range(start, start + n):
        w.write({"__key__": f"new-{i:05d}", "cls": i})
        if pause and (i + 1) % per == 0:
            time.sleep(pause)
    if end:
        w.end_stream()
    else:
        w.close()


@pytest.fixture
def fixed(tmp_path):
    return [_fixed(tmp_path / "a", "fa", 23, 5), _fixed(tmp_path / "b", "fb", 40, 9)]


def _mixture(stream, fixed, r=0, w=1, weights=(2, 1, 1), drop_last=False):
    follow = ShardDataset(str(stream), follow=True, seed=5, **FOLLOW)
    return Mixture([follow] + fixed, weights=list(weights), seed=1, rank=r, world_size=w, drop_last=drop_last)


def _source(k):
    return k.split("-")[0]


@pytest.mark.parametrize("world,batch_size,num_workers", [(1, 8, 0), (2, [5, 3], 2)])
def test_live_writer_every_published_sample_once_and_fixed_counts_exact(tmp_path, fixed, world, batch_size,
                                                                         num_workers):
    stream = tmp_path / "stream"
    os.makedirs(stream / LOG_DIR)
    writer = threading.Thread(target=_append, args=(stream, 0, 101), kwargs={"end": True, "pause": 0.01})
    loaders = [Loader(_mixture(stream, fixed, r, world), batch_size, num_workers=num_workers) for r in range(world)]
    writer.start()
    try:
        # one global batch at a time, over all ranks: each rank's batch is its slice
        its = [iter(L) for L in loaders]
        batches = []
        while True:
            got = [next(it, None) for it in its]
            assert len({g is None for g in got}) == 1, "ranks took different steps"
            if got[0] is None:
                break
            batches.append([k for b in got for k in b["__key__"]])
    finally:
        writer.join(60)
        for L in loaders:
            L.close()
    G = 8
    want = apportion(G, [2, 1, 1])  # [4, 2, 2]
    full, tail = divmod(101, want[0])
    assert len(batches) == full + (tail > 0)
    for b in batches[:full]:
        c = collections.Counter(_source(k) for k in b)
        assert [c["new"], c["fa"], c["fb"]] == want
    assert {_source(k) for k in batches[-1]} == {"new"} and len(set(batches[-1])) == tail
    new = collections.Counter(k for b in batches for k in b if k.startswith("new"))
    assert sorted(new) == [f"new-{i:05d}" for i in range(101)]
    assert sum(new.values()) - 101 <= world - 1  # padding only when the tail is shorter than the world
    # each fixed source walks its own permutations: no repeat before every sample came
    fa = [k for b in batches for k in b if k.startswith("fa")]
    assert len(set(fa[:23])) == 23 and len(fa) == 2 * full


def test_resume_mid_stream_exact_while_it_grows(tmp_path, fixed):
    stream = tmp_path / "stream"
    _append(stream, 0, 30)

    def make():
        return Loader(_mixture(stream, fixed), 6)

    with make() as a:
        it = iter(a)
        first = [keys_of([next(it)]) for _ in range(3)]
        state = a.state_dict()
    assert state["feed"]["kind"] == "mixture-stream" and len(repr(state)) < 800
    _append(stream, 30, 47, end=True)
    with make() as b:
        b.load_state_dict(state)
        rest = [keys_of([x]) for x in b]
    with make() as ref:
        whole = [keys_of([x]) for x in ref]
    assert first + rest == whole
    assert sorted(k for ks in whole for k in ks if k.startswith("new")) == [f"new-{i:05d}" for i in range(77)]


def test_elastic_resume_2_ranks_to_1_keeps_every_stream_sample_once(tmp_path, fixed):
    stream = tmp_path / "stream"
    _append(stream, 0, 90, end=True)
    two = [Loader(_mixture(stream, fixed, r, 2), 4, num_workers=0) for r in range(2)]
    before, taken = step_together(two, steps=5)
    state = two[1].state_dict()
    with Loader(_mixture(stream, fixed, 0, 1), 6) as one:
        one.load_state_dict(state)
        after = list(one)
    delivered = [k for ks in before for k in ks] + keys_of(after)
    new = collections.Counter(k for k in delivered if k.startswith("new"))
    assert sorted(new) == [f"new-{i:05d}" for i in range(90)] and max(new.values()) == 1
    # the fixed sources continue their walks where the 2-rank job stopped: no early repeat
    fb = [k for k in delivered if k.startswith("fb")]
    assert len(set(fb[:40])) == min(40, len(fb))
    for L in two:
        L.close()


def test_drop_last_drops_the_stream_tail(tmp_path, fixed):
    stream = tmp_path / "stream"
    _append(stream, 0, 21, end=True)
    with Loader(_mixture(stream, fixed, drop_last=True), 8) as L:
        keys = keys_of(L)
    assert len(keys) == 5 * 8 and len({k for k in keys if k.startswith("new")}) == 20


def test_bad_stream_mixtures_name_the_fix(tmp_path, fixed):
    stream = tmp_path / "stream"
    _append(stream, 0, 10)
    follow = ShardDataset(str(stream), follow=True, **FOLLOW)
    with pytest.raises(ValueError, match="give weights="):
        Mixture([follow] + fixed)
    with pytest.raises(ValueError, match="give weights="):
        Mixture([follow] + fixed, weights=[1, 1, 1], epoch_samples=10)
    with pytest.raises(NotImplementedError, match="one followed source"):
        Mixture([follow, ShardDataset(str(stream), follow=True)], weights=[1, 1])
    with pytest.raises(ValueError, match="not a curriculum"):
        Mixture([follow] + fixed, weights=[(1, [1, 1, 1])])
    mx = Mixture([follow] + fixed, weights=[0.01, 1, 1])
    with pytest.raises(ValueError, match="no sample of a global batch"):
        Loader(mx, 4)
    with Loader(Mixture([follow] + fixed, weights=[1, 1, 1]), 3) as L, pytest.raises(TypeError, match="no length"):
        len(L)
