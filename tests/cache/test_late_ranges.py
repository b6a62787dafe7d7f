"""A reader's late sample ranges (cache/late_ranges.py): the shards of one batch the
prefetcher did not bring are fetched at once, not one round trip after another, and
every sample that comes is the one written. A loopback server that waits before
each range's body stands in for a loaded or distant source."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from cache_servers import Fault, RangeServer
from conftest import labelled_sample
from shardfeed.cache.readers.reads import CacheSpec
from shardfeed.formats import ShardWriter, open_index
from shardfeed.formats.readers import open_shard

PER_SHARD, PAYLOAD, SHARDS, DELAY = 8, 16384, 5, 0.4


@pytest.fixture(autouse=True)
def _ranges(monkeypatch):
    from shardfeed.cache.readers import ranged_reads

    monkeypatch.setattr(ranged_reads, "ENABLED", True)


def test_a_batchs_late_ranges_come_at_once_gh22(tmp_path):
    """Issue #22: a ranged reader whose batch was not prefetched fetched its shards' ranges one
    after another (one request per shard, ~7 a batch in the demo), so a late batch waited for
    the sum of their round trips. With each range's body held DELAY s by the server, the
    batch's SHARDS - 1 late shards now take about one DELAY, not one each."""
    from shardfeed.cache.readers.ranged_reads import RangedShards

    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=PER_SHARD) as w:
        for i in range(SHARDS * PER_SHARD):
            w.write(labelled_sample(i, PAYLOAD))
    ix = open_index(root)
    # no room for a whole shard beside the reserve: every miss comes as ranges
    spec = CacheSpec(str(tmp_path / "c"), int(ix.sizes.sum()) // 3)
    with RangeServer(root) as srv:
        shards = RangedShards(ix, spec, lambda i: f"{srv.url}/{ix.names[i]}")
        ids = np.arange(SHARDS, dtype=np.int64) * PER_SHARD + 3  # sample 3 of every shard
        shards.finish(shards.prepare(ids[:1]))  # the cost model and the reserve set up (shard 0 may come whole)
        shards.take()
        srv.faults.append(Fault(".tar", "stall", times=SHARDS, stall_s=DELAY))
        t0 = time.monotonic()
        token = shards.prepare(ids[1:])
        took = time.monotonic() - t0
        try:
            assert shards.take()["late_samples"] == SHARDS - 1, "the reader fetches every sample itself"
            assert took < 2.5 * DELAY, f"{SHARDS - 1} late shards took {took:.2f} s, {DELAY} s each one by one"
            for i in range(1, SHARDS):  # each sample read from its partial copy is the one written
                with open_shard(ix, i, shards.policy().fetcher.path(shards.ref(i))) as r:
                    got = r.read(3)
                assert got["__key__"] == f"{i * PER_SHARD + 3:08d}"
                assert bytes(got["bin"]) == labelled_sample(i * PER_SHARD + 3, PAYLOAD)["bin"]
        finally:
            shards.finish(token)


def test_a_failed_late_fetch_waits_for_the_others_before_its_error(tmp_path):
    """When one shard's late ranges fail, the error reaches the caller (who then releases its
    pins) only after the batch's other fetches have ended: none is still writing a copy whose pin
    is gone. Shard 1 is missing at the source (404: fails at once), shards 2-4 answer DELAY s late."""
    from shardfeed.cache.readers.ranged_reads import RangedShards
    from shardfeed.formats import ShardError

    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=PER_SHARD) as w:
        for i in range(SHARDS * PER_SHARD):
            w.write(labelled_sample(i, PAYLOAD))
    ix = open_index(root)
    spec = CacheSpec(str(tmp_path / "c"), int(ix.sizes.sum()) // 3)
    with RangeServer(root) as srv:
        shards = RangedShards(ix, spec, lambda i: f"{srv.url}/{ix.names[i]}")
        ids = np.arange(SHARDS, dtype=np.int64) * PER_SHARD + 3
        shards.finish(shards.prepare(ids[:1]))
        os.rename(ix.path(1), ix.path(1) + ".gone")  # its sidecar stays: the range request is the one to fail
        srv.faults += [Fault(ix.names[i], "stall", times=1, stall_s=DELAY) for i in range(2, SHARDS)]
        fetcher = shards.policy().fetcher
        t0 = time.monotonic()
        with pytest.raises(ShardError, match="not found"):
            shards.prepare(ids[1:])
        took = time.monotonic() - t0
        done = [fetcher.present(shards.ref(i), [3]) for i in range(2, SHARDS)]
        assert all(done), f"the error came after {took:.2f} s with fetches still running: {done}"
        assert took >= DELAY * 0.9
