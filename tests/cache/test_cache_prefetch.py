"""Prefetcher: fetches ahead in plan order within its byte window, stops on close."""

from __future__ import annotations

import os
import threading
import time

import pytest

from cache_servers import Fault, RangeServer
from shardfeed.cache import CacheLimitError, FetchOptions, Prefetcher, ShardCache, ShardRef
from shardfeed.cache.storage.disk_blocks import empty_cache_bytes
from shardfeed.formats import ShardError

FAST = FetchOptions(range_bytes=64 << 10, threads=2, attempts=2, backoff_s=0.01, stall_s=5.0)


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "srv"
    root.mkdir()
    for i in range(8):
        (root / f"s{i}.bin").write_bytes(bytes([i]) * 1000)
    with RangeServer(str(root)) as srv:
        yield srv


def _refs(srv, n=8):
    return [ShardRef(f"{srv.url}/s{i}.bin", None, 1000) for i in range(n)]


def _wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.01)


def test_fetches_ahead_in_order_within_window(tmp_path, served):
    cache = ShardCache(str(tmp_path / "c"), 1 << 20, fetch=FAST)
    refs = _refs(served)
    with Prefetcher(cache, refs, max_ahead_bytes=3000, threads=1) as pf:
        _wait_for(lambda: cache.contains(refs[2].url))
        time.sleep(0.2)
        assert [cache.contains(r.url) for r in refs] == [True] * 3 + [False] * 5  # window: 3 shards
        order = list(served.requests)
        assert order == ["s0.bin", "s1.bin", "s2.bin"]
        for i in range(8):
            with pf.hold(i) as path:
                assert open(path, "rb").read() == bytes([i]) * 1000
        # each shard fetched once; past the window, a holder that reached a shard first fetches it
        # itself while the prefetcher moves on, so those two requests may arrive in either order
        assert sorted(served.requests) == [f"s{i}.bin" for i in range(8)]
    st = cache.stats()
    assert st["misses"] == 8 and st["bytes_fetched"] == 8000


def test_window_moves_with_the_consumer(tmp_path, served):
    cache = ShardCache(str(tmp_path / "c"), 1 << 20, fetch=FAST)
    refs = _refs(served)
    with Prefetcher(cache, refs, max_ahead_bytes=2000, threads=2) as pf:
        pf.get(3)  # the consumer jumped to 3: 3 and 4 come next, 5 is outside the window
        _wait_for(lambda: cache.contains(refs[4].url))
        time.sleep(0.2)
        assert not cache.contains(refs[5].url)


def test_close_stops_threads_and_is_idempotent(tmp_path, served):
    served.faults.append(Fault("s1.bin", "stall", times=1, stall_s=1.0))
    cache = ShardCache(str(tmp_path / "c"), 1 << 20, fetch=FAST)
    pf = Prefetcher(cache, _refs(served), max_ahead_bytes=8000, threads=2)
    threads = [t for t in threading.enumerate() if t.name.startswith("shardfeed-prefetch-")]
    assert len(threads) == 2 and all(t.daemon for t in threads)
    pf.close()
    pf.close()
    assert not any(t.is_alive() for t in threads)
    with pytest.raises(RuntimeError, match="closed"):
        pf.get(0)
    time.sleep(0.3)
    assert sum(served.requests.values()) <= 3  # nothing fetched after close returned


def test_error_reaches_the_consumer_for_that_shard(tmp_path, served):
    refs = _refs(served, 3) + [ShardRef(f"{served.url}/missing.bin", None, 10)] + _refs(served, 5)[4:]
    cache = ShardCache(str(tmp_path / "c"), 1 << 20, fetch=FAST)
    with Prefetcher(cache, refs, max_ahead_bytes=8000, threads=2) as pf:
        for i in range(3):
            pf.get(i)
        with pytest.raises(ShardError, match="missing.bin"):
            pf.get(3)
        assert open(pf.get(4), "rb").read() == bytes([4]) * 1000  # the others still arrive


def test_window_larger_than_budget_fails_at_start(tmp_path, served):
    cache = ShardCache(str(tmp_path / "c"), 3000)
    with pytest.raises(CacheLimitError, match="at least 5000") as err:
        Prefetcher(cache, _refs(served), max_ahead_bytes=4000)
    assert err.value.needed_bytes == 5000
    assert not any(t.name.startswith("shardfeed-prefetch-") for t in threading.enumerate())


def test_consumed_shards_leave_the_plan(tmp_path, served):
    """Regression: the plan once kept the steps of shards already read, so
    they looked "needed soonest" and the shards coming next were evicted."""
    # three shards in a block each, the plan (its folder, its file and the one written beside it), the cache's
    # folders and the fetch in flight (a block, and one for the identity attribute of a copy without a hash)
    cache = ShardCache(str(tmp_path / "c"), empty_cache_bytes() + 3 * 4096 + 3 * 4096 + 2 * 4096, fetch=FAST)
    refs = _refs(served)
    with Prefetcher(cache, refs, max_ahead_bytes=2000, threads=1) as pf:
        for i in range(8):
            with pf.hold(i):
                pass
    # shards used earliest in the plan were evicted, the last three stay
    assert [i for i, r in enumerate(refs) if cache.contains(r.url)] == [5, 6, 7]
    assert os.path.isdir(cache.data_dir)
