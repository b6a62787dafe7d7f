"""Loader(num_workers="auto"): the choice is a valid worker count with its reason in stats(), and the
batches are exactly those of num_workers=0 whatever is chosen (0 workers, or workers started after the
probe, mid-epoch). The decision rule itself is checked on given measurements."""

from __future__ import annotations

import functools
import time

import numpy as np
import pytest

from loader_helpers import keys_of
from shardfeed.formats import ShardWriter
from shardfeed.loader import Loader, ShardDataset, autotune


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    d = tmp_path_factory.mktemp("auto")
    with ShardWriter(str(d), format="tar", max_shard_samples=60) as w:
        for i in range(480):
            w.write({"__key__": f"{i:05d}", "bin": bytes([i % 251]) * (32 + i % 50), "cls": i})
    return str(d)


def _slow(sample):  # makes reading a visible part of the step, so "auto" has a reason to start workers
    time.sleep(0.0005)
    return sample


def _batches(root, workers, consume_s=0.0, epochs=1):
    ds = ShardDataset(root, shuffle="global", seed=3, transform=_slow)
    with Loader(ds, batch_size=16, num_workers=workers) as loader:
        out = []
        for _ in range(epochs):
            for b in loader:
                out.append((list(b["__key__"]), list(b["bin"]), b["cls"].tolist()))
                time.sleep(consume_s)  # the training step
        return out, loader.stats(), loader.num_workers


def test_auto_delivers_the_batches_of_zero_workers_when_it_starts_workers(root, monkeypatch):
    monkeypatch.setattr(autotune, "free_cores", lambda: (8, 0.0, 7.0))  # a quiet 8-core machine
    ref, _, _ = _batches(root, 0, epochs=2)
    got, stats, chosen = _batches(root, "auto", consume_s=0.01, epochs=2)
    assert got == ref
    a = stats["autotune"]
    assert a["requested"] == "auto" and a["chosen"] == chosen
    assert 1 <= chosen <= autotune.MAX_WORKERS
    assert a["reason"].startswith(f"{chosen} workers:") and "ms to make a batch" in a["reason"]
    assert stats["batches"] == len(ref) and stats["samples"] == 2 * 480


def test_auto_stays_in_process_without_a_free_core_and_delivers_the_same(root, monkeypatch):
    monkeypatch.setattr(autotune, "free_cores", lambda: (2, 9.0, 0.0))  # a busy 2-core machine
    ref, _, _ = _batches(root, 0)
    got, stats, chosen = _batches(root, "auto", consume_s=0.01)
    assert got == ref and chosen == 0
    assert stats["autotune"]["chosen"] == 0 and "no core free" in stats["autotune"]["reason"]


def test_auto_resumes_like_any_loader(root, monkeypatch):
    monkeypatch.setattr(autotune, "free_cores", lambda: (8, 0.0, 7.0))
    ref, _, _ = _batches(root, 0)
    ds = ShardDataset(root, shuffle="global", seed=3, transform=_slow)
    with Loader(ds, batch_size=16, num_workers="auto") as a:
        it = iter(a)
        first = []
        for _ in range(5):
            first.append(next(it))
            time.sleep(0.01)  # a training step: the probe starts workers (checked below)
        state = a.state_dict()
        assert a.num_workers >= 1  # saved while workers made the batches; restored below at the choice of b
    with Loader(ShardDataset(root, shuffle="global", seed=3, transform=_slow), batch_size=16,
                num_workers="auto") as b:
        b.load_state_dict(state)
        rest = list(b)
    assert keys_of(first) + keys_of(rest) == [k for keys, _, _ in ref for k in keys]


def test_the_rule_picks_workers_from_the_stall_and_the_free_cores():
    # reading 1% of the step: no workers
    assert autotune.choose(0.0001, 0.01, 1000, 8, 0.0, 7.0)[0] == 0
    # making takes 3x the step: 3 workers hide it, if the cores are free
    n, why = autotune.choose(0.03, 0.01, 1000, 8, 0.0, 7.0)
    assert n == 3 and "enough to hide making" in why and "75%" in why
    assert autotune.choose(0.03, 0.01, 1000, 4, 2.0, 2.0)[0] == 2  # only 2 cores free
    assert autotune.choose(10.0, 0.001, 1000, 64, 0.0, 63.0)[0] == autotune.MAX_WORKERS
    n, why = autotune.choose(0.03, 0.01, 1000, 2, 3.0, 0.0)  # a busy machine: nothing free
    assert n == 0 and "no core free" in why
    # a few batches left: a worker's start would cost more than it saves
    n, why = autotune.choose(0.03, 0.01, 3, 8, 0.0, 7.0)
    assert n == 0 and "batches left" in why


def test_free_cores_counts_this_process_and_keeps_one_core_for_it():
    cpus, load, free = autotune.free_cores()
    assert cpus >= 1 and load >= 0 and 0 <= free <= cpus - 1


def test_num_workers_must_be_an_int_or_auto(root):
    ds = ShardDataset(root)
    for bad in ("many", -1, 1.5, True):
        with pytest.raises(ValueError, match="num_workers=.* must be an int >= 0 or \"auto\""):
            Loader(ds, batch_size=8, num_workers=bad)
    assert np.isscalar(Loader(ds, batch_size=8, num_workers="auto").num_workers)


def _bursty(slow_s, cls_range, sample):  # one batch (or all) made slowly: the producer the depth has to ride out
    if sample["cls"] in cls_range:
        time.sleep(slow_s)
    return sample


def _auto_depth(root, transform, step_s, workers=1, prefetch="auto"):
    """(batches, stats) of a pass over ``root`` in stored order, the consumer taking ``step_s`` a batch
    during the probe (all that the choice sees) and nothing after, to keep the test short."""
    ds = ShardDataset(root, shuffle="none", transform=transform)
    with Loader(ds, batch_size=16, num_workers=workers, prefetch=prefetch) as loader:
        out = []
        for b in loader:
            out.append((list(b["__key__"]), b["cls"].tolist()))
            if len(out) <= autotune.PREFETCH_PROBE:
                time.sleep(step_s)
        return out, loader.stats(), loader.prefetch


def test_auto_prefetch_deepens_for_a_fast_consumer_of_a_bursty_producer_and_delivers_the_same(root):
    # margins for a busy machine: a step of 20 ms stays under 80 ms, a 240 ms burst under 1 s
    burst = functools.partial(_bursty, 0.015, range(32, 48))  # batch 2 (a measured probe batch): ~240 ms
    ref, _, _ = _auto_depth(root, burst, 0.0, prefetch=2)
    fast, stats, deep = _auto_depth(root, burst, 0.02)  # a step of 20 ms: the burst spans many of them
    slow, slow_stats, shallow = _auto_depth(root, burst, 1.0)  # a step of 1 s hides the burst
    assert fast == ref and slow == ref  # the depth changes when batches are ready, never which
    a = stats["autotune"]
    assert "requested" not in a and a["prefetch"]["requested"] == "auto" and a["prefetch"]["chosen"] == deep
    assert deep >= 4 and "out the slowest batch" in a["prefetch"]["reason"], a
    assert shallow == autotune.MIN_PREFETCH, slow_stats["autotune"]
    assert "ms to make a batch" in slow_stats["autotune"]["prefetch"]["reason"]
    assert stats["batches"] == len(ref) == 30


def test_auto_prefetch_stays_shallow_when_the_workers_cannot_keep_up(root):
    slow_all = functools.partial(_bursty, 0.002, range(480))  # every batch ~32 ms, wanted every 5 ms
    got, stats, depth = _auto_depth(root, slow_all, 0.005)
    assert depth == autotune.MIN_PREFETCH and "cannot keep up" in stats["autotune"]["prefetch"]["reason"]
    assert [k for keys, _ in got for k in keys] == [f"{i:05d}" for i in range(480)]


def test_auto_prefetch_with_auto_workers_reports_both(root, monkeypatch):
    monkeypatch.setattr(autotune, "free_cores", lambda: (2, 9.0, 0.0))  # no core free: 0 workers
    got, stats, depth = _auto_depth(root, _slow, 0.005, workers="auto")
    a = stats["autotune"]
    assert a["chosen"] == 0 and "no core free" in a["reason"]
    assert depth == autotune.MIN_PREFETCH and a["prefetch"]["reason"].startswith("2: 0 workers")
    assert len(got) == 30


def test_the_prefetch_rule_covers_the_slowest_batch_where_the_workers_keep_up():
    assert autotune.choose_prefetch([0.005] * 3, 0.01, 0)[0] == autotune.MIN_PREFETCH  # nothing made ahead
    assert autotune.choose_prefetch([0.005] * 3, 0.01, 2)[0] == 2  # steady and quick: 1 ready is enough
    n, why = autotune.choose_prefetch([0.005, 0.005, 0.1], 0.01, 2)  # a 100 ms batch, a worker's turn 20 ms
    assert n == 6 and "5.0 of a worker's 20.00 ms turn" in why
    assert autotune.choose_prefetch([0.005, 0.005, 10.0], 0.01, 2)[0] == autotune.MAX_PREFETCH
    n, why = autotune.choose_prefetch([0.03, 0.03, 0.5], 0.01, 2)  # 30 ms a batch, one wanted every 20 ms
    assert n == autotune.MIN_PREFETCH and "cannot keep up" in why


def test_prefetch_must_be_a_positive_int_or_auto(root):
    ds = ShardDataset(root)
    for bad in ("deep", 0, 1.5, True):
        with pytest.raises(ValueError, match="prefetch=.* must be an int >= 1 or \"auto\""):
            Loader(ds, batch_size=8, prefetch=bad)
    assert Loader(ds, batch_size=8, num_workers=2, prefetch="auto").stats()["autotune"]["prefetch"]["chosen"] is None


@pytest.mark.parametrize("chosen", [2, 0])
def test_auto_without_a_transform_delivers_every_sample_once_across_the_switch(root, monkeypatch, chosen):
    """No transform: the read-ahead thread may be on at 0 workers (a transform turns it off, and every
    other test here passes one). The probe's batches, then the chosen workers' (or this process's),
    must be exactly the plan's steps: a batch read ahead during the probe and dropped at the hand-over
    would be lost (a mutant doing that passed the rest of the suite)."""
    from shardfeed.formats.engine import split_gather

    monkeypatch.setattr(autotune, "choose", lambda *a: (chosen, f"{chosen} workers: chosen by the test"))
    monkeypatch.setattr(split_gather, "threads_allowed", lambda: 2)  # read-ahead on, even on one core
    monkeypatch.delenv("SHARDFEED_READ_AHEAD", raising=False)

    def run(workers):
        ds = ShardDataset(root, shuffle="global", seed=3)
        with Loader(ds, batch_size=16, num_workers=workers) as loader:
            out = []
            for epoch in range(2):
                loader.set_epoch(epoch)
                for b in loader:
                    out.append((epoch, list(b["__key__"]), b["cls"].tolist()))
                    time.sleep(0.002)  # a training step: the consumer is away, so reading ahead pays
            return out, loader.num_workers

    ref, _ = run(0)
    got, n = run("auto")
    assert n == chosen
    assert got == ref
    for epoch in range(2):
        keys = [k for e, ks, _ in got if e == epoch for k in ks]
        assert sorted(keys) == [f"{i:05d}" for i in range(480)]  # every sample once
