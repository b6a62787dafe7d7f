"""A batch as read: its samples' bytes in one buffer with (start, size)
arrays per field (RawBatch), and the buffers the reads gather into.
"""

from __future__ import annotations

import numpy as np

from shardfeed.formats.base.records import SlotRecord
from shardfeed.formats.errors import ReadError

_ARANGE = np.arange(0, dtype=np.int64)


def _new_buffer(n: int) -> np.ndarray:
    return np.empty(n, np.uint8)


def _arange(n: int) -> np.ndarray:
    """0..n-1, from one cached array (the rows of a batch read in order)."""
    global _ARANGE
    if len(_ARANGE) < n:
        _ARANGE = np.arange(max(n, 2 * len(_ARANGE)), dtype=np.int64)
    return _ARANGE[:n]


class RawBatch(SlotRecord):
    """Undecoded samples of one batch, in the order asked for (minus skips).

    ``fields[name]`` is ``("bytes", starts, sizes)`` into ``buf`` (size -1:
    the sample lacks the field), ``("text", starts, sizes)`` for columnar
    UTF-8 strings, ``("array", values)`` for typed columnar values, or
    ``("objects", values)``: a list of ``bytes`` (None: absent) that the
    gather wrote into directly (into_bytes.py; only when asked for).
    Keys are ``keys`` (a list), or for tar-only batches ``key_blob``: the
    keys as UTF-8 joined by NUL (no key holds one), decoded on first use of
    ``keys`` (a worker passes the blob on without ever building the list).
    """

    # a SlotRecord, not a dataclass: a dataclass compiles its methods at import (issue #24); unhashable, as a dataclass
    __slots__ = ("ids", "key_list", "buf", "fields", "shards", "errors", "bytes_read", "key_blob")
    __hash__ = None

    def __init__(self, ids: np.ndarray, key_list: list | None, buf: np.ndarray, fields: dict, shards: np.ndarray,
                 errors: list[ReadError] | None = None, bytes_read: int = 0, key_blob: bytes | None = None):
        self.ids = ids
        self.key_list = key_list
        self.buf = buf
        self.fields = fields
        self.shards = shards  # shard of each sample, for error messages
        self.errors = [] if errors is None else errors  # samples and shards left out (skip mode)
        self.bytes_read = bytes_read
        self.key_blob = key_blob

    @property
    def keys(self) -> list:
        if self.key_list is None:
            self.key_list = self.key_blob.decode("utf-8").split("\0") if len(self.ids) else []
        return self.key_list

    def __len__(self) -> int:
        return len(self.ids)
