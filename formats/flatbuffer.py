"""Bounds- and alignment-checked reads of an untrusted flatbuffer (the metadata of an Arrow IPC file).

Every offset, vtable and vector is checked to lie inside the buffer and to be aligned before it is
read, and a table may not hold fields past those its reader knows; anything else raises ``Declined``
(formats/arrow_ipc.py then leaves the file to pyarrow). Each read is one ``Struct.unpack_from`` behind
one bounds test: a sidecar's footer takes about 150 of them, paid by every sidecar a fresh process
opens (16 at its first ``global`` batch in ``shardfeed bench startup``).
"""

from __future__ import annotations

import struct


class Declined(Exception):
    """Not a file ``arrow_ipc.read`` takes: damaged, or laid out in a way it does not read (pyarrow reads it
    instead)."""


_S = {f: struct.Struct(f) for f in ("<I", "<i", "<H", "<h", "<B", "<?", "<q", "<HH")}
_SMALL_SLOTS = frozenset((1, 2, 3))  # a field offset inside the table's own 4-byte vtable offset


class Buf:
    """Bounds- and alignment-checked little-endian reads of one flatbuffer (``mv[lo:hi]``)."""

    __slots__ = ("mv", "lo", "hi", "n")

    def __init__(self, mv: memoryview, lo: int, hi: int):
        self.mv, self.lo, self.hi, self.n = mv, lo, hi, hi - lo

    def get(self, fmt: str, pos: int, size: int):
        st = _S[fmt]
        if pos < 0 or pos + size > self.n or pos % size:
            raise Declined(f"flatbuffer read of {size} bytes at {pos} outside or misaligned")
        return st.unpack_from(self.mv, self.lo + pos)[0]

    def root(self, known: int) -> Table:
        return Table(self, self.get("<I", 0, 4), known)


class Table:
    """A flatbuffer table whose fields past the first ``known`` must be absent (unknown: declined)."""

    __slots__ = ("b", "pos", "slots")

    def __init__(self, b: Buf, pos: int, known: int):
        self.b, self.pos = b, pos
        vt = pos - b.get("<i", pos, 4)
        if vt < 0 or vt + 4 > b.n or vt % 2:
            raise Declined(f"flatbuffer read of 4 bytes at {vt} outside or misaligned")
        vsize, tsize = _S["<HH"].unpack_from(b.mv, b.lo + vt)
        if vsize < 4 or vsize % 2 or tsize < 4 or pos + tsize > b.n or vt + vsize > b.n:
            raise Declined("bad flatbuffer vtable")
        slots = self.slots = struct.unpack_from(f"<{(vsize - 4) // 2}H", b.mv, b.lo + vt + 4)
        # no field outside the table (each offset is 0, absent, or in 4..tsize-1), none past ``known``
        if slots and (max(slots) >= tsize or not _SMALL_SLOTS.isdisjoint(slots) or any(slots[known:])):
            raise Declined("flatbuffer table has a field outside it or one this reader does not know")

    def _at(self, i: int) -> int:
        slots = self.slots
        return self.pos + slots[i] if i < len(slots) and slots[i] else 0

    def scalar(self, i: int, fmt: str, default=0):
        p = self._at(i)
        return self.b.get(fmt, p, _S[fmt].size) if p else default

    def _target(self, i: int) -> int:
        p = self._at(i)
        return p + self.b.get("<I", p, 4) if p else 0

    def table(self, i: int, known: int) -> Table | None:
        t = self._target(i)
        return Table(self.b, t, known) if t else None

    def vector(self, i: int, width: int, align: int = 4) -> tuple[int, int]:
        """(first element's position, element count); (0, 0) when absent."""
        t = self._target(i)
        if not t:
            return 0, 0
        return vector_at(self.b, t, width, align)

    def tables(self, i: int, known: int) -> list[Table]:
        t = self._target(i)
        return tables_at(self.b, t, known) if t else []

    def string(self, i: int) -> bytes | None:
        t = self._target(i)
        if not t:
            return None
        start, n = vector_at(self.b, t, 1, 4)
        b = self.b
        if start + n >= b.n or b.mv[b.lo + start + n] != 0:
            raise Declined("flatbuffer string without its terminating NUL")
        return bytes(b.mv[b.lo + start:b.lo + start + n])

    def structs(self, i: int, fmt: str) -> list[tuple]:
        size = struct.calcsize(fmt)
        start, n = self.vector(i, size, 8)
        return list(struct.iter_unpack(fmt, self.b.mv[self.b.lo + start:self.b.lo + start + size * n]))


def vector_at(b: Buf, t: int, width: int, align: int) -> tuple[int, int]:
    """(first element's position, element count) of the vector at ``t``."""
    n = b.get("<I", t, 4)
    if (n and (t + 4) % align) or t + 4 + n * width > b.n:  # an empty one: any place
        raise Declined("flatbuffer vector outside its buffer or misaligned")
    return t + 4, n


def tables_at(b: Buf, t: int, known: int) -> list[Table]:
    """The tables of the vector of table offsets at ``t``."""
    start, n = vector_at(b, t, 4, 4)
    # the vector's n offsets read at once: it lies inside the buffer, 4-aligned (checked)
    return [Table(b, start + 4 * k + off, known)
            for k, off in enumerate(struct.unpack_from(f"<{n}I", b.mv, b.lo + start))] if n else []
