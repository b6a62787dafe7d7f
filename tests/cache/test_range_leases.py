"""The cache-folder listings a range fetch costs: room for a prefetch's small fetches taken ahead
as leases (cache/sample_ranges/range_room.py), and the whole shards' bytes a choice reads
(RangePolicy.used). Each listing is a scan of the folder (1-3 ms at 1,500 entries), and at one
or more per range or sidecar fetch they were most of a range request's CPU (bench remote:
~4,300 requests a warm epoch)."""

from __future__ import annotations

import numpy as np

from cache_servers import RangeServer
from conftest import labelled_sample
from shardfeed.cache import ShardCache
from shardfeed.cache.sample_ranges.cost_model import CostModel
from shardfeed.cache.sample_ranges.range_room import LEASE_BYTES, Leases
from shardfeed.cache.sample_ranges.ranges import RangeFetcher
from shardfeed.cache.storage.store import ShardRef
from shardfeed.formats import ShardWriter, open_index
from shardfeed.formats.readers import open_shard

LIMIT = 16 * LEASE_BYTES  # the smallest cache that takes leases
PER_SHARD, PAYLOAD, SHARDS = 8, 8192, 24


def _counting_scans(cache) -> list:
    """Every folder scan of ``cache``'s budget, recorded."""
    calls, scan = [], cache.budget._scan

    def counted(*a, **k):
        calls.append(1)
        return scan(*a, **k)

    cache.budget._scan = counted
    return calls


def test_a_lease_refused_beyond_the_headroom_still_serves_the_window(tmp_path):
    """Beyond the prefetch window a lease may evict only copies no plan reads, and often finds no
    room; the window's fetches (the readers' next step, the steps after it) may evict copies read
    later, and a refusal on the first terms kept them from leases too for LEASE_S: each then made
    its own room (400 more folder scans a warm epoch of bench remote)."""
    cache = ShardCache(str(tmp_path / "c"), LIMIT)
    leases = Leases(cache)
    url = "http://127.0.0.1:9/shard-0.tar"
    assert leases.draw(16384, url, headroom=LIMIT, for_step=None) is None  # the readers' headroom is all of it
    lease = leases.draw(16384, url, headroom=0, for_step=3)
    assert lease is not None, "a window fetch found no lease after a refusal on other terms"
    assert leases.draw(16384, url, headroom=0, for_step=4) is lease  # the next fetches draw from it
    leases.landed(lease)
    leases.landed(lease)


def test_a_prefetchs_sidecars_and_ranges_draw_from_leases(tmp_path):
    """SHARDS shards fetched on a prefetch's terms, one sample each: a sidecar and a range per
    shard, 48 fetches. Each sidecar made its own room (a folder scan each, SHARDS of them);
    from leases of LEASE_FETCHES fetches' room the whole lot takes a few. Every sample is the one written."""
    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=PER_SHARD) as w:
        for i in range(SHARDS * PER_SHARD):
            w.write(labelled_sample(i, PAYLOAD))
    ix = open_index(root)
    cache = ShardCache(str(tmp_path / "c"), LIMIT)
    fetcher = RangeFetcher(cache, CostModel())
    scans = _counting_scans(cache)
    with RangeServer(root) as srv:
        refs = [ShardRef(f"{srv.url}/{ix.names[s]}", ix.hashes[s] or None, int(ix.sizes[s])) for s in range(SHARDS)]
        for s, ref in enumerate(refs):
            pin = fetcher.pin(ref)
            try:
                assert fetcher.ensure(ref, np.array([s % PER_SHARD]), PER_SHARD, for_step=s) == (0, 1)
            finally:
                pin.release()
    assert fetcher.counters["sidecar_requests"] == SHARDS and fetcher.counters["range_requests"] == SHARDS
    assert len(scans) <= SHARDS // 4, f"{len(scans)} folder scans for {2 * SHARDS} prefetch fetches"
    for s, ref in enumerate(refs):
        with open_shard(ix, s, fetcher.path(ref)) as r:
            got = r.read(s % PER_SHARD)
        assert bytes(got["bin"]) == labelled_sample(s * PER_SHARD + s % PER_SHARD, PAYLOAD)["bin"]


def test_whole_shard_bytes_are_listed_by_one_thread_at_a_time(tmp_path):
    """RangePolicy.used(): what whole shards hold, listed from the cache folder (Budget.whole_bytes)
    and reused for _USED_TTL_S. Every fetch thread asks it at each choice; at 20 ms a listing and
    each thread listing on its own, bench remote's warm epoch listed the folder 3,700 times. Now
    one thread lists while the others take the last answer."""
    import threading
    import time

    from shardfeed.cache.readers.ranged_reads import _USED_TTL_S, RangePolicy

    cache = ShardCache(str(tmp_path / "c"), LIMIT)
    policy = RangePolicy(cache, LIMIT * 2, 1000)
    listed, whole = [], cache.budget.whole_bytes

    def counted():
        listed.append(1)
        time.sleep(0.002)  # a listing of a full folder takes about this long
        return whole()

    cache.budget.whole_bytes = counted
    span, end = 3 * _USED_TTL_S, time.monotonic() + 3 * _USED_TTL_S
    threads = [threading.Thread(target=lambda: [policy.used() for _ in iter(lambda: time.monotonic() < end, False)])
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _USED_TTL_S >= 0.1
    assert len(listed) <= span / _USED_TTL_S + 2, f"{len(listed)} listings in {span:.2f} s"
