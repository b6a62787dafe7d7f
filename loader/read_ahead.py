"""At ``num_workers=0``, the next batch read on a thread while the consumer works on this one.

Why: without workers a batch was read only when the consumer asked for it, so
every read was a stall. Most of a read is the gather's system calls (one
preadv a sample under ``global`` order) and its checksums, which release the
GIL: on a second core they run while the consumer's step runs, a training
step's torch kernels included.

When (``wanted``): the fast path only (no transform and no ``collate_fn``:
nothing on the thread runs user code or draws from the process's global
RNGs), a ShardDataset of fixed shards (no followed stream, whose feed waits
for data), no node cache (its prefetcher and pins follow the consumer's
step), and reading threads allowed (``SHARDFEED_READ_THREADS=1``, or one
usable core, turns it off; ``SHARDFEED_READ_AHEAD=0`` turns off this alone).
The split gather (formats/engine/split_gather.py) stays allowed beside it: a
batch read in turn (a bare loop) still splits, and a split that runs beside a
read ahead and the consumer's step is timed like any other, so the splitter
keeps to one call where the two halves would only take turns on the cores.

Order of work: batch k is read on the thread into one of two buffers, used in
turn; the consumer's thread turns it into the batch the user sees
(``materialize``) and only then starts the read of batch k+1, into the other
buffer, and hands batch k out. So the reader (its scratch arrays, open
shards) is never used by two threads at once, a batch's columns are never
read while the next read writes, and a view form's batch stays valid until
the next batch is requested (views.py), as without the thread. A read's
error reaches the consumer when it asks for that batch, as without the
thread; leaving the loop waits for the read in flight, and the feed's
position stays that of the last batch handed out (``Loader.state_dict``).
"""

from __future__ import annotations

import os
import time

from shardfeed.formats.engine.helper_thread import Helper
from shardfeed.loader.batch_seeds import set_batch
from shardfeed.loader.collate import Ready, materialize
from shardfeed.loader.scratch import Scratch

THREAD_NAME = "shardfeed-read-ahead"


def wanted(loader, maker) -> bool:
    """Whether ``loader`` (at num_workers=0) reads ahead with ``maker``."""
    from shardfeed.formats.engine.split_gather import threads_allowed
    from shardfeed.loader.batcher import BatchMaker

    if os.environ.get("SHARDFEED_READ_AHEAD", "").strip() == "0":
        return False
    return (type(maker) is BatchMaker and maker.transform is None and maker.collate_fn is None
            and maker.cached is None and loader._cache is None and not loader.dataset.follow
            and threads_allowed() >= 2)


def allow_split(maker) -> None:
    """Let ``maker``'s reader split a batch's gather over the threads allowed (split_gather.py)."""
    from shardfeed.formats.engine.split_gather import threads_allowed

    maker.reader.allow_threads(threads_allowed())


def batches(maker, feed, key_of, pin_memory: bool, bytes_as: str, ahead: bool):
    """(item, columns or Ready(batch), info) for each step of ``feed``: with ``ahead``, each read on a
    thread while the previous one is out with the consumer (see the module's docstring); else each read
    when the consumer asks for it."""
    if not ahead:
        yield from _in_turn(maker, feed, key_of)
        return
    bufs = (Scratch(), Scratch())  # in turn: a view form's batch stays intact while the next is read
    turn = 0
    def read(job):
        item, ids = job
        maker.hint(item.plan, item.start, item.stop)
        set_batch(maker, key_of(item))
        t0 = time.perf_counter()
        got = maker.make(ids, item.image_size, alloc=bufs[turn].alloc)
        return got, time.perf_counter() - t0

    helper = Helper(THREAD_NAME)  # its thread starts at the first read ahead: a bare loop never has one
    pace = Pace()
    in_flight = False
    try:
        items = iter(feed)
        item = next(items, None)
        while item is not None:
            if in_flight:
                ok, got = helper.wait()
                in_flight = False
                if not ok:
                    raise got
            else:
                got = read((item, item.ids()))  # the thread is idle: read here, no handoff
            (cols, info), read_s = got
            pace.read(read_s)
            batch = materialize(cols, pin_memory, bytes_as)  # before the next read reuses the reader
            nxt = next(items, None)
            turn ^= 1
            if nxt is not None and pace.ahead():
                helper.submit(read, (nxt, nxt.ids()))  # the plan's arithmetic on this thread: the feed is not shared
                in_flight = True
            away = time.perf_counter()
            yield item, Ready(batch), info
            pace.away(time.perf_counter() - away)
            item = nxt
    finally:
        if in_flight:
            helper.wait()  # never leave the thread reading into a buffer or a reader someone else uses next
        helper.close(join=True)


class Pace:
    """Whether to read the next batch ahead: when the consumer is away long enough for a read to run
    beside it. A consumer that asks again at once (a bare loop over the batches) gains nothing from the
    thread and pays its handoffs and the GIL's back and forth (measured: 0.9-1.4 against 0.7-1.0 ms a
    batch of 256 x 2 KiB under global); one that runs a training step waits 2-3x less for its batches."""

    ALPHA = 0.25  # weight of the newest batch in the moving averages
    SHARE = 0.5  # read ahead while the consumer is away at least this share of a read

    def __init__(self):
        self.read_s = self.away_s = None

    def read(self, s: float) -> None:
        self.read_s = s if self.read_s is None else (1 - self.ALPHA) * self.read_s + self.ALPHA * s

    def away(self, s: float) -> None:
        self.away_s = s if self.away_s is None else (1 - self.ALPHA) * self.away_s + self.ALPHA * s

    def ahead(self) -> bool:
        return self.away_s is not None and self.away_s >= self.SHARE * self.read_s


def _in_turn(maker, feed, key_of):
    for item in feed:
        maker.hint(item.plan, item.start, item.stop)
        set_batch(maker, key_of(item))
        cols, info = maker.make(item.ids(), item.image_size)
        yield item, cols, info
