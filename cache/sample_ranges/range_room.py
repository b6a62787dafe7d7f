"""Room and requests for sample-range fetches: leases of budget room, and the process's pool of range GETs.

Making room for a fetch (budget.make_room_and_create) lists the cache folder
under the node's lock: with one fetch per shard and step (tens a step) those
scans were the queue every range fetch waited in. A prefetch's small fetches
draw their room from a lease instead (``Leases.draw``). The ranges of one
fetch go out side by side in the process's pool (``requests``), up to
``RANGE_REQUESTS`` at once: a range costs a round trip, not bandwidth.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from shardfeed.cache.storage.budget import unlink_quiet
from shardfeed.cache.storage.locks import FileLock

RANGE_REQUESTS = 64  # range GETs in flight at once per process: each mostly waits a round trip, not bandwidth
_pool: tuple[int, ThreadPoolExecutor] | None = None  # (pid, pool): a forked worker makes its own
_pool_mu = threading.Lock()


LEASE_BYTES = 1 << 20  # room a process takes at once for its next small fetches (Leases.draw)
LEASE_S = 0.25  # and for at most this long
# a lease holds this many times the room of the fetch that takes it: bench remote's warm epoch (4,300 fetches of
# ~14 KB) took 290 leases at 16, a folder scan each (a fifth of the process's CPU), 140 at 32; at 64, 80, but the
# room they held unused evicted copies read later (2-6% more bytes fetched)
LEASE_FETCHES = 32


class _Lease:
    """One temporary of room that a process's fetches draw from (Leases.draw)."""

    def __init__(self, path: str, lock, nbytes: int):
        self.path, self.lock = path, lock
        self.pid, self.born = os.getpid(), time.monotonic()
        self.left, self.users, self.closed = nbytes, 0, False

    def drop(self) -> None:
        unlink_quiet(self.path)
        self.lock.release()


def requests() -> ThreadPoolExecutor:
    """The process's pool of range GETs (shared by every fetch of every cache)."""
    global _pool
    with _pool_mu:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(RANGE_REQUESTS, thread_name_prefix="shardfeed-range-get"))
        return _pool[1]


def drain(futures: list) -> None:
    """Wait for every future, then raise the first error among them (none is left running)."""
    error = None
    for f in futures:
        try:
            f.result()
        except BaseException as e:  # noqa: BLE001 - raised below, once all have ended
            error = error or e
    futures.clear()
    if error is not None:
        raise error




class Leases:
    """The room a process's range fetches of one cache take ahead (see ``draw``)."""

    def __init__(self, cache):
        self.cache = cache
        self._lease: _Lease | None = None
        self._mu = threading.Lock()
        self._n = 0
        self._no_lease_until: dict[str, float] = {}  # terms -> no room for a lease lately: not asked before then

    def draw(self, size: int, url: str, headroom: int, for_step: int | None) -> _Lease | None:
        """Room for ``size`` bytes from this process's lease, or None (then the fetch makes its own).

        Each room made scans the cache folder under the node's lock; with a fetch per shard and
        step (tens a step) those scans were the node's one queue: at 8,000 samples in 500 shards a
        warm epoch made 4,500 of them, 2.7 ms each, and fewer than 5 requests were in flight on
        average. A lease is one temporary of ``LEASE_FETCHES`` times a prefetch's room (at most
        ``LEASE_BYTES``), made on that prefetch's terms (NoRoom rather than a wait: budget.py),
        that the next fetches of this process draw from for at most ``LEASE_S``; it goes once its
        last fetch has landed (its bytes then counted twice for that while: over, never under, the
        limit). A reader's own fetch makes its own room (it may wait) but may draw from a lease."""
        if size * 4 > LEASE_BYTES:
            return None
        with self._mu:
            lease, now = self._lease, time.monotonic()
            if lease is not None and (lease.pid != os.getpid() or now - lease.born > LEASE_S or lease.left < size):
                self._lease = None
                if lease.pid == os.getpid():
                    lease.closed = True
                    if not lease.users:
                        lease.drop()
                lease = None
            if lease is None:
                terms = "headroom" if headroom else "step"
                if now < self._no_lease_until.get(terms, 0.0) or (not headroom and for_step is None):
                    return None
                lease = self._lease = self._take_lease(url, min(LEASE_BYTES, LEASE_FETCHES * size), headroom,
                                                       for_step)
                if lease is None:
                    # by terms: beyond the window (headroom, only copies no plan reads may go) a lease often
                    # finds no room; that kept the window's fetches from leases too (400 more scans an epoch)
                    self._no_lease_until[terms] = now + LEASE_S
                    return None
            lease.left -= size
            lease.users += 1
            return lease

    def _take_lease(self, url: str, nbytes: int, headroom: int, for_step: int | None) -> _Lease | None:
        from shardfeed.cache.storage.budget import NoRoom

        limit = self.cache.limit_bytes
        if LEASE_BYTES * 16 > limit:
            return None  # a small cache: every byte of room goes to a fetch that needs it now
        self._n += 1
        key = f"lease-{os.getpid()}-{self._n}"
        lock = FileLock(os.path.join(self.cache.lock_dir, key + ".fetch"))  # held: its temporary is not an orphan
        lock.acquire()
        try:
            path = self.cache.budget.make_room_and_create(key, "", nbytes, url, headroom=headroom, for_step=for_step)
        except NoRoom:
            lock.release()
            return None
        except BaseException:
            lock.release()
            raise
        lease = _Lease(path, lock, nbytes)
        timer = threading.Timer(LEASE_S, self._expire, (lease,))  # an idle process holds no lease for long
        timer.daemon = True
        timer.start()
        return lease

    def _expire(self, lease: _Lease) -> None:
        with self._mu:
            if self._lease is lease:
                self._lease = None
            if not lease.closed:
                lease.closed = True
                if not lease.users:
                    lease.drop()

    def landed(self, lease: _Lease) -> None:
        with self._mu:
            lease.users -= 1
            if lease.closed and not lease.users:
                lease.drop()

