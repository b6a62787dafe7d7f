"""ShardCache on one node: one download per shard, pins, eviction order, budget."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time

import pytest
import xxhash

from cache_servers import Fault, RangeServer, fetch_in_child, pin_in_child
from shardfeed.cache import CacheLimitError, FetchOptions, ShardCache
from shardfeed.cache.storage.disk_blocks import empty_cache_bytes

FAST = FetchOptions(range_bytes=64 << 10, threads=4, attempts=3, backoff_s=0.01, stall_s=5.0)


def _files(folder, n, size=100) -> list[str]:
    os.makedirs(folder, exist_ok=True)
    paths = []
    for i in range(n):
        p = os.path.join(folder, f"s{i}.bin")
        with open(p, "wb") as f:
            f.write(bytes([i]) * size)
        paths.append(p)
    return paths


def _entry(tmp_path, n: int) -> int:
    """What the budget charges an entry of ``n`` bytes fetched without a hash: whole disk blocks,
    and one for its identity attribute where the filesystem keeps attributes outside the inode."""
    src = _files(str(tmp_path / f"probe-src-{n}"), 1, n)[0]
    cache = ShardCache(str(tmp_path / f"probe-{n}"), 1 << 30)
    cache.get(src)
    return cache.used_bytes() - cache.budget.fixed_bytes()


SIZE = 10_000
# the budget counts the published lookahead plans too: their folder, the plan and the one written beside it
PLAN_ROOM = 3 * 4096


ATTR = 4096  # a fetch without a hash holds a block for its identity attribute until its copy is in place


def _three(tmp_path) -> int:
    """A limit three entries of SIZE fit, four do not (the cache's own folders and plans beside them)."""
    return 3 * _entry(tmp_path, SIZE) + PLAN_ROOM + empty_cache_bytes() + ATTR


def _cached(cache, urls) -> list[int]:
    return [i for i, u in enumerate(urls) if cache.contains(u)]


def test_evicts_farthest_next_use(tmp_path):
    urls = _files(str(tmp_path / "src"), 5, SIZE)
    cache = ShardCache(str(tmp_path / "c"), _three(tmp_path), fetch=FAST)
    for u in urls[:3]:
        cache.get(u)
    cache.set_lookahead([(urls[0], 5), (urls[1], 1), (urls[2], 9), (urls[3], 2)])
    cache.get(urls[3])
    assert _cached(cache, urls) == [0, 1, 3]  # 2 was needed last
    cache.get(urls[4])  # s4 is in no plan, nor is anything else unplanned: the farthest planned goes
    assert _cached(cache, urls) == [1, 3, 4]
    assert cache.stats()["evictions"] == 2
    assert cache.used_bytes() - cache.budget.fixed_bytes() == 3 * _entry(tmp_path, SIZE)


def test_unplanned_entries_go_first_least_recently_used(tmp_path):
    urls = _files(str(tmp_path / "src"), 5, SIZE)
    cache = ShardCache(str(tmp_path / "c"), _three(tmp_path), fetch=FAST)
    for u in urls[:3]:
        cache.get(u)
        time.sleep(0.01)
    os.utime(cache.path_for(urls[0]))  # s0 used again most recently
    cache.set_lookahead([(urls[2], 100)])
    cache.get(urls[3])
    assert _cached(cache, urls) == [0, 2, 3]  # s1: unplanned and least recently used


def test_lookahead_of_another_process_counts(tmp_path):
    urls = _files(str(tmp_path / "src"), 4, SIZE)
    other = ShardCache(str(tmp_path / "c"), _three(tmp_path), fetch=FAST)
    cache = ShardCache(str(tmp_path / "c"), _three(tmp_path), fetch=FAST)
    for u in urls[:3]:
        cache.get(u)
    other.set_lookahead([(urls[0], 1), (urls[1], 2)])  # another rank needs s0 and s1 soon
    cache.get(urls[3])
    assert _cached(cache, urls) == [0, 1, 3]
    other.close()


def test_pinned_entry_is_not_evicted(tmp_path):
    urls = _files(str(tmp_path / "src"), 4, SIZE)
    cache = ShardCache(str(tmp_path / "c"), _three(tmp_path), fetch=FAST, wait_timeout_s=0.3)
    with cache.hold(urls[0]) as p0:
        cache.get(urls[1])
        cache.get(urls[2])
        cache.set_lookahead([(urls[0], 99), (urls[1], 1), (urls[2], 2)])  # s0 would be the first victim
        cache.get(urls[3])
        assert os.path.exists(p0) and _cached(cache, urls) == [0, 1, 3]
    cache.set_lookahead([(urls[0], 99), (urls[1], 1), (urls[2], 2), (urls[3], 3)])
    cache.get(urls[2])  # unpinned now, s0 is the farthest
    assert _cached(cache, urls) == [1, 2, 3]


def test_entry_pinned_by_another_process_is_not_evicted(tmp_path):
    urls = _files(str(tmp_path / "src"), 3)
    cdir = str(tmp_path / "c")
    pinned, release = str(tmp_path / "pinned"), str(tmp_path / "release")
    two = 2 * _entry(tmp_path, 100) + empty_cache_bytes() + ATTR  # two entries of 100 bytes fit, three do not
    child = mp.get_context("spawn").Process(target=pin_in_child, args=(cdir, two, urls[0], pinned, release))
    child.start()
    try:
        deadline = time.monotonic() + 180  # spawn imports numpy/pyarrow: slow on a loaded machine
        while not os.path.exists(pinned):
            if not child.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"pinning child did not start (exit code {child.exitcode})")
            time.sleep(0.01)
        cache = ShardCache(cdir, two, fetch=FAST, wait_timeout_s=0.3)
        cache.get(urls[1])
        cache.get(urls[2])  # must evict: s0 is unplanned and oldest, but pinned over there
        assert _cached(cache, urls) == [0, 2]
        with cache.hold(urls[2]):
            with pytest.raises(CacheLimitError, match="pinned or in flight") as err:
                cache.get(urls[1])  # everything is pinned: no room within the wait
        assert err.value.needed_bytes >= two + _entry(tmp_path, 100)
    finally:
        open(release, "w").close()
        child.join(60)
    assert child.exitcode == 0
    cache.get(urls[1])  # the pin ended with the child: s0 can go now
    assert _cached(cache, urls) == [1, 2]


def test_two_processes_download_once(tmp_path):
    root = tmp_path / "srv"
    root.mkdir()
    data = os.urandom(2 << 20)
    (root / "big.bin").write_bytes(data)
    h = xxhash.xxh3_128_hexdigest(data)
    start = str(tmp_path / "go")
    with RangeServer(str(root)) as srv:
        srv.faults.append(Fault("big.bin", "stall", times=1, stall_s=1.0))  # the second asks mid-download
        url = f"{srv.url}/big.bin"
        ctx = mp.get_context("spawn")
        with ctx.Pool(2) as pool:
            results = [pool.apply_async(fetch_in_child, (str(tmp_path / "c"), 10 << 20, url, h, start))
                       for _ in range(2)]
            deadline = time.monotonic() + 180  # spawn imports numpy/pyarrow: slow on a loaded machine
            while len([n for n in os.listdir(tmp_path) if n.startswith("go.ready-")]) < 2:
                for r in results:
                    if r.ready():
                        r.get()  # a child failed before the barrier: show its error
                if time.monotonic() > deadline:
                    raise TimeoutError("children did not start")
                time.sleep(0.01)
            open(start, "w").close()
            (p1, s1), (p2, s2) = [r.get(120) for r in results]
        assert p1 == p2 and open(p1, "rb").read() == data
        assert srv.gets("big.bin") == 1  # one ranged GET (2 MiB < one 16 MiB range), by one process
        assert sorted([(s1["misses"], s1["hits"]), (s2["misses"], s2["hits"])]) == [(0, 1), (1, 0)]
        waiter = s1 if s1["hits"] else s2
        assert waiter["wait_s"] > 0.5  # it waited on the fetch lock, then found the shard


def test_budget_below_working_set_says_bytes_needed(tmp_path):
    cache = ShardCache(str(tmp_path / "c"), 1000)
    with pytest.raises(CacheLimitError, match="at least 4096") as err:
        cache.reserve(4096)
    assert err.value.needed_bytes == 4096
    src = _files(str(tmp_path / "src"), 1, size=2000)[0]
    with pytest.raises(CacheLimitError, match="at least 8,192|at least 8192") as err:  # in whole blocks
        cache.get(src)
    assert err.value.needed_bytes >= 4096


def test_temporary_files_count_in_the_budget(tmp_path):
    root = tmp_path / "srv"
    root.mkdir()
    (root / "slow.bin").write_bytes(b"s" * 600)
    (root / "other.bin").write_bytes(b"o" * 600)
    with RangeServer(str(root)) as srv:
        srv.faults.append(Fault("slow.bin", "stall", times=1, stall_s=2.0))
        one = _entry(tmp_path, 600)
        cache = ShardCache(str(tmp_path / "c"), empty_cache_bytes() + one + ATTR + one // 2, fetch=FAST,
                           wait_timeout_s=0.3)
        t = threading.Thread(target=cache.get, args=(f"{srv.url}/slow.bin",))
        t.start()
        deadline = time.monotonic() + 10
        while cache.used_bytes() == empty_cache_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cache.used_bytes() == empty_cache_bytes() + one + ATTR  # the in-flight temporary, at its full size
        assert any(".tmp-" in n for n in os.listdir(cache.data_dir))
        with pytest.raises(CacheLimitError, match="pinned or in flight"):
            cache.get(f"{srv.url}/other.bin")
        t.join(30)
        assert os.listdir(cache.data_dir) == [cache.key_for(f"{srv.url}/slow.bin")]


def test_orphaned_temporary_is_reclaimed(tmp_path):
    """A fetcher that died leaves a temporary nobody's lock covers: the next
    reservation removes it instead of counting it forever."""
    src = _files(str(tmp_path / "src"), 1, size=600)[0]
    one = _entry(tmp_path, 600)
    cache = ShardCache(str(tmp_path / "c"), empty_cache_bytes() + one + ATTR + one // 2)
    with open(os.path.join(cache.data_dir, "u-dead.tmp-999-abcd"), "wb") as f:
        f.write(b"x" * 900)
    assert cache.used_bytes() == empty_cache_bytes() + 4096  # a block
    cache.get(src)
    assert cache.used_bytes() == empty_cache_bytes() + one


def test_eviction_removes_the_entry_lock_files(tmp_path):
    urls = _files(str(tmp_path / "src"), 6)
    cache = ShardCache(str(tmp_path / "c"), 2 * _entry(tmp_path, 100) + empty_cache_bytes() + ATTR, fetch=FAST)
    for u in urls:
        cache.get(u)
    assert len(os.listdir(cache.data_dir)) == 2
    assert len(os.listdir(cache.lock_dir)) == 4  # .pin and .fetch of the two entries left


def test_cache_error_survives_pickling():
    import pickle

    err = pickle.loads(pickle.dumps(CacheLimitError("/c", "too small", 123)))
    assert (err.shard, err.reason, err.needed_bytes) == ("/c", "too small", 123)


def test_published_plan_stays_within_what_the_budget_counted(tmp_path):
    """A lookahead plan file lies in the cache's budget: with max_bytes set (the Loader sets
    what its start check counted), the file (and the one written beside it) stays within
    it, keeping the nearest steps, which are what eviction needs most."""
    from shardfeed.cache.storage.eviction import SharedLookahead

    la = SharedLookahead(str(tmp_path / "lookahead"))
    la.max_bytes = 4000
    plan = {ShardCache.key_for(f"http://x/s{i}.tar", f"{i:064x}"): 10 ** 9 + 3000 - i for i in range(3000)}
    la.publish(plan)
    files = [p for p in (tmp_path / "lookahead").iterdir() if p.suffix == ".json"]
    assert len(files) == 1 and 1000 < files[0].stat().st_size <= 2000
    import json

    kept = json.loads(files[0].read_text())
    assert sorted(kept.values()) == sorted(plan.values())[:len(kept)]  # the nearest steps
    assert la.mine == plan  # this process still evicts by all of it
