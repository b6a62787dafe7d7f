"""flock-based locks shared by every process on a node (Linux).

flock locks belong to an open file description, so two opens in one process
conflict like two processes do: a pin taken by a thread blocks an eviction
tried by another thread of the same process. A lock file may be unlinked by
the evictor while someone waits on it; ``FileLock.acquire`` re-checks that the
file it locked is still the one at the path, else it retries on the new one.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time


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
