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


def _write(root: str, n: int, payload: int, seed: int) -> int:
    import numpy as np

    rng = np.random.default_rng(seed)
    with ShardWriter(root, max_shard_samples=16) as w:
        for i in range(n):
            w.write({"__key__": f"{i:08d}", "cls": i % 10, "bin": rng.integers(0, 256, payload, np.uint8).tobytes()})
    return sum(os.path.getsize(os.path.join(root, f)) for f in os.listdir(root) if f.endswith(".tar"))


@pytest.mark.timeout(40)  # without the fix it waits 300 s a fetch
def test_an_evaluation_through_the_cache_a_finished_training_epoch_holds(tmp_path):
    """The training Loader stays open after its epoch (as a trainer's does while it evaluates): the
    shards its reader kept open pinned the cache's room, and the evaluation's every fetch waited 300 s
    for it (over 10 minutes for an eval pass of 2,000 samples; 0.4 s once they are let go)."""
    import time

    _write(str(tmp_path / "train"), 1000, 8192, 0)
    held_out = _write(str(tmp_path / "eval"), 600, 8192, 1)
    kw = dict(cache_dir=str(tmp_path / "c"), cache_limit_bytes=int(0.64 * held_out))
    with RangeServer(str(tmp_path)) as srv:
        with Loader(ShardDataset(f"{srv.url}/train", shuffle="global", seed=0, **kw), 64) as train:
            assert sum(len(b["__key__"]) for b in train) == 1000
            t0 = time.monotonic()
            with Loader(ShardDataset(f"{srv.url}/eval", shuffle="none", drop_last=True, **kw), 256) as evaluation:
                keys = [k for b in evaluation for k in b["__key__"]]
            took = time.monotonic() - t0
    assert keys == [f"{i:08d}" for i in range(600)]
    assert took < 20, took
