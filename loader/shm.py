"""Shared-memory batch transport between worker processes and the main process.

Each worker owns ``slots`` reusable segments (files in /dev/shm). A batch is
gathered straight into its slot (the payload bytes of all samples), its
columns' small arrays are appended after the payload, and only a small
header (segment name, offsets, dtypes, shapes) is pickled through the pipe.
The main process maps a segment once, rebuilds the columns as views, copies
them out (tensors, bytes) and the slot is free for the worker's next batch.
Byte fields handed out as views (``bytes_as="tensor"``/``"jagged"``) are not
copied at all: per batch the main process unpickles the header, builds three
numpy views and cuts the tensors (~0.3 ms for 256 values here); the copied
form's one copy is the ``bytes`` objects themselves.

What a fresh segment costs: its pages are faulted in by the first batch
gathered into it, ~20 ms per 25 MB on the 2-core dev VM (tmpfs pages, page
table entries set one by one; a reused segment reads the same batch in
~3 ms). A Loader pays that once per slot (``num_workers * prefetch``
segments), which is why a short first pass with workers reads slower than
later ones. Measured and not adopted: MAP_POPULATE (slower: it maps the
whole segment, slack included), MADV_POPULATE_WRITE and fallocate first
(within the noise), MADV_POPULATE_READ on the main side (same as faulting
around); tmpfs huge pages would cut it but are a system setting
(``shmem_enabled``), off here.

Why files in /dev/shm and not torch shared tensors: torch.multiprocessing
sends each tensor's storage by passing a file descriptor over a Unix socket
and the receiver maps it anew: a syscall round trip and a fresh mmap (page
faults on first touch) per tensor per batch. A reused segment is mapped once
and its pages stay faulted in, so a batch costs one small pickle plus the
copy-out. (Reasoned, not yet measured side by side: the machine this was
written on was too loaded for a fair A/B; `shardfeed bench read` should
settle it.) Why not
multiprocessing.shared_memory: its resource tracker unlinks segments that a
*second* process attached (bpo-38119) and warns at exit; plain files with a
per-loader name prefix are simpler, and ``cleanup`` removes any a killed
worker left behind.

Lifecycle of a segment: worker creates it (O_EXCL) -> main maps it on first
sight and unlinks the name at once (the mapping stays valid) -> dropped when
a larger one replaces it or the loader closes. A worker unlinks the segment it
outgrows (a batch larger than the slot can outgrow it before the main process
ever saw it: the name was otherwise left in /dev/shm by any exit that skipped
the loader's close), and a new loader removes the segments of loaders whose
process is gone (``prune_stale``): a SIGKILL leaves them no other way.
"""

from __future__ import annotations

import glob
import mmap
import os
import pickle
import re
import tempfile
import time

import numpy as np

from shardfeed.formats.staging import pid_alive
from shardfeed.loader.collate import Blob, Strs

_ALIGN = 64
_MIN_SEG = 1 << 20


def shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def new_prefix() -> str:
    return f"shardfeed-{os.getpid()}-{os.urandom(4).hex()}"  # secrets.token_hex's bytes, without its import


def cleanup(prefix: str) -> int:
    """Unlink every segment with this prefix (a killed worker's leftovers)."""
    n = 0
    for path in glob.glob(os.path.join(shm_dir(), prefix + "-*")):
        try:
            os.unlink(path)
            n += 1
        except FileNotFoundError:
            pass
    return n


_SEGMENT = re.compile(r"^shardfeed-(?P<pid>\d+)-[0-9a-f]{8}-w\d+-s\d+-g\d+$")
STALE_S = 10.0  # a live loader's main process maps a new segment within a batch: this old and unmapped, it is a leftover


def prune_stale(now: float | None = None) -> int:
    """Unlink the segments of loaders whose main process is gone (named by its pid), ours only,
    left untouched for ``STALE_S``: what a SIGKILL (or an OOM kill) left behind."""
    root, uid, now = shm_dir(), os.getuid(), time.time() if now is None else now
    try:
        names = os.listdir(root)
    except OSError:
        return 0
    n = 0
    for name in names:
        m = _SEGMENT.match(name)
        if m is None or int(m["pid"]) == os.getpid() or pid_alive(int(m["pid"])):
            continue
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
            if st.st_uid != uid or now - st.st_mtime < STALE_S:
                continue
            os.unlink(path)
            n += 1
        except OSError:
            pass
    return n


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class SlotWriter:
    """Worker side: one growable segment per slot."""

    def __init__(self, prefix: str, worker: int, slots: int):
        self.prefix, self.worker = prefix, worker
        self.segs: list = [None] * slots  # (name, mmap, np view)
        self.gen = 0

    def _ensure(self, slot: int, nbytes: int, keep: int = 0) -> np.ndarray:
        seg = self.segs[slot]
        if seg is not None and len(seg[2]) >= nbytes:
            return seg[2]
        size = max(_MIN_SEG, int(nbytes * 1.25) + mmap.PAGESIZE)
        size = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
        self.gen += 1
        name = f"{self.prefix}-w{self.worker}-s{slot}-g{self.gen}"
        fd = os.open(os.path.join(shm_dir(), name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        view = np.frombuffer(mm, np.uint8)
        if seg is not None:
            if keep:
                view[:keep] = seg[2][:keep]
            _unlink(seg[0])  # the main process saw it (and unlinked it) or never will
        self.segs[slot] = (name, mm, view)
        return view

    def alloc(self, slot: int):
        """An ``alloc(n)`` for BatchReader: the payload goes to the slot's start,
        with room reserved for the columns' arrays after it."""
        def alloc(n: int) -> np.ndarray:
            self._payload = n
            return self._ensure(slot, n + 4096 + n // 8)[:n]
        self._payload = 0
        return alloc

    def pack(self, slot: int, columns) -> dict:
        """The header describing ``columns`` inside the slot (pickled by the pipe)."""
        if not isinstance(columns, dict):
            return {"py": columns}
        seg = self.segs[slot]
        base = seg[2].ctypes.data if seg is not None else 0
        payload = self._payload if seg is not None else 0
        cursor = _align(payload)
        pieces = []  # (offset, array to copy)
        desc = {}

        def put(arr: np.ndarray) -> int:
            nonlocal cursor
            off = cursor
            arr = np.ascontiguousarray(arr).view(np.uint8).reshape(-1)
            pieces.append((off, arr))
            cursor = _align(cursor + arr.nbytes)
            return off

        for name, col in columns.items():
            if isinstance(col, np.ndarray) and col.dtype.kind in "biufc":
                col = np.ascontiguousarray(col)
                desc[name] = ("nd", put(col), col.dtype.str, col.shape)
            elif isinstance(col, Blob):
                addr = col.buf.ctypes.data if col.buf.size else 0
                if seg is not None and col.buf.size and base <= addr and addr + col.buf.size <= base + payload:
                    data_off, data_len = addr - base, col.buf.size  # already in the slot: no copy
                else:
                    data_len = col.buf.size
                    data_off = put(np.ascontiguousarray(col.buf))
                desc[name] = ("blob", data_off, data_len, put(np.ascontiguousarray(col.starts, np.int64)),
                              put(np.ascontiguousarray(col.sizes, np.int64)), len(col), col.text)
            elif isinstance(col, Strs):
                data = np.frombuffer(col.data, np.uint8)
                desc[name] = ("strs", put(data), data.size, len(col))
            elif (isinstance(col, list) and col and all(type(v) is str for v in col)):
                joined = "\0".join(col)
                if joined.count("\0") == len(col) - 1:  # no NUL inside: one decode + split rebuilds it
                    data = np.frombuffer(joined.encode("utf-8"), np.uint8)
                    desc[name] = ("strs", put(data), data.size, len(col))
                else:
                    desc[name] = ("py", col)
            else:
                desc[name] = ("py", col)
        if pieces:
            view = self._ensure(slot, cursor, keep=payload)
            for off, arr in pieces:
                view[off:off + arr.nbytes] = arr
            name = self.segs[slot][0]
        else:
            name = seg[0] if seg is not None else None
        return {"seg": name, "cols": desc}

    def close(self) -> None:
        for seg in self.segs:
            if seg is not None:
                _unlink(seg[0])
        self.segs = [None] * len(self.segs)


def _unlink(name: str) -> None:
    try:
        os.unlink(os.path.join(shm_dir(), name))
    except FileNotFoundError:
        pass  # the main process unlinked it after mapping it


class SlotReader:
    """Main side: maps each worker's segments once; rebuilds columns as views."""

    def __init__(self):
        self._maps: dict[str, np.ndarray] = {}

    def _view(self, name: str) -> np.ndarray:
        view = self._maps.get(name)
        if view is None:
            path = os.path.join(shm_dir(), name)
            fd = os.open(path, os.O_RDWR)
            try:
                mm = mmap.mmap(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
                os.unlink(path)
            view = np.frombuffer(mm, np.uint8)
            self._maps[name] = view
        return view

    def forget(self, name: str) -> None:
        self._maps.pop(name, None)  # unmapped once the last view of it is gone

    def unpack(self, header: dict):
        if "py" in header:
            return header["py"]
        name = header["seg"]
        view = self._view(name) if name is not None else None
        out = {}
        for col, d in header["cols"].items():
            kind = d[0]
            if kind == "nd":
                _, off, dtype, shape = d
                dt = np.dtype(dtype)
                count = int(np.prod(shape, dtype=np.int64))
                out[col] = np.frombuffer(view, dt, count, off).reshape(shape)
            elif kind == "blob":
                _, doff, dlen, soff, zoff, n, text = d
                out[col] = Blob(view[doff:doff + dlen], np.frombuffer(view, np.int64, n, soff),
                                np.frombuffer(view, np.int64, n, zoff), text)
            elif kind == "strs":
                _, off, nbytes, n = d
                out[col] = str(memoryview(view)[off:off + nbytes], "utf-8").split("\0") if n else []
            else:
                out[col] = d[1]
        return out

    def close(self) -> None:
        self._maps.clear()


def dumps(obj) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
