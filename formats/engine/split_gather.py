"""One batch's tar gather split over two threads, when its reads are many and a core is free.

In ``global`` order every sample of a small-sample batch is a preadv of its
own, so the gather (kernels.tar_gather) is bound by ~1.5 us of syscall per
sample, not by copying. tar_gather releases the GIL, and two calls that
gather disjoint rows of one batch share nothing but the read-only table of
open shards, so the batch's second half can be gathered on a helper thread
while the reading thread gathers the first. Measured on the 2-core dev VM
(2 KiB samples, global order, warm page cache, nothing else running): 1.4-1.65x
the gather rate. A batch of a few long runs (stored or block order) is bound by
memory bandwidth and gains nothing: it is never split (``MIN_RUNS``).

With the other core busy (loader workers, another rank, another job) the two
halves take turns on one core and the split costs 5-20%, and which way wins
can change during a run. So the choice is measured, not fixed: the splitter
times the way in use (moving average of the time per sample) and now and
then tries the other way for ``TRY_BATCHES`` batches (their median), switching
when the try is faster by 5%. Tries come after ``EXPLORE_EVERY`` batches, then
twice as far apart after each try that keeps the choice (up to
``EXPLORE_MAX``). Under load a split batch can cost 2-4x (the helper waits for
a time slice while the reading thread waits for it); the backoff keeps those
tries to a few per thousand batches.

Only a reader that was allowed threads splits: the Loader allows it in the
process that reads at ``num_workers=0`` (a worker process already has a core
of its own). ``SHARDFEED_READ_THREADS=1`` turns it off. Results are exactly
those of one call: same bytes, same checksum verdicts, and the first failing
row of the batch in the same form.
"""

from __future__ import annotations

import os
import time

import numpy as np

from shardfeed.formats.engine.helper_thread import Helper
from shardfeed.formats.engine.kernels import tar_gather

MIN_RUNS = 64  # a batch of fewer runs of adjacent bytes is one call
TRY_BATCHES = 3  # a try of a way: the median of this many batches (one batch's time is noisy under load)
EXPLORE_EVERY = 16  # batches in use before the first try of the other way
EXPLORE_MAX = 1024
MARGIN = 0.95  # a try must beat the way in use by 5% to replace it
_ALPHA = 0.25  # weight of the newest batch in the moving average of the way in use


def threads_allowed() -> int:
    """Reading threads a Loader may give its 0-worker reader: 2, or 1 with
    SHARDFEED_READ_THREADS=1 or a single usable core."""
    if os.environ.get("SHARDFEED_READ_THREADS", "").strip() == "1":
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return 2 if cores >= 2 else 1


def _runs(slot: np.ndarray, local: np.ndarray) -> int:
    """Runs of adjacent samples in a batch, counted where it decides anything: ~9 us a batch for the
    exact count (two diffs) was paid on every 0-worker batch, stored order included, against ~1 us
    for these checks. A batch whose ends lie ``n - 1`` samples apart in one shard is taken as one run
    (stored order); otherwise a new run starts where the next sample is not the next one of its
    shard's sidecar (the shard change a diff of ``slot`` would add is left out: a run counted too few
    only keeps a batch to one call). Only the split decision reads this: never the bytes read."""
    n = len(local)
    if n < 2:
        return n
    if int(local[-1]) - int(local[0]) == n - 1 and int(slot[-1]) == int(slot[0]):
        return 1
    return 1 + int(np.count_nonzero(np.diff(local) != 1))


class SplitGather:
    """Drop-in for ``tar_gather`` (same arguments, same result) that may split the batch."""

    def __init__(self, iov: np.ndarray, junk: np.ndarray):
        self.threads = 1
        self._iov = np.zeros_like(iov)  # the helper thread's own scratch
        self._junk = np.empty_like(junk)
        self._helper = Helper("shardfeed-gather-half")
        self.cost = [0.0, 0.0]  # seconds per sample: [one call, split]; the way in use: a moving average
        self.seen = [0, 0]  # batches timed each way
        self.split = False  # the way in use
        self._tries: list[float] = []  # per-sample times of the try under way
        self._wait = 0  # batches in use until the next try (0: try now)
        self._gap = EXPLORE_EVERY

    def __call__(self, table, slot, local, rows, dst, dst_pos, fstart, fsize, kbuf, kpos, hash_fn, bad,
                 io_fn, iov, junk, faddr, xs):
        """``xs`` (2, 4): the streaming hash of the reading thread (row 0) and of the helper (row 1)."""
        n = len(local)
        if self.threads < 2 or io_fn == 0 or n < 2 * MIN_RUNS or _runs(slot, local) < MIN_RUNS:
            return tar_gather(table, slot, local, rows, dst, dst_pos, fstart, fsize, kbuf, kpos, hash_fn, bad,
                              io_fn, iov, junk, faddr, xs[0])
        trying = self._wait <= 0 and self.seen[0] >= TRY_BATCHES  # the first batches measure one call
        split = self.split != trying
        t0 = time.perf_counter()
        if split:
            out = self._split(table, slot, local, rows, dst, dst_pos, fstart, fsize, kbuf, kpos, hash_fn, bad,
                              io_fn, iov, junk, faddr, xs)
        else:
            out = tar_gather(table, slot, local, rows, dst, dst_pos, fstart, fsize, kbuf, kpos, hash_fn, bad,
                             io_fn, iov, junk, faddr, xs[0])
        per = (time.perf_counter() - t0) / n
        self.seen[split] += 1
        if trying:
            self._tries.append(per)
            if len(self._tries) == TRY_BATCHES:
                self._decide()
        else:
            w = int(split)
            self.cost[w] = per if self.seen[w] == 1 else (1 - _ALPHA) * self.cost[w] + _ALPHA * per
            self._wait -= 1
        return out

    def _decide(self) -> None:
        other = sorted(self._tries)[TRY_BATCHES // 2]
        self._tries = []
        if other < MARGIN * self.cost[self.split]:
            self.split = not self.split
            self.cost[self.split] = other
            self._gap = EXPLORE_EVERY
        else:
            self.cost[not self.split] = other
            self._gap = min(EXPLORE_MAX, self._gap * 2)
        self._wait = self._gap

    def _split(self, table, slot, local, rows, dst, dst_pos, fstart, fsize, kbuf, kpos, hash_fn, bad, io_fn,
               iov, junk, faddr, xs):
        h = len(local) // 2
        # the second half: its own rows, key positions and bad flags (views), its own scratch and hash state
        self._helper.submit(tar_gather, table, slot[h:], local[h:], rows[h:], dst, dst_pos, fstart, fsize, kbuf,
                            kpos[h:], hash_fn, bad[h:], io_fn, self._iov, self._junk, faddr, xs[1])
        try:
            first = tar_gather(table, slot[:h], local[:h], rows[:h], dst, dst_pos, fstart, fsize, kbuf, kpos,
                               hash_fn, bad[:h], io_fn, iov, junk, faddr, xs[0])
        finally:
            ok, second = self._helper.wait()  # never leave the helper writing into a buffer we hand back
        if not ok:
            raise second
        if first[1]:
            return first[0] + second[0], first[1], first[2]
        if second[1]:
            return first[0] + second[0], second[1], second[2] + h
        return first[0] + second[0], 0, 0

    def close(self) -> None:
        self._helper.close()
