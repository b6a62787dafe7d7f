"""The share of decoded Parquet row groups between a loader's worker processes, as Arrow files in /dev/shm.

Why: under ``global`` order nearly every batch takes rows from nearly every
row group, so each of a loader's workers decoded the whole dataset (pyarrow's
page checksums are most of it: ~3.5 ms per 2 MB group), and at 2 workers a
pass did twice the decoding of one process. Here the first worker to need a
group takes its lock file (``flock``), decodes it, and publishes it as an
Arrow IPC file (temp, then rename); every worker, that one included, maps the
published file, so a group is decoded once per loader and held once in
memory. A worker that finds a group locked decodes the other groups it needs
first and then waits for the lock; a worker that dies holding one releases it
with its descriptors, and the next one decodes the group itself.

The files belong to the workers of one parent process
(``/dev/shm/shardfeed-groups-<parent pid>``), named by the shard file's
device, inode, size and mtime and the group: a shard replaced in place is
another name, never a stale group. Each file is unlinked once the process
that published it drops that group (its budget in decoded_budget.py bounds
them, as it bounds its own decoded groups; mappings already open stay valid),
folders of dead parents are removed by the next loader, and a file is only
published while the tmpfs keeps at least a quarter free (the loader's batches
cross in shared memory too). A mapped file is validated in full before use,
as every decoded group is.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import shutil
import stat
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from shardfeed.formats.staging import pid_alive

if TYPE_CHECKING:
    import pyarrow as pa

ROOT = "/dev/shm"
PREFIX = "shardfeed-groups-"
_FREE_FRACTION = 0.25  # of the tmpfs left free after publishing a group


def _prune(root: str) -> None:
    """Remove the folders of parents that are gone (their workers were killed)."""
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        pid = name[len(PREFIX):]
        if not name.startswith(PREFIX) or not pid.isdigit() or pid_alive(int(pid)):
            continue
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
            shutil.rmtree(path, ignore_errors=True)


class GroupShare:
    """The shared folder of one loader's workers (see the module docstring)."""

    def __init__(self, folder: str):
        self.folder = folder
        self.published = 0  # groups this process decoded and published
        self.mapped = 0  # groups taken from the folder, published by another process

    @classmethod
    def for_workers(cls, root: str = ROOT) -> GroupShare | None:
        """The folder of this process's parent (a loader worker's siblings share it), or None
        where there is no usable tmpfs."""
        if not os.path.isdir(root):
            return None
        _prune(root)
        folder = os.path.join(root, f"{PREFIX}{os.getppid()}")
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            st = os.lstat(folder)
        except OSError:
            return None
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            return None  # not a private folder of ours: do not read groups from it
        return cls(folder)

    @staticmethod
    def name(path: str, g: int) -> str | None:
        """The file name of group ``g`` of the shard at ``path`` as it is now."""
        try:
            st = os.stat(path)
        except OSError:
            return None
        return f"{st.st_dev:x}-{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}-{g}.arrow"  # verify: always on in a loader

    def load(self, name: str, decode: Callable[[], pa.Table], wait: bool) -> pa.Table | None:
        """Group ``name`` from the folder, else decoded here by ``decode()`` and
        published; None (only when not ``wait``) while another process decodes it."""
        path = os.path.join(self.folder, name)
        table = self._map(path)
        if table is not None:
            self.mapped += 1
            return table
        try:
            fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError:
            return decode()
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                return None
            table = self._map(path)  # published while we waited for the lock
            if table is not None:
                self.mapped += 1
                return table
            table = decode()
            if not self._publish(path, table):
                return table
            mapped = self._map(path)
            if mapped is None:
                return table
            self.published += 1
            # unlinked when this process lets the group go (or exits): its budget bounds the files
            weakref.finalize(mapped, _unlink, path)
            return mapped
        finally:
            os.close(fd)

    def _publish(self, path: str, table: pa.Table) -> bool:
        import pyarrow as pa  # a loader worker of tar shards never gets here: it need not load pyarrow

        try:
            vfs = os.statvfs(self.folder)
            free, size = vfs.f_bavail * vfs.f_frsize, vfs.f_blocks * vfs.f_frsize
            if free - table.nbytes - (64 << 10) < _FREE_FRACTION * size:
                return False
            tmp = f"{path}.tmp-{os.getpid()}"
            with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
            os.replace(tmp, path)
        except (OSError, pa.ArrowException):
            _unlink(f"{path}.tmp-{os.getpid()}")
            return False
        _unlink(path + ".lock")  # a later process finds the file first (and checks again under a new lock)
        return True

    @staticmethod
    def _map(path: str) -> pa.Table | None:
        import pyarrow as pa

        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or not st.st_size:
                return None
            mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)
        try:
            table = pa.ipc.open_file(pa.BufferReader(pa.py_buffer(mm))).read_all()
            table.validate(full=True)  # Arrow follows offsets blindly: the file is checked like a shard
        except (pa.ArrowException, OSError, ValueError):
            return None
        return table


_wanted = False
_active: list = []  # [GroupShare or None] once looked up


def share_in_this_process() -> None:
    """This process is one of a loader's workers: share decoded Parquet groups with its
    siblings (the folder is made on the first Parquet group decoded, not before)."""
    global _wanted
    _wanted = True


def active() -> GroupShare | None:
    """This process's share, or None when it shares nothing."""
    if not _wanted:
        return None
    if not _active:
        _active.append(GroupShare.for_workers())
    return _active[0]


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
