"""Cache stats a user can read (loader/stats.py): per epoch the bytes fetched against
the dataset's bytes read (fetched_ratio), the requests, the late samples, and a reader's time
waiting for the cache as a part of the epoch's wall time, checked against the bytes a
real loopback server counted."""

from __future__ import annotations

import pytest

from cache_servers import RangeServer
from conftest import labelled_sample
from shardfeed.formats import ShardWriter, open_index
from shardfeed.loader import Loader, ShardDataset


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("stats") / "ds")
    with ShardWriter(root, max_shard_samples=16) as w:
        for i in range(192):
            w.write(labelled_sample(i, 8192))
    return root


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_epoch_stats_say_what_was_fetched_and_waited(tmp_path, folder, num_workers):
    limit = open_index(folder).num_bytes // 2
    with RangeServer(folder) as srv:
        ds = ShardDataset(srv.url, shuffle="global", seed=4, cache_dir=str(tmp_path / "c"), cache_limit_bytes=limit)
        with Loader(ds, 16, num_workers=num_workers) as loader:
            for epoch in range(2):
                loader.set_epoch(epoch)
                before = srv.bytes_sent()
                for _ in loader:
                    pass
                st = loader.stats()["epoch"]
                sent = srv.bytes_sent() - before
                # what the server sent in the epoch, counted by it (the prefetch past the epoch's end aside)
                assert 0.8 * sent <= st["bytes_fetched"] <= 1.25 * sent + 65536, (st, sent)
                stored = open_index(folder).num_bytes  # the epoch read every sample: the dataset's bytes
                assert st["fetched_ratio"] == pytest.approx(st["bytes_fetched"] / stored)
                assert 0.2 < st["fetched_ratio"] < 2.5  # half the data cached: a part of each epoch comes over
                assert st["requests"] > 0 and st["late_samples"] >= 0
                assert 0 <= st["cache_wait_s"] <= st["elapsed_s"] and st["cache_wait_fraction"] <= 1.0
                assert st["cache_wait_s"] == pytest.approx(min(st["elapsed_s"], st["fetch_wait_s"] / max(1, num_workers)))
                line = str(loader.stats()).splitlines()[0]
                assert "x the data read" in line and f"{st['requests']:,} request" in line
