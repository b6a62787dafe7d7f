"""A shard's sample keys as one UTF-8 blob plus offsets, decoded only when asked.

Opening a tar shard used to turn its sidecar's key column into a list of
``str`` (one Python object per sample) and then encode every key back into
the blob the batch gather copies keys from (open_shards.TarView): about
1.5 us per sample, a fifth of a 2 KiB pass at 0 workers. The sidecar's
Arrow string column already *is* that blob (UTF-8, validated on read):
``Keys`` keeps it, and a key becomes a ``str`` only when it is indexed or
iterated (the per-sample readers, key lookup, tools).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class Keys(Sequence):
    """A read-only sequence of ``str`` over ``data[offsets[i]:offsets[i+1]]`` (UTF-8)."""

    __slots__ = ("data", "offsets", "_list")

    def __init__(self, data: np.ndarray, offsets: np.ndarray):
        self.data = data  # uint8
        self.offsets = offsets  # int64, len = keys + 1, offsets[0] == 0
        self._list: list[str] | None = None

    @classmethod
    def from_arrow(cls, arr) -> Keys:
        """The keys of a pyarrow string array without nulls (validated: its offsets lie in its data)."""
        bufs = arr.buffers()
        offs = np.frombuffer(bufs[1], np.int32, count=len(arr) + 1, offset=arr.offset * 4).astype(np.int64) \
            if len(arr) else np.zeros(1, np.int64)
        lo, hi = int(offs[0]), int(offs[-1])
        # copied: the gather reads the blob by address, so it must not be a mapped file's pages
        data = np.frombuffer(bufs[2], np.uint8)[lo:hi].copy() if hi > lo else np.zeros(0, np.uint8)
        return cls(data, offs - lo)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):
        if self._list is not None:
            return self._list[i]
        if isinstance(i, slice):
            return self.tolist()[i]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"key {i} out of range for {n} keys")
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return str(self.data[a:b], "utf-8")

    def tolist(self) -> list[str]:
        """All keys as a list of str (decoded once, then kept)."""
        if self._list is None:
            raw = self.data.tobytes()
            o = self.offsets.tolist()
            self._list = [str(raw[a:b], "utf-8") for a, b in zip(o[:-1], o[1:])]
        return self._list

    def __iter__(self):
        return iter(self.tolist())

    def __eq__(self, other) -> bool:
        if isinstance(other, Keys):
            return np.array_equal(self.offsets, other.offsets) and np.array_equal(self.data, other.data)
        if isinstance(other, (list, tuple)):
            return self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # compared by value like a list, so not hashable either

    def __repr__(self) -> str:
        return f"Keys({len(self)} keys)"


def key_blob(keys) -> tuple[np.ndarray, np.ndarray]:
    """(UTF-8 bytes, int64 offsets of len(keys) + 1) of ``keys``, a Keys or a list of str."""
    if isinstance(keys, Keys):
        return keys.data, keys.offsets
    enc = [k.encode("utf-8") for k in keys]
    off = np.zeros(len(enc) + 1, np.int64)
    np.cumsum([len(k) for k in enc], out=off[1:])
    return (np.frombuffer(b"".join(enc), np.uint8) if enc else np.zeros(0, np.uint8)), off
