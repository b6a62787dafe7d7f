"""A range fetch that waits for room lets go of its copy's fetch lock meanwhile.

Consumed samples are punched out of a partial copy under that lock. When a
fetch waited for room with it held, the consumed samples it kept in place
could be the very room it waited for: two ranks at the figure the start
check names then waited on each other until the timeout (1 run in 8-17 of
test_ranks_reading_sample_ranges_work_at_the_figure_the_check_names once the
test server answered without Nagle's 44 ms)."""

from __future__ import annotations

import os
import threading
import time

from cache_servers import RangeServer
from conftest import labelled_sample
from shardfeed.cache import ShardCache, ShardRef
from shardfeed.cache.sample_ranges.cost_model import CostModel
from shardfeed.cache.sample_ranges.ranges import RangeFetcher
from shardfeed.formats import ShardWriter, open_index

PER_SHARD = 8


def _setup(tmp_path, srv_root):
    with ShardWriter(srv_root, max_shard_samples=PER_SHARD) as w:
        for i in range(PER_SHARD):
            w.write(labelled_sample(i, 16384))
    return open_index(srv_root)


def _waiting_fetch(tmp_path, on_wait=None):
    """Samples 0-1 fetched and consumed (not punched yet), the budget then set so that samples
    4-5 fit only once 0-1 are given back; returns what a fetch of 4-5 in a thread did,
    with what ``on_wait`` (or a punch from this thread) made of the wait."""
    root = str(tmp_path / "ds")
    ix = _setup(tmp_path, root)
    cache = ShardCache(str(tmp_path / "c"), 1 << 20)
    fetcher = RangeFetcher(cache, CostModel())
    with RangeServer(root) as srv:
        ref = ShardRef(f"{srv.url}/{ix.names[0]}", ix.hashes[0], int(ix.sizes[0]))
        assert fetcher.ensure(ref, [0, 1], PER_SHARD) == (0, 2)
        table = fetcher.table(ref, fetcher.path(ref), PER_SHARD)
        cache.budget.limit_bytes = cache.budget.used_bytes() + 8192  # less than the range of samples 4-5
        cache.budget.wait_timeout_s = 8.0
        out = {}

        def fetch():
            pin = fetcher.pin(ref)
            t0 = time.monotonic()
            try:
                out["got"] = fetcher.ensure(ref, [4, 5], PER_SHARD, on_wait=on_wait and (lambda: on_wait(fetcher, ref, table)))
            except Exception as e:  # noqa: BLE001 - reported to the test
                out["error"] = e
            finally:
                out["s"] = time.monotonic() - t0
                pin.release()

        t = threading.Thread(target=fetch)
        t.start()
        if on_wait is None:
            deadline = time.monotonic() + 4.0
            time.sleep(0.2)  # the fetch is waiting for room by now
            while not fetcher.punch(ref, table, [0, 1]):  # False while the fetch holds the copy's lock
                assert time.monotonic() < deadline, "the waiting fetch kept its copy's fetch lock"
                time.sleep(0.05)
        t.join()
        fd = os.open(fetcher.path(ref), os.O_RDONLY)
        try:
            out["present"] = [i for i in range(PER_SHARD) if fetcher._present(fd, table, i)]
        finally:
            os.close(fd)
        out["peak_ok"] = cache.budget.used_bytes() <= cache.budget.limit_bytes
    return out


def test_a_punch_from_another_reader_goes_through_while_a_fetch_waits(tmp_path):
    out = _waiting_fetch(tmp_path)
    assert "error" not in out, out.get("error")
    assert out["got"] == (0, 2) and out["s"] < 4.0
    assert out["present"] == [4, 5] and out["peak_ok"]


def test_the_waiting_reader_gives_back_its_own_consumed_samples(tmp_path):
    calls = []

    def give_back(fetcher, ref, table):
        calls.append(fetcher.punch(ref, table, [0, 1]))  # what RangedShards._give_back does

    out = _waiting_fetch(tmp_path, give_back)
    assert "error" not in out, out.get("error")
    assert calls and calls[0] is True  # its copy's lock was let go for the wait
    assert out["got"] == (0, 2) and out["present"] == [4, 5] and out["peak_ok"]
