"""The user's prefetcher (``shardfeed.cache.Prefetcher``): shards fetched ahead of use, in list order.

For code that reads a list of shards itself, position by position (the
Loader's prefetchers are loader_prefetch.py's: they follow a plan that moves,
and leave errors to the readers). Given the shards in order of next use, background
threads fetch the next ones while the consumer reads the current one, never
more than ``max_ahead_bytes`` beyond the consumer's position. The plan is
also given to the cache as its lookahead, so eviction keeps what comes soon.

Threads are named ``shardfeed-prefetch-<n>``, daemon, and stop on
``close()`` (safe to call twice; a fetch in progress stops before its next
range). A failed fetch is kept as a value and raised when the consumer asks
for that shard, never in the background.
"""

from __future__ import annotations

import contextlib
import threading

from shardfeed.cache.fetching.fetch import Cancelled
from shardfeed.cache.storage.store import ShardCache, ShardRef


def _ref(item) -> ShardRef:
    if isinstance(item, ShardRef):
        return item
    if isinstance(item, str):
        return ShardRef(item)
    return ShardRef(*item)


class Prefetcher:
    """``Prefetcher(cache, refs, max_ahead_bytes, threads=2)``; then for each
    position ``i`` in order: ``with p.hold(i) as path: ...`` (or ``p.get(i)``).

    ``refs``: ShardRef, URL, or (url, hash, size) tuples in order of next use;
    sizes (from the index) make the byte window exact; an unknown size counts
    as 0 until fetched. ``first_step``: the step of ``refs[0]`` in the cache's
    lookahead; ``plan_len``: how many upcoming shards the cache's plan holds.
    """

    def __init__(self, cache: ShardCache, refs, max_ahead_bytes: int, threads: int = 2, *,
                 sidecar: bool = False, first_step: int = 0, plan_len: int = 4096):
        self.cache = cache
        self.refs = [_ref(r) for r in refs]
        self.max_ahead_bytes = int(max_ahead_bytes)
        self.sidecar = sidecar
        biggest = max((r.size or 0 for r in self.refs), default=0)
        # the consumer holds one shard while the window fills: both must fit at once
        cache.reserve(self.max_ahead_bytes + biggest)
        self.first_step = first_step
        self.plan_len = plan_len
        self.lookahead = cache.lookahead.publisher()  # its plan under its own name (two Loaders, one cache)
        self._publish_plan(0)
        self._cv = threading.Condition()
        self._pos = 0  # consumer's position: refs before it are done with
        self._next = 0  # next position to hand to a fetch thread
        self._results: dict[int, tuple[bool, object]] = {}  # i -> (ok, path or exception)
        self._stop = threading.Event()
        self._closed = False
        self._threads = [threading.Thread(target=self._run, name=f"shardfeed-prefetch-{n}", daemon=True)
                         for n in range(max(1, threads))]
        for t in self._threads:
            t.start()

    def _publish_plan(self, pos: int) -> None:
        # Shards behind the consumer leave the plan, so they become the first
        # to evict (a shard used again later stays, at its next position).
        # Only the next ``plan_len`` go to the cache: it is rewritten at each
        # advance, and anything further away is evicted first anyway.
        upcoming = self.refs[pos:pos + self.plan_len]
        self.cache.set_lookahead(((r, self.first_step + k) for k, r in enumerate(upcoming, start=pos)),
                                 self.lookahead)

    def __len__(self) -> int:
        return len(self.refs)

    def _window_allows(self, j: int) -> bool:
        if j == self._pos:
            return True  # the shard the consumer needs now is always allowed
        ahead = sum(r.size or 0 for r in self.refs[self._pos:j + 1])
        return ahead <= self.max_ahead_bytes

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stop.is_set() and (self._next >= len(self.refs)
                                                   or not self._window_allows(self._next)):
                    if self._next >= len(self.refs):
                        return
                    self._cv.wait()
                if self._stop.is_set():
                    return
                j = self._next
                self._next += 1
            if j < self._pos:
                continue  # the consumer skipped past it
            ref = self.refs[j]
            try:
                res = (True, self.cache.get(ref.url, ref.hash, ref.size, sidecar=self.sidecar, cancel=self._stop))
            except Cancelled:
                return
            except BaseException as e:  # noqa: BLE001 - travels to the consumer as a value
                res = (False, e)
            with self._cv:
                self._results[j] = res
                self._cv.notify_all()

    def _wait(self, i: int) -> None:
        if self._closed:
            raise RuntimeError("Prefetcher is closed")
        if not 0 <= i < len(self.refs):
            raise IndexError(f"position {i} is outside the plan of {len(self.refs)} shards")
        moved = False
        with self._cv:
            if i > self._pos:
                self._pos, moved = i, True
                for k in [k for k in self._results if k < i]:
                    del self._results[k]
                self._cv.notify_all()
            if i < self._pos:
                pass  # going back: its result was dropped; hold() fetches it again if evicted
            elif self._next <= i:
                self._next = i + 1  # the consumer is ahead of the threads: hold() fetches it here
                self._cv.notify_all()
            else:
                while i not in self._results and not self._stop.is_set():
                    self._cv.wait(0.5)
                ok, value = self._results.get(i, (True, None))
                if not ok:
                    raise value
        if moved:
            self._publish_plan(i)
        if self._closed:
            raise RuntimeError("Prefetcher is closed")

    @contextlib.contextmanager
    def hold(self, i: int):
        """Path of shard ``i``, pinned for the block; raises the error its fetch met."""
        self._wait(i)
        ref = self.refs[i]
        with self.cache.hold(ref.url, ref.hash, ref.size, sidecar=self.sidecar) as path:
            yield path

    def get(self, i: int) -> str:
        with self.hold(i) as path:
            return path

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        for t in self._threads:
            t.join(timeout=60)
        self.lookahead.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
