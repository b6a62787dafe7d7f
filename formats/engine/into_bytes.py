"""A batch's large byte fields gathered straight into the ``bytes`` objects handed out.

Why: the default form of an undecoded field is one ``bytes`` per sample. Read
into the batch buffer first, a 100 KiB sample's payload was moved three
times: the kernel's copy from the page cache into the buffer, the checksum
read, and the copy into its ``bytes`` (about a third of a batch's time at 0
workers). Here the gather (kernels.tar_gather) writes each such member
straight into a fresh ``bytes`` object, and the checksum reads it there.

How: ``PyBytes_FromStringAndSize(NULL, n)`` makes a ``bytes`` whose contents
may be written until it is shared (CPython's C-API documentation of
``PyBytes_AsString``); its data lie at a fixed offset from the object,
``bytes.__basicsize__ - 1``, checked at first use against
``PyBytes_AsString``. A sample's checksum covers all its members in member
order, so a sample whose members lie apart (the payload in its object, the
rest in the buffer) is hashed with xxh3's streaming functions, which give the
same value (native.stream_hash). The objects of a batch are handed out only
after every sample of it passed; they are never written again.

Only the process that hands the values out can do this (a worker's values
cross in shared memory and are copied there), so the Loader asks for it at
``num_workers=0`` with ``bytes_as="bytes"`` (BatchMaker.gather_into_bytes),
and only for fields whose values in a batch are large (``MIN_MEAN_BYTES``): a
``bytes`` made by a C call from Python costs more than a copy of a small one.
Not CPython, or no streaming xxh3: never used, the buffer path serves.
"""

from __future__ import annotations

import ctypes
import sys
import weakref
from collections.abc import Callable
from itertools import repeat

import numpy as np

from shardfeed.formats.compiler.native import stream_hash
from shardfeed.formats.engine.kernels import NO_FADDR, member_sizes

MIN_MEAN_BYTES = 16 << 10  # a field's mean value size in a batch from which its values are gathered into bytes

_API: tuple | None = None


def bytes_api() -> tuple:
    """(new, offset): ``new(None, n)`` -> an unshared, uninitialised bytes of n bytes, whose data
    lie at ``id(obj) + offset``; () where that cannot be relied on."""
    global _API
    if _API is None:
        _API = _find_api()
    return _API


def _find_api() -> tuple:
    if sys.implementation.name != "cpython":
        return ()
    try:
        # prototypes of our own: setting restype on ctypes.pythonapi's shared attributes could clash
        new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_ssize_t)(
            ("PyBytes_FromStringAndSize", ctypes.pythonapi))
        data = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object)(("PyBytes_AsString", ctypes.pythonapi))
    except (AttributeError, OSError):
        return ()
    off = bytes.__basicsize__ - 1
    for n in (2, 333, 1 << 17):
        b = new(None, n)
        if type(b) is not bytes or len(b) != n or data(b) - id(b) != off:
            return ()
    return new, off


class IntoBytes:
    """Which fields of a batch go straight into ``bytes`` objects, and those objects (one reader's)."""

    def __init__(self, want: Callable[[str], bool], before: Callable[[int], None] | None = None):
        fns = stream_hash()
        api = bytes_api()
        if not fns or not api:
            raise RuntimeError("no streaming xxh3 or no bytes C-API here: use IntoBytes.available() first")
        self.want = want
        self.before = before  # told the bytes about to be made (the Loader keeps freed heap for them)
        self._new, self._off = api
        reset, update, digest, create, free = fns
        make = ctypes.CFUNCTYPE(ctypes.c_void_p)(create)
        states = [make(), make()]  # the reading thread's and split_gather's helper's
        if not all(states):
            raise MemoryError("XXH3_createState failed")
        weakref.finalize(self, _free, free, states)
        self.xs = np.array([[reset, update, digest, s] for s in states], np.int64)
        self._mask = np.zeros(0, np.uint8)

    @staticmethod
    def available() -> bool:
        return bool(stream_hash()) and bool(bytes_api())

    def _wanted(self, names: list) -> np.ndarray:
        # field ids only grow (batch.py): extended, never rebuilt
        m = self._mask
        if len(m) < len(names):
            m = self._mask = np.concatenate([m, np.array([bool(self.want(x)) for x in names[len(m):]], np.uint8)])
        return m

    def plan(self, table, slot, local, rows, n: int, names: list, total: int):
        """(faddr for kernels.tar_gather, {name: ("objects", values)}) for the batch's tar samples
        (``rows``: their rows among the batch's ``n``), or None when no field qualifies."""
        if n == 0 or total < MIN_MEAN_BYTES * n:
            return None  # no field of the batch can average that much
        mask = self._wanted(names)
        if not mask.any():
            return None
        sizes = np.full((len(names), n), -1, np.int64)
        member_sizes(table, slot, local, rows, mask, sizes)
        chosen = []
        for f in np.flatnonzero(mask).tolist():
            sz = sizes[f]
            present = sz >= 0
            count = int(np.count_nonzero(present))
            if count and int(sz[present].sum()) >= MIN_MEAN_BYTES * count:
                chosen.append((f, present, count))
        if not chosen:
            return None
        if self.before is not None:
            self.before(sum(int(sizes[f][p].sum()) for f, p, _ in chosen))
        faddr = np.zeros((2, len(names), n), np.int64)
        made = {}
        new, off = self._new, self._off
        for f, present, count in chosen:
            sz = sizes[f]
            if count == n:
                values = list(map(new, repeat(None, n), sz.tolist()))
                faddr[0, f] = np.fromiter(map(id, values), np.int64, n) + off
                faddr[1, f] = sz
            else:
                at = np.flatnonzero(present)
                objs = list(map(new, repeat(None, count), sz[at].tolist()))
                faddr[0, f, at] = np.fromiter(map(id, objs), np.int64, count) + off
                faddr[1, f, at] = sz[at]
                values = [None] * n
                for r, b in zip(at.tolist(), objs):
                    values[r] = b
            made[names[f]] = ("objects", values)
        return faddr, made


_NO_XS = np.zeros((2, 4), np.int64)


def gather_plan(into: IntoBytes | None, table, slot, local, rows, n: int, names: list, total: int):
    """(faddr, xs, {name: ("objects", values)} or None): what kernels.tar_gather is handed for these tar
    samples, whether or not ``into`` sends some of their fields into ``bytes`` objects."""
    if into is None:
        return NO_FADDR, _NO_XS, None
    planned = into.plan(table, slot, local, rows, n, names, total)
    if planned is None:
        return NO_FADDR, into.xs, None
    return planned[0], into.xs, planned[1]


def _free(free: int, states: list) -> None:
    fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(free)
    for s in states:
        fn(s)
