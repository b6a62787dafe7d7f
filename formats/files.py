"""Opening a dataset's files: regular files only, never a blocking read.

Every file of a dataset (shards, sidecars, ``index.arrow``, commit-log
entries) comes from a folder someone else controls. A FIFO there blocks
``open()`` forever, a character device such as ``/dev/zero`` never ends, a
directory or a symlink loop raises a bare ``OSError``. So each file is opened
with ``O_NONBLOCK`` (a FIFO opens at once instead of waiting for a writer)
and checked with ``fstat`` to be a regular file before a byte is read; the
descriptor that was checked is the one read from, so nothing can be swapped
in between. Anything else is a ShardError naming the file and what it is.
"""

from __future__ import annotations

import errno
import os
import stat

from shardfeed.formats.errors import ShardError

_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular_fd(path: str, shard: str | None = None, what: str = "file") -> int:
    """A read-only descriptor of ``path``, which must be a regular file.

    ShardError (naming ``shard``, default ``path``) when it is anything else or
    cannot be opened; FileNotFoundError passes through (callers say what a
    missing file means: a missing shard, a foreign tar without sidecar...).
    """
    shard = path if shard is None else shard
    try:
        fd = os.open(path, _FLAGS)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno == errno.ELOOP:
            reason = f"{what} {path} is a symlink loop"
        elif e.errno == errno.ENXIO:  # a socket, or a FIFO on systems that refuse O_NONBLOCK opens
            reason = f"{what} {path} is not a regular file (a socket or FIFO)"
        else:
            reason = f"{what} {path} cannot be opened: {e.strerror or e}"
        raise ShardError(shard, reason + "; a dataset holds regular files only") from e
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ShardError(shard, f"{what} {path} is {_kind(mode)}, not a regular file; a dataset holds "
                                    "regular files only (remove it or point the source elsewhere)")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(path: str, shard: str | None = None, what: str = "file"):
    """``open(path, "rb")`` for a regular file only (see ``open_regular_fd``)."""
    return os.fdopen(open_regular_fd(path, shard, what), "rb")


def check_regular(path: str, shard: str | None = None, what: str = "file") -> int:
    """Raise unless ``path`` is a regular file; returns its size. For libraries
    that open a path themselves (pyarrow's memory_map): checked just before."""
    fd = open_regular_fd(path, shard, what)
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def read_bounded(path: str, limit: int, shard: str | None = None, what: str = "file",
                 setting: str = "") -> bytes:
    """The whole of a regular file of at most ``limit`` bytes; ShardError if it
    is bigger (``setting`` names the knob that raises the bound)."""
    with open_regular(path, shard, what) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise ShardError(shard or path, f"{what} {path} has {size} bytes, over the bound of {limit}"
                                            + (f"; raise {setting} if it is genuine" if setting else ""))
        data = f.read(limit + 1)
    if len(data) > limit:  # grew while read
        raise ShardError(shard or path, f"{what} {path} grew past the bound of {limit} bytes while read")
    return data
