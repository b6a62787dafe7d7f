"""Where the sample prefetcher's window starts, and what it brings again.

A Loader's workers read the steps after the one the consumer was handed;
the prefetcher (cache/planning/loader_prefetch.py, fed by loader/caching.py) plans the
NEAR_STEPS steps after those (bringing the steps being read would race the
readers), and it does not ask again for samples it made present already
(each pass re-checked every one of them: most of its time). A loopback HTTP
dataset through a cache of half of it, so misses come as sample ranges."""

from __future__ import annotations

import numpy as np
import pytest

from cache_servers import RangeServer
from conftest import labelled_sample
from loader_helpers import prefetch_settled
from shardfeed.cache.readers.ranged_reads import NEAR_STEPS
from shardfeed.formats import ShardWriter, open_index
from shardfeed.loader import Loader, ShardDataset
from shardfeed.loader.caching import step_key
from shardfeed.loader.schedule import BatchSchedule

N, PAYLOAD, PER_SHARD, BATCH = 128, 8192, 8, 8


@pytest.fixture(autouse=True)
def _default_ranges(monkeypatch):
    from shardfeed.cache.readers import ranged_reads

    monkeypatch.setattr(ranged_reads, "ENABLED", None)  # 8 KiB samples: ranges by default


def _dataset(tmp_path, n=N, payload=PAYLOAD):
    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=PER_SHARD) as w:
        for i in range(n):
            w.write(labelled_sample(i, payload))
    return root


def test_near_skips_the_steps_being_read_but_not_past_the_epoch(tmp_path):
    feed = ShardDataset(_dataset(tmp_path, 40, 16), shuffle="global", seed=2).feed(BatchSchedule.of(BATCH))
    p0, p1 = feed.plan(0).positions(0, 40), feed.plan(1).positions(0, 40)
    assert [(e, s, ids.tolist()) for e, s, _, ids in feed.near(2, skip=1)] == [(0, 1, p0[8:24].tolist())]
    feed.reset({**feed.get_state(), "step": 3})  # 5 steps of 8: the worker reads step 3, then 4 is the last
    assert [(e, s, ids.tolist()) for e, s, _, ids in feed.near(2, skip=1)] == \
        [(0, 4, p0[32:].tolist()), (1, 0, p1[:8].tolist())]
    feed.reset({**feed.get_state(), "step": 4})  # workers do not read into the next epoch: it starts at 0
    assert [(e, s, ids.tolist()) for e, s, _, ids in feed.near(2, skip=1)] == [(1, 0, p1[:16].tolist())]


@pytest.mark.parametrize("workers", [0, 1])
def test_window_starts_after_the_steps_the_workers_read(tmp_path, workers):
    """One worker reads the step after the consumer's; without workers the window starts at the
    consumer's next step (it once started a step before it: the one just read, fetched again)."""
    root = _dataset(tmp_path)
    data = int(open_index(root).sizes.sum())
    with RangeServer(root) as srv:
        ds = ShardDataset(srv.url, shuffle="global", seed=4, cache_dir=str(tmp_path / "c"),
                          cache_limit_bytes=data // 2)
        with Loader(ds, BATCH, num_workers=workers, prefetch=2) as loader:
            it = iter(loader)
            for _ in range(3):
                b = next(it)
                for k, payload in zip(b["__key__"], b["bin"]):
                    assert bytes(payload) == labelled_sample(int(k), PAYLOAD)["bin"]
            lc = loader._cache
            assert lc.policy is not None and lc.busy == workers
            pos = loader._pos
            _, near = lc._plan_samples(pos)
            first = min(step for _, step, _, _ in near)
            assert first == step_key(pos["epoch"], pos["step"] + workers)
            ids = loader.feed.plan(pos["epoch"]).positions((pos["step"] + workers) * BATCH,
                                                            (pos["step"] + workers + NEAR_STEPS) * BATCH)
            shard, _ = ds.index.locate(ids)
            assert {ref.url for ref, _, _, _ in near} == {lc.shards.ref(s).url for s in np.unique(shard).tolist()}
            assert lc.prefetcher._step == first  # the first planned step is on the readers' terms
            it.close()


def test_a_pass_does_not_ask_again_for_samples_it_brought(tmp_path):
    root = _dataset(tmp_path)
    data = int(open_index(root).sizes.sum())
    with RangeServer(root) as srv:
        ds = ShardDataset(srv.url, shuffle="global", seed=4, cache_dir=str(tmp_path / "c"),
                          cache_limit_bytes=data // 2)
        with Loader(ds, BATCH) as loader:
            it = iter(loader)
            next(it)
            lc = loader._cache
            pf = lc.prefetcher
            prefetch_settled(pf)
            asked: list[tuple[str, int, int]] = []
            fetcher = lc.policy.fetcher
            real = fetcher.ensure

            def ensure(ref, local, count, **kw):
                asked.extend((ref.url, int(i), int(kw.get("for_step", -1))) for i in np.asarray(local).tolist())
                return real(ref, local, count, **kw)

            fetcher.ensure = ensure
            try:
                for _ in range(4):  # each step moves the window by one: the step both windows hold is known
                    b = next(it)
                    for k, payload in zip(b["__key__"], b["bin"]):
                        assert bytes(payload) == labelled_sample(int(k), PAYLOAD)["bin"]
                    prefetch_settled(pf)
            finally:
                fetcher.ensure = real
            it.close()
    brought = [a for a in asked if a[2] >= 0]
    assert brought, "the prefetcher brought nothing: the test shows nothing"
    assert len(brought) == len(set(brought)), "a sample was asked for twice for the same step"
