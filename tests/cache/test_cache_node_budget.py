"""Every reader of a node shares one cache budget: ranks of one job (separate
processes, LOCAL_WORLD_SIZE), a plain torch DataLoader's workers and plain
iteration of a ShardDataset. At any limit, from one shard to the dataset,
reading either delivers every sample with the cache folder never above the
limit, or fails at once with CacheLimitError naming a limit that works. No
reader waits for room that only its own node's pins hold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
import torch

from cache_servers import RangeServer
from conftest import labelled_sample
from shardfeed.cache import CacheLimitError, ShardCache
from shardfeed.cache.readers.reads import entry_bytes, max_entry_bytes
from shardfeed.formats import ShardWriter, open_index
from shardfeed.loader import ShardDataset

RANK = r"""
import json, os, sys, time
from shardfeed.cache import CacheLimitError, ShardCache
from shardfeed.loader import Loader, ShardDataset
a = json.loads(sys.argv[1])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
out = []
for k, limit in enumerate(a["limits"]):
    open(os.path.join(a["sync"], f"{k}-{rank}"), "w").close()  # ranks start each limit together
    while len([n for n in os.listdir(a["sync"]) if n.startswith(f"{k}-")]) < world:
        time.sleep(0.005)
    ds = ShardDataset(a["url"], shuffle="global", seed=1, cache_dir=os.path.join(a["cache"], str(k)),
                      cache_limit_bytes=limit)
    object.__setattr__(ds.cache, "wait_timeout_s", 60.0)  # a deadlock shows as a slow CacheLimitError
    t0 = time.monotonic()
    try:
        with Loader(ds, 8, num_workers=0) as loader:
            keys = [k for b in loader for k in b["__key__"]]
        out.append({"limit": limit, "keys": keys, "s": time.monotonic() - t0})
    except CacheLimitError as e:
        out.append({"limit": limit, "needed": e.needed_bytes, "reason": e.reason, "s": time.monotonic() - t0})
print(json.dumps(out))
"""


@pytest.fixture
def dataset(tmp_path):
    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=8) as w:
        for i in range(96):
            w.write(labelled_sample(i, 512))
    return root


class DiskWatch:
    """Samples the bytes under a folder every few ms in a thread (what du would say)."""

    def __init__(self, folder: str):
        self.folder, self.peak, self.samples = folder, 0, 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            total = 0
            for dirpath, _, files in os.walk(self.folder):
                for n in files:
                    try:
                        total += os.lstat(os.path.join(dirpath, n)).st_size
                    except FileNotFoundError:
                        pass
            self.peak, self.samples = max(self.peak, total), self.samples + 1
            time.sleep(0.002)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def _ranks(tmp_path, url: str, world: int, limits: list[int], tag: str) -> list[list[dict]]:
    sync = tmp_path / f"sync-{tag}"
    sync.mkdir()
    args = json.dumps({"url": url, "limits": limits, "sync": str(sync), "cache": str(tmp_path / f"c-{tag}")})
    procs = [subprocess.Popen([sys.executable, "-c", RANK, args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(world),
                                                  LOCAL_WORLD_SIZE=str(world)))
             for r in range(world)]
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=400)
            assert p.returncode == 0, stderr
            out.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return out


def _shard_bytes_in_cache(folder: str) -> int:
    """Bytes of shards, sidecars and temporaries: what the budget bounds."""
    return sum(os.path.getsize(os.path.join(folder, "data", n)) for n in os.listdir(os.path.join(folder, "data")))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("world", [2, 4])
def test_ranks_of_a_node_share_the_cache_without_deadlock(tmp_path, dataset, world):
    index = open_index(dataset)
    entry, total = max_entry_bytes(index), int(index.num_bytes)
    whole = int(entry_bytes(index).sum()) + (96 << 10)  # with room for the mirrored index, plans and folders (blocks)
    # the first beside room for the mirrored index and the cache's folders (in blocks), so the node's check decides
    limits = [entry + (64 << 10), total // 2, whole]  # all of it fits whatever the ranks pin
    with RangeServer(dataset) as srv, DiskWatch(str(tmp_path)) as watch:
        runs = _ranks(tmp_path, srv.url, world, limits, "a")
    assert watch.samples > 10
    needed = set()
    for k, limit in enumerate(limits):
        got = [r[k] for r in runs]
        if all("keys" in g for g in got):
            keys = sorted(x for g in got for x in g["keys"])
            assert keys == [f"{i:08d}" for i in range(96)]  # every sample once over the node's ranks
        else:
            # the node's working set does not fit: every rank says so at once, with one figure
            assert all("needed" in g and g["s"] < 30 for g in got), got
            assert len({g["needed"] for g in got}) == 1 and got[0]["needed"] > limit, [g["reason"] for g in got]
            assert f"{world} rank(s)" in got[0]["reason"]
            needed.add(got[0]["needed"])
        assert _shard_bytes_in_cache(str(tmp_path / "c-a" / str(k))) <= limit
    assert len(needed) == 1 and any("needed" in r[0] for r in runs)  # the small limits fail, the whole dataset works
    assert "keys" in runs[0][-1]
    if world == 2:
        # the figure is the smallest limit that works: at it every sample comes, a byte less is refused
        least = needed.pop()
        with RangeServer(dataset) as srv:
            again = _ranks(tmp_path, srv.url, world, [least, least - 1], "b")
        assert sorted(x for r in again for x in r[0]["keys"]) == [f"{i:08d}" for i in range(96)]
        assert all(r[1].get("needed") == least for r in again)


def _plain(ds, workers: int) -> list[str]:
    if workers == 0:
        return [s["__key__"] for s in ds]
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers, multiprocessing_context="spawn")
    return [s["__key__"] for s in dl]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("shuffle,workers", [("global", 0), ("block", 0), ("none", 0), ("global", 2)])
def test_plain_iteration_through_a_small_cache_yields_every_sample(tmp_path, dataset, shuffle, workers):
    index = open_index(dataset)
    entry, total = max_entry_bytes(index), int(index.num_bytes)
    with RangeServer(dataset) as srv:
        for k, limit in enumerate([entry * max(1, workers), total // 2, total * 9 // 10]):
            cdir = str(tmp_path / f"c{k}")
            ShardDataset(srv.url, cache_dir=cdir, cache_limit_bytes=1 << 30)  # mirrors the index
            limit += ShardCache(cdir, 1 << 30).budget.fixed_bytes()  # which stays in the budget too
            ds = ShardDataset(srv.url, shuffle=shuffle, seed=2, cache_dir=cdir, cache_limit_bytes=limit)
            object.__setattr__(ds.cache, "wait_timeout_s", 20.0)
            t0 = time.monotonic()
            with DiskWatch(os.path.join(cdir, "data")) as watch:
                keys = _plain(ds, workers)
            assert sorted(keys) == [f"{i:08d}" for i in range(96)], (limit, len(keys))
            assert watch.peak <= limit
            assert time.monotonic() - t0 < 120


@pytest.mark.timeout(300)
def test_plain_dataloader_workers_over_one_shard_fail_at_once_with_the_figure(tmp_path, dataset):
    entry = max_entry_bytes(open_index(dataset))
    with RangeServer(dataset) as srv:
        ShardDataset(srv.url, cache_dir=str(tmp_path / "c"), cache_limit_bytes=1 << 30)  # mirrors the index
        fixed = ShardCache(str(tmp_path / "c"), 1 << 30).budget.fixed_bytes()  # which stays, in blocks
        ds = ShardDataset(srv.url, shuffle="global", cache_dir=str(tmp_path / "c"), cache_limit_bytes=entry + fixed)
        import torch.utils.data._utils.worker as w

        w._worker_info = w.WorkerInfo(id=0, num_workers=2, seed=0, dataset=ds)  # as worker 0 of 2 sees it
        try:
            with pytest.raises(CacheLimitError) as err:
                next(iter(ds))
        finally:
            w._worker_info = None
    assert err.value.needed_bytes == 2 * entry + fixed and f"at least {2 * entry + fixed:,}" in err.value.reason



def _budget_bytes(folder: str) -> int:
    """What the budget counts in a cache folder's data: a sparse partial copy by its disk blocks."""
    data = os.path.join(folder, "data")
    total = 0
    for n in os.listdir(data):
        st = os.stat(os.path.join(data, n))
        total += st.st_blocks * 512 if n.startswith("r-") and "." not in n else st.st_size
    return total


@pytest.mark.timeout(900)
def test_ranks_reading_sample_ranges_work_at_the_figure_the_check_names(tmp_path):
    """Samples of a few disk blocks: misses come as sample ranges by default. The figure the
    start check names for two ranks is enough (every sample, no reader waiting on pins: the
    whole shards the cost model would pick and the ranks' prefetch stay out of the room the
    readers' ranges need), and a byte less is refused at once with the same figure."""
    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=8) as w:
        for i in range(192):
            w.write(labelled_sample(i, 16384))
    entry = max_entry_bytes(open_index(root))
    with RangeServer(root) as srv:
        first = _ranks(tmp_path, srv.url, 2, [3 * entry], "r")
        least = first[0][0]["needed"]
        assert {r[0].get("needed") for r in first} == {least} and "sample ranges" in first[0][0]["reason"]
        assert least < open_index(root).num_bytes // 3  # ranges need far less than whole shards would
        with DiskWatch(str(tmp_path / "c-s")):
            again = _ranks(tmp_path, srv.url, 2, [least, least - 1], "s")
    assert sorted(x for r in again for x in r[0]["keys"]) == [f"{i:08d}" for i in range(192)]
    assert all(r[0]["s"] < 50 for r in again), [r[0]["s"] for r in again]  # nobody waited out the 60 s timeout
    assert any(n.startswith("r-") for n in os.listdir(tmp_path / "c-s" / "0" / "data"))  # read as ranges
    assert _budget_bytes(str(tmp_path / "c-s" / "0")) <= least
    assert all(r[1].get("needed") == least for r in again)
