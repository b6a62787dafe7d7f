"""A reader's late sample ranges, fetched together rather than one shard after another.

When the prefetcher has not brought a batch's samples in time, the reader
makes them present itself (RangedShards.prepare): one request per shard it
touches, or a wait on the fetch lock the prefetcher holds while it brings
that shard's ranges. Each is a round trip, not bandwidth, and one after the
other they added up: on the demo's 2 loaded cores a late batch waited
150-300 ms in a row of them (a reader batch of 32 touches ~27 shards, ~7 of
them not held whole). Fetched by ``LATE_THREADS`` threads at once, the
batch waits about as long as its slowest shard. (Whole shards a batch
admits are still fetched by the read as it opens them: an error there goes
through the batcher's refetch, which a fetch ahead would have to repeat.)

Safe to overlap: every shard is pinned by the caller first, each has its
own fetch lock (ranges.py), and the budget, the cost model and the fetcher's
counters take their own locks. Room: the start check counts a batch's
samples in the blocks they land in plus one range asked for
(cost_model.range_working); a range in flight is not counted, as it is
dropped once its request ends, whoever waits. So threads asking at once may
wait for each other's ranges to land, never for good. HTTP connections are
kept per thread (http_source.py).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

LATE_THREADS = 16  # a reader's shards fetched at once for its own batch (a batch of 64 touches ~30 shards)

_pool: tuple[int, ThreadPoolExecutor] | None = None  # (pid, pool): a forked worker makes its own
_mu = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _mu:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(LATE_THREADS, thread_name_prefix="shardfeed-late-ranges"))
        return _pool[1]


def ensure_all(fetcher, wanted, on_wait=None) -> list[int]:
    """For each ``(ref, local ids, sample count)`` in ``wanted`` (each shard pinned by the
    caller), its samples made present in its partial copy: samples fetched, per shard
    (``on_wait``: as RangeFetcher.ensure's, called by any of the threads).
    Shards whose samples are all present are checked here, the rest fetched together; the
    first error (in ``wanted``'s order) is raised once every fetch has ended, so none is left
    running past the call (the caller releases the pins)."""
    fetched = [0] * len(wanted)
    late = [j for j, (ref, local, _) in enumerate(wanted) if not fetcher.present(ref, local)]
    if len(late) <= 1:
        for j in late:
            fetched[j] = fetcher.ensure(*wanted[j], on_wait=on_wait)[1]
        return fetched
    futures = [(j, _executor().submit(fetcher.ensure, *wanted[j], on_wait=on_wait)) for j in late]
    error = None
    for j, f in futures:
        try:
            fetched[j] = f.result()[1]
        except BaseException as e:  # noqa: BLE001 - raised below, after the other fetches ended
            error = error or e
    if error is not None:
        raise error
    return fetched
