"""The decompression thread: a reader's next compressed tar shards decompressed in the background.

A .tar.gz / .tar.zst shard is decompressed whole when a read first needs it
(readers.py); in stored order that happens inside the steady pass, once per
shard, while the consumer waits. zlib and zstandard release the GIL, so one
thread can decompress the shards a reader will need next while it reads the
current ones. ``DecompressAhead`` is that thread, one per reading process
(each Loader worker has its own, for the shards of its own batches).

The owner (the thread that reads, which also owns the table of open shards)
says what comes next: ``want([(shard, path, fmt), ...])``, in order of next
use, shards already open left out. The thread decompresses the first
``depth`` of them, one at a time. A read of a compressed shard asks
``claim(path)`` first (readers.TarShardReader): it takes the ready bytes,
waits for a decompression in flight (never a second one of the same shard)
or gets None and decompresses itself, as before.

Budget (decoded_budget.py): a ready shard counts against the process-wide
budget from the moment it is decompressed until its reader closes. The
thread only takes budget that is free (``decoded_budget.try_acquire``, no
reclaiming: the table of open shards belongs to the reading thread, and a
shard a batch has pinned is never closed for a guess). A shard that did not
fit is dropped and, once its size is known, the next ``want`` (on the
reading thread, between batches: nothing pinned) makes room for it the way a
read does, closing least recently used unpinned shards; if even that fails
the shard is left to its read. Ready shards nobody claimed are given back
when the plan moves on (``want`` no longer names them) and to a read that
needs budget (a reclaimer, registered after the tables' own), together with the room
reserved for queued or running ones: a read never fails for room a guess holds. A
guess's room never closes an open shard the next batches read (OpenShards.keep).

Errors: a decompression that fails (corrupt, truncated, over the per-shard
cap, missing) is forgotten: the read decompresses the shard itself and raises
exactly the ShardError it raises without this module. A shard changed on
disk since it was decompressed (size, mtime or inode) is not handed out.

Thread: ``shardfeed-decompress-ahead``, daemon, started on the first
``want``; ``close()`` stops and joins it (at most the one decompression in
flight) and gives back every byte of budget it holds; safe twice.
"""

from __future__ import annotations

import os
import threading
import weakref

from shardfeed.formats.engine import decoded_budget

DEPTH = 2  # compressed shards decompressed ahead (ready or in flight) per reading process

_live: weakref.WeakSet = weakref.WeakSet()  # instances a read asks (claim)
_live_lock = threading.Lock()


def _forget_in_child() -> None:
    # a forked child (a Loader worker) has none of the parent's threads: a read
    # there must never wait for a decompression the parent had in flight
    global _live, _live_lock
    _live, _live_lock = weakref.WeakSet(), threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _stamp(path: str):
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ino


class _Entry:
    __slots__ = ("path", "fmt", "state", "data", "budget", "stamp", "size", "reserved")

    def __init__(self, path: str, fmt: str, reserved: int = 0):
        self.path, self.fmt = path, fmt
        self.state = "queued"  # queued -> running -> ready | failed | nofit
        self.data = None
        self.budget = 0  # bytes of the process-wide budget this entry holds
        self.reserved = reserved  # budget taken for it in advance by want() (its size was known)
        self.stamp = None
        self.size = 0


class DecompressAhead:
    """See the module docstring."""

    def __init__(self, depth: int = DEPTH, load=None):
        from shardfeed.formats.tar_stream import load_tar_stream

        self.depth = max(1, int(depth))
        self._load = load or load_tar_stream
        self._cv = threading.Condition()
        self._entries: dict[str, _Entry] = {}  # path -> entry, in order of want
        self._sizes: dict[str, int] = {}  # decompressed sizes of shards that did not fit
        self._stop = False
        self._thread: threading.Thread | None = None
        self.decompressed = 0  # shards decompressed here (tests, benchmarks)
        self.claimed = 0  # of those, handed to a read
        with _live_lock:
            _live.add(self)
        decoded_budget.add_reclaimer(self.reclaim)

    # -- the reading thread ------------------------------------------------
    def want(self, upcoming) -> None:
        """``upcoming``: (shard, path, fmt) in order of next use, not open yet.
        Queues the first ``depth`` compressed ones; drops ready ones no longer named."""
        if self._stop:
            return
        names = []
        for _s, path, fmt in upcoming:
            if fmt in ("tar.gz", "tar.zst") and path not in names:
                names.append(path)
                if len(names) == self.depth:
                    break
        dropped = []
        with self._cv:
            for path, e in list(self._entries.items()):
                if path not in names and e.state != "running":
                    dropped.append(self._entries.pop(path))
        for e in dropped:
            self._free(e)
        todo = []
        with self._cv:
            todo = [(p, f) for p, f in ((p, f) for _s, p, f in upcoming if p in names) if p not in self._entries]
        for path, fmt in dict(todo).items():
            reserved = 0
            size = self._sizes.get(path)
            if size is not None:  # did not fit before: make room now, as a read would (nothing is pinned)
                try:
                    reserved = decoded_budget.acquire(size, path)
                except Exception:  # noqa: BLE001 - no room even so: the read decompresses it itself
                    continue
            with self._cv:
                if self._stop:
                    decoded_budget.release(reserved)
                    return
                self._entries[path] = _Entry(path, fmt, reserved)
                self._cv.notify_all()
        if self._thread is None and self._entries:
            self._thread = threading.Thread(target=self._run, name="shardfeed-decompress-ahead", daemon=True)
            self._thread.start()

    def take(self, path: str):
        """(data, budget bytes) of ``path`` if it is or is being decompressed here
        (waits for it), else None."""
        with self._cv:
            e = self._entries.get(path)
            if e is None:
                return None
            while e.state == "running" and not self._stop:
                self._cv.wait()
            if e.state == "running":  # closing: the thread frees it
                return None
            # queued (not started: the read does it now rather than wait behind
            # others), ready, or failed (the read decompresses and raises)
            if self._entries.get(path) is e:
                del self._entries[path]
        if e.state != "ready":
            self._free(e)
            return None
        try:
            fresh = _stamp(path) == e.stamp
        except OSError:
            fresh = False
        if not fresh:
            self._free(e)
            return None
        data, budget = e.data, e.budget
        e.data, e.budget = None, 0
        self.claimed += 1
        return data, budget

    # -- the background thread ---------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not any(e.state == "queued" for e in self._entries.values()):
                    self._cv.wait()
                if self._stop:
                    return
                e = next(e for e in self._entries.values() if e.state == "queued")
                e.state = "running"
            state, data, budget, stamp = "failed", None, 0, None
            try:
                stamp = _stamp(e.path)
                data = self._load(e.path, e.fmt)
                n = len(data)
                with self._cv:
                    reserved, e.reserved = e.reserved, 0
                if reserved >= n:  # made room for it (want): it is counted already
                    budget, state = reserved, "ready"
                elif decoded_budget.release(reserved) or decoded_budget.try_acquire(n):
                    budget, state = n, "ready"
                else:
                    self._sizes[e.path] = n
                    data, state = None, "nofit"
            except BaseException:  # noqa: BLE001 - the read decompresses it again and raises (module docstring)
                data = None
            with self._cv:
                e.data, e.budget, e.stamp, e.state = data, budget, stamp, state
                if state == "ready":
                    self.decompressed += 1
                orphan = self._stop or self._entries.get(e.path) is not e
                self._cv.notify_all()
            if orphan or state != "ready":
                if state != "ready":
                    with self._cv:
                        if self._entries.get(e.path) is e:
                            del self._entries[e.path]
                self._free(e)

    def _free(self, e: _Entry) -> None:
        # taken under the lock, given back outside it (lock order: the budget's, then this one's)
        with self._cv:
            n = e.budget + e.reserved
            e.budget = e.reserved = 0
            e.data = None
        decoded_budget.release(n)

    def reclaim(self, nbytes: int) -> None:
        """Give back what this thread holds for guesses, farthest first (a read needs the
        budget): ready unclaimed shards and queued ones are dropped; a shard being
        decompressed loses the room ``want`` reserved for it (it takes free budget when
        done, or is left to its read). A read must never fail for room a guess holds."""
        dropped, revoked = [], 0
        with self._cv:
            for path, e in reversed(list(self._entries.items())):
                if nbytes <= 0:
                    break
                if e.state in ("ready", "queued"):
                    nbytes -= e.budget + e.reserved
                    dropped.append(self._entries.pop(path))
                elif e.state == "running" and e.reserved:
                    nbytes -= e.reserved
                    revoked += e.reserved
                    e.reserved = 0
        for e in dropped:
            self._free(e)
        decoded_budget.release(revoked)

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._cv:
            entries = list(self._entries.values())
            self._entries.clear()
        for e in entries:
            self._free(e)
        with _live_lock:
            _live.discard(self)


def claim(path: str):
    """(data, budget bytes) of compressed shard ``path`` if a DecompressAhead of
    this process holds or is decompressing it (waits for that), else None."""
    with _live_lock:
        live = list(_live)
    for ahead in live:
        got = ahead.take(path)
        if got is not None:
            return got
    return None


def upcoming(index, ids, is_open) -> list:
    """(shard, path, fmt) of the compressed tar shards sample ids ``ids`` read,
    in order of first use, those for which ``is_open(shard)`` left out."""
    import numpy as np

    if not len(ids):
        return []
    shards = np.searchsorted(index.offsets, ids, side="right") - 1
    uniq, first = np.unique(shards, return_index=True)
    out = []
    for s in uniq[np.argsort(first, kind="stable")].tolist():
        fmt = index.formats[s]
        if fmt in ("tar.gz", "tar.zst") and not is_open(s):
            out.append((s, index.path(s), fmt))
    return out
