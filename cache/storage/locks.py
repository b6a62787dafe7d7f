"""flock-based locks shared by every process on a node (Linux).

flock locks belong to an open file description, so two opens in one process
conflict like two processes do: a pin taken by a thread blocks an eviction
tried by another thread of the same process. A lock file may be unlinked by
the evictor while someone waits on it; ``FileLock.acquire`` re-checks that the
file it locked is still the one at the path, else it retries on the new one.

Slots: byte-range locks on one byte per item of a lock file (open-file-
description locks: they too belong to one open, not to the process). A pin's
holder claims the items it will read (``FileLock.claim``, shared); whoever
would destroy items takes theirs exclusively (``free_slots``) and leaves out
the ones claimed (cache/ranges.py: consumed samples punched out of a copy).
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import time
from contextlib import contextmanager

# struct flock (l_type, l_whence, l_start, l_len, l_pid) on Linux; OFD locks need l_pid 0
_FLOCK = "@hhqqi4x"
_OFD_SETLK, _OFD_SETLKW = getattr(fcntl, "F_OFD_SETLK", 37), getattr(fcntl, "F_OFD_SETLKW", 38)


class FileLock:
    """One flock on ``path``: ``acquire(shared=..., blocking=...)`` / ``release()``."""

    def __init__(self, path: str):
        self.path = path
        self.fd: int | None = None

    def acquire(self, shared: bool = False, blocking: bool = True) -> bool:
        if self.fd is not None:
            raise RuntimeError(f"{self.path}: lock already held by this object")
        op = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if blocking else fcntl.LOCK_NB)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, op)
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    return False
                raise
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                return True
            os.close(fd)  # we locked a file the evictor unlinked: lock the current one instead

    def release(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)  # closing drops the flock

    def unlink_locked(self) -> None:
        """Remove the lock file while holding it exclusively (waiters then retry on a new file)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def claim(self, slots) -> None:
        """Shared locks on slots ``slots`` of the held lock's file, until ``unclaim`` or release
        (waits while ``free_slots`` holds one)."""
        _slot_locks(self.fd, slots, fcntl.F_RDLCK, blocking=True)

    def unclaim(self) -> None:
        fcntl.fcntl(self.fd, _OFD_SETLK, struct.pack(_FLOCK, fcntl.F_UNLCK, os.SEEK_SET, 0, 0, 0))

    @property
    def held(self) -> bool:
        return self.fd is not None

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


def acquire_timed(lock: FileLock, shared: bool = False) -> float:
    """Blocking acquire; returns the seconds spent waiting (0 when free)."""
    if lock.acquire(shared=shared, blocking=False):
        return 0.0
    t0 = time.monotonic()
    lock.acquire(shared=shared, blocking=True)
    return time.monotonic() - t0


def _slot_locks(fd: int, slots, kind: int, blocking: bool) -> list[int]:
    """Lock byte ``i`` of ``fd``'s file for each ``i`` of ``slots``; the slots locked
    (without ``blocking``, those another open holds are left out)."""
    got = []
    for i in slots:
        try:
            fcntl.fcntl(fd, _OFD_SETLKW if blocking else _OFD_SETLK, struct.pack(_FLOCK, kind, os.SEEK_SET, int(i), 1, 0))
        except OSError as e:
            if blocking or e.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            continue
        got.append(int(i))
    return got


@contextmanager
def free_slots(path: str, slots):
    """The slots of ``slots`` that nobody claims on lock file ``path`` (all of them when it is
    gone), locked exclusively for the block: no claim of them is taken meanwhile."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        yield list(slots)
        return
    try:
        yield _slot_locks(fd, slots, fcntl.F_WRLCK, blocking=False)
    finally:
        os.close(fd)
