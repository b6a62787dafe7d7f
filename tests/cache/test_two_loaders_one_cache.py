"""Two Loaders in one process reading one remote dataset through one cache folder: each
publishes its own lookahead plan (cache/lookahead.py) under a name of its own, so neither
replaces the other's file mid-write (FileNotFoundError, once a hang), and each removes its
own when it closes."""

from __future__ import annotations

import os

import pytest

from cache_servers import RangeServer
from conftest import labelled_sample
from shardfeed.formats import ShardWriter
from shardfeed.loader import Loader, ShardDataset

N, PER_SHARD = 256, 8


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("two") / "ds")
    with ShardWriter(root, max_shard_samples=PER_SHARD) as w:
        for i in range(N):
            w.write(labelled_sample(i, 4096))
    return root


@pytest.mark.timeout(90)
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # a prefetch thread's death
def test_two_loaders_in_one_process_share_a_cache_folder(tmp_path, dataset):
    cache_dir = str(tmp_path / "c")
    with RangeServer(dataset) as srv:
        kw = dict(cache_dir=cache_dir, cache_limit_bytes=int(0.6 * sum(
            os.path.getsize(os.path.join(dataset, n)) for n in os.listdir(dataset))), shuffle="global")
        a = Loader(ShardDataset(srv.url, seed=1, **kw), 8)
        b = Loader(ShardDataset(srv.url, seed=2, **kw), 8)
        seen = {"a": [], "b": []}
        with a, b:
            for epoch in range(2):
                a.set_epoch(epoch)
                b.set_epoch(epoch)
                for x, y in zip(a, b):  # their prefetchers publish side by side
                    seen["a"] += x["__key__"]
                    seen["b"] += y["__key__"]
            plans = sorted(os.listdir(os.path.join(cache_dir, "lookahead")))
            assert len([p for p in plans if p.endswith(".json")]) == 2, plans  # one plan file each
        assert sorted(seen["a"]) == sorted(seen["b"]) == sorted([f"{i:08d}" for i in range(N)] * 2)
        assert [p for p in os.listdir(os.path.join(cache_dir, "lookahead")) if not p.endswith(".lock")] == []
