"""At num_workers=0 the next batch is read on a thread while the consumer is away (loader/read_ahead.py).

The thread changes when a batch is read, never what is delivered: the same
batches as reading in turn, views that stay intact while their batch is out,
an error at the batch it belongs to, an exact resume, and nothing left
running after the loop is left.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from conftest import flip_byte, labelled_sample
from shardfeed.formats import open_index
from shardfeed.formats.errors import ShardError
from shardfeed.formats.readers import open_shard
from shardfeed.loader import Loader, ShardDataset, read_ahead
from shardfeed.loader import batcher as batcher_module

AWAY_S = 0.004  # the consumer's step: long next to reading a batch of these small samples


@pytest.fixture
def readers(monkeypatch):
    """The threads that made each batch."""
    names: list[str] = []
    real = batcher_module.BatchMaker.make

    def spy(self, *a, **k):
        names.append(threading.current_thread().name)
        return real(self, *a, **k)

    monkeypatch.setattr(batcher_module.BatchMaker, "make", spy)
    return names


def _plain(batch):
    out = {}
    for k, v in batch.items():
        if isinstance(v, torch.Tensor):
            out[k] = v.tolist()
        elif isinstance(v, list):
            out[k] = [bytes(x.numpy()) if isinstance(x, torch.Tensor) else x for x in v]
        else:
            out[k] = v
    return out


def _epochs(root, monkeypatch, ahead: bool, shuffle="global", away=AWAY_S, bytes_as="bytes", epochs=2):
    monkeypatch.setenv("SHARDFEED_READ_AHEAD", "1" if ahead else "0")
    got = []
    with Loader(ShardDataset(root, shuffle=shuffle, seed=5), batch_size=16, bytes_as=bytes_as) as ld:
        for epoch in range(epochs):
            ld.set_epoch(epoch)
            for batch in ld:
                if away:
                    got.append(_plain(batch))  # read before the consumer's step: views last until the next
                    time.sleep(away)
                else:
                    got.append(batch)  # a bare loop (bytes are copies: they outlive the next batch)
        assert getattr(ld, "_read_ahead", False) is ahead
    return got if away else [_plain(b) for b in got]


@pytest.mark.parametrize("shuffle", ["global", "none"])
def test_reading_ahead_delivers_the_batches_of_reading_in_turn(make_dataset, monkeypatch, readers, shuffle):
    root = make_dataset(300, shard_samples=70)
    # which thread reads is the point here: a step long enough that a loaded machine's slower reads (the
    # pace reads ahead while the consumer is away half a read or more) still leave the thread its turn
    away = 5 * AWAY_S
    in_turn = _epochs(root, monkeypatch, False, shuffle, away=away)
    assert "shardfeed-read-ahead" not in readers
    readers.clear()
    ahead = _epochs(root, monkeypatch, True, shuffle, away=away)
    assert ahead == in_turn
    assert readers.count("shardfeed-read-ahead") >= len(readers) - 4  # all but the first of each epoch or so
    assert sorted(k for b in ahead[:19] for k in b["__key__"]) == [f"{i:08d}" for i in range(300)]  # epoch 0


def test_a_consumer_that_asks_again_at_once_reads_in_turn(make_dataset, monkeypatch, readers):
    root = make_dataset(300, shard_samples=70)
    assert _epochs(root, monkeypatch, True, away=0) == _epochs(root, monkeypatch, False, away=0)
    # no consumer step to hide a read behind: the batches are read when asked for, without handoffs
    assert readers.count("shardfeed-read-ahead") <= 2


def test_views_stay_intact_while_their_batch_is_out(make_dataset, monkeypatch, readers):
    """bytes_as="tensor": each batch views one of two buffers; the read ahead writes the other."""
    root = make_dataset(200, shard_samples=50)
    monkeypatch.setenv("SHARDFEED_READ_AHEAD", "1")
    with Loader(ShardDataset(root, shuffle="global", seed=1), batch_size=16, bytes_as="tensor") as ld:
        for batch in ld:
            time.sleep(AWAY_S)  # the next batch is read meanwhile
            for key, view in zip(batch["__key__"], batch["bin"]):
                assert bytes(view.numpy()) == labelled_sample(int(key))["bin"]
    assert readers.count("shardfeed-read-ahead") >= 5


def test_a_damaged_sample_raises_at_its_batch(make_dataset, monkeypatch):
    root = make_dataset(160, shard_samples=160)
    idx = open_index(root)
    with open_shard(idx, 0) as r:
        t = r.table
        at = int(t.offset[t.member_start[101] - 1])  # sample 100's last member: batch 6 in stored order
    flip_byte(idx.path(0), at + 1)
    monkeypatch.setenv("SHARDFEED_READ_AHEAD", "1")
    seen = []
    with Loader(ShardDataset(root, shuffle="none"), batch_size=16) as ld:
        with pytest.raises(ShardError, match="fails its checksum"):
            for batch in ld:
                seen.append(batch["__key__"][0])
                time.sleep(AWAY_S)
        assert ld._read_ahead
    assert seen == [f"{i:08d}" for i in range(0, 96, 16)]  # batches 0-5 delivered, the error at batch 6


def test_a_state_saved_with_a_read_in_flight_resumes_exactly(make_dataset, monkeypatch):
    root = make_dataset(300, shard_samples=70)
    monkeypatch.setenv("SHARDFEED_READ_AHEAD", "1")

    def make():
        return Loader(ShardDataset(root, shuffle="global", seed=8), batch_size=16)

    with make() as ref:
        whole = [b["__key__"] for b in ref]
    with make() as a:
        it = iter(a)
        head = []
        for _ in range(7):
            head.append(next(it)["__key__"])
            time.sleep(AWAY_S)  # batch 8 is read ahead meanwhile
        state = a.state_dict()
    with make() as b:
        b.load_state_dict(state)
        rest = [x["__key__"] for x in b]
    assert head + rest == whole


def _read_ahead_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == read_ahead.THREAD_NAME}


def test_leaving_the_loop_waits_for_the_read_and_ends_the_thread(make_dataset, monkeypatch):
    root = make_dataset(300, shard_samples=70)
    monkeypatch.setenv("SHARDFEED_READ_AHEAD", "1")
    before = _read_ahead_threads()  # another test's abandoned iterator may hold one until it is collected
    ours = set()
    with Loader(ShardDataset(root, shuffle="global", seed=2), batch_size=16) as ld:
        for i, _ in enumerate(ld):
            time.sleep(AWAY_S)
            ours |= _read_ahead_threads() - before
            if i == 5:
                break
        again = [b["__key__"] for b in ld]  # the rest of the epoch, from where the loop left
        assert len(again) == 19 - 6
    assert ours, "the loop never read ahead: nothing here was tested"
    for t in ours:
        t.join(5)
        assert not t.is_alive()


def test_a_consumer_that_never_steps_away_starts_no_thread(make_dataset, monkeypatch):
    """The thread starts with the first read ahead: an iterator left unfinished (a notebook's, a
    doc's) by a bare loop holds no idle thread until it is collected."""
    root = make_dataset(300, shard_samples=70)
    monkeypatch.setenv("SHARDFEED_READ_AHEAD", "1")
    before = _read_ahead_threads()
    with Loader(ShardDataset(root, shuffle="global", seed=2), batch_size=16) as ld:
        it = iter(ld)
        next(it)  # the first batch is read in turn, with no pace measured yet
        assert ld._read_ahead
        assert _read_ahead_threads() == before


def test_only_the_plain_fast_path_reads_ahead(make_dataset, monkeypatch):
    root = make_dataset(64, shard_samples=32)
    monkeypatch.setenv("SHARDFEED_READ_AHEAD", "1")
    cases = {"plain": ({}, {}), "transform": ({"transform": lambda s: s}, {}),
             "collate": ({}, {"collate_fn": lambda samples: samples})}
    got = {}
    for name, (ds_kw, ld_kw) in cases.items():
        with Loader(ShardDataset(root, **ds_kw), batch_size=16, **ld_kw) as ld:
            next(iter(ld))
            got[name] = ld._read_ahead
    assert got == {"plain": True, "transform": False, "collate": False}
    monkeypatch.setenv("SHARDFEED_READ_THREADS", "1")
    with Loader(ShardDataset(root), batch_size=16) as ld:
        next(iter(ld))
        assert not ld._read_ahead


def test_pace_reads_ahead_only_for_a_consumer_away_long_enough():
    pace = read_ahead.Pace()
    assert not pace.ahead()  # nothing measured: the first batch is read when asked for
    pace.read(0.002)
    pace.away(0.0001)
    assert not pace.ahead()
    for _ in range(12):
        pace.away(0.003)
    assert pace.ahead()
    assert np.isclose(pace.read_s, 0.002)


EXIT_WITH_A_LIVE_ITERATOR = """
import sys, time
from shardfeed.loader import Loader, ShardDataset
loader = Loader(ShardDataset(sys.argv[1], shuffle="global", seed=2), batch_size=16)
it = iter(loader)
for _ in range(10):
    next(it)
    time.sleep(0.02)  # away: the next batch is read ahead, so the thread runs
    if any(t.name == "shardfeed-read-ahead" for t in __import__("threading").enumerate()):
        break
else:
    sys.exit("never read ahead: nothing tested")
print("left", flush=True)  # the iterator and its thread are still alive when the interpreter ends
"""


def test_a_process_ends_with_an_iterator_still_reading_ahead(make_dataset):
    import subprocess
    import sys

    root = make_dataset(300, shard_samples=70)
    done = subprocess.run([sys.executable, "-c", EXIT_WITH_A_LIVE_ITERATOR, root], capture_output=True, text=True,
                          timeout=60, env={**__import__("os").environ, "SHARDFEED_READ_AHEAD": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "left"
