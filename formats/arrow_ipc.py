"""The two Arrow IPC files shardfeed writes itself (index.arrow, .idx sidecars), read without pyarrow.

A fresh process reading a local tar dataset opens one index and a sidecar per shard, and
pyarrow's import alone (~45 ms after torch) was most of its start-up. Their schemas are
fixed (index.py, sidecar.py), so ``read`` takes exactly the layout pyarrow's file writer
gives them: magic, the schema message, dictionary and record batch messages back to back,
the end-of-stream marker, the footer (whose schema and blocks are the ones read). Anything else, damaged or merely laid out otherwise
(another writer, nulls, compression, more batches), it declines (``Declined``) and the
caller reads the file with pyarrow as before, so pyarrow stays the judge of every file this
reader does not take, with its own error messages.

What it takes it checks at least as strictly as ``pa.ipc.open_file(...).read_all()``
followed by ``validate(full=True)``: every flatbuffer offset, vtable and vector lies inside
its message and is aligned (formats/flatbuffer.py); the footer's blocks are exactly the messages there; every buffer lies inside its message body; offsets start at or above 0,
never decrease and end inside their data; dictionary indices lie inside the dictionary;
strings are UTF-8 and no offset splits a character. tests/formats/test_arrow_ipc.py
flips and truncates real files and checks that whatever this reader accepts, pyarrow
accepts with the same values.

Not a library: nanoarrow 0.9's import costs 33-42 ms of CPU after torch here (more than
the whole import budget) and its Python bindings read the IPC stream only, not the file
footer pyarrow checks; arro3-io 0.9 imports in ~4 ms but exposes no buffers of string
columns (``Array.buffer()`` is unimplemented for them), so keys would come out one Python
str at a time.
"""

from __future__ import annotations

import struct

import numpy as np

from shardfeed.formats.flatbuffer import Buf, Declined, Table, tables_at

MAGIC = b"ARROW1"
_V5 = 4  # MetadataVersion.V5, what pyarrow >= 1.0 writes
_SCHEMA, _DICTIONARY, _RECORD_BATCH = 1, 2, 3  # MessageHeader union
_INT, _UTF8, _LIST, _LARGE_LIST = 2, 5, 12, 21  # Type union
_WIDTH = {"int16": 2, "int32": 4, "int64": 8, "uint64": 8}
_CONT = 0xFFFFFFFF


def _metadata(t: Table, i: int) -> dict:
    out = {}
    for kv in t.tables(i, 2):
        k, v = kv.string(0), kv.string(1)
        if k is None or v is None or k in out:
            raise Declined("metadata entry without key or value, or twice")
        out[k] = v
    return out


def _type(field: Table, nested: bool = True) -> tuple:
    """A field's type as a tuple: ("utf8",), ("int64",) ..., ("list", child), ("large_list", child),
    ("dict", id, ("utf8",)). ``nested``: whether it may be a list (a list's child may not: no list of
    lists is one of the project's, and a forged file nesting them deeply would recurse as deep)."""
    kind, t = field.scalar(2, "<B"), field.table(3, 2)
    if t is None:
        raise Declined("field without a type")
    children = field.tables(5, 7)
    if kind == _INT:
        width, signed = t.scalar(0, "<i"), t.scalar(1, "<?", False)
        name = f"{'' if signed else 'u'}int{width}"
        if name not in _WIDTH or children:
            raise Declined(f"integer type {name} is not one of the project's")
        out: tuple = (name,)
    elif kind == _UTF8 and not children and not any(t.slots):
        out = ("utf8",)
    elif kind in (_LIST, _LARGE_LIST) and nested and len(children) == 1 and not any(t.slots):
        c = children[0]  # pyarrow's: a nullable "item" (its name is part of the type, and of the digest)
        if c.string(0) != b"item" or not c.scalar(1, "<?", False) or c._at(4) or c._at(6):
            raise Declined("a list child other than pyarrow's nullable 'item'")
        out = ("list" if kind == _LIST else "large_list", _type(c, False))
    else:
        raise Declined(f"type {kind} is not one of the project's")
    enc = field.table(4, 4)
    if enc is not None:
        index = enc.table(1, 2)
        if index is None or (index.scalar(0, "<i"), index.scalar(1, "<?", False)) != (32, True) \
                or enc.scalar(2, "<?", False) or enc.scalar(3, "<h") or out != ("utf8",):
            raise Declined("dictionary encoding other than int32 indices over strings")
        out = ("dict", enc.scalar(0, "<q"), out)
    return out


_FIELDS_MEMO: dict = {}  # (fields vector's place mod 8, the bytes from there to the end) -> fields
_FIELDS_MEMO_MAX, _FIELDS_TAIL_MAX = 64, 4096


def _schema(s: Table | None) -> tuple[list, dict]:
    if s is None or s.scalar(0, "<h") != 0 or s.vector(3, 8, 8)[1]:
        raise Declined("schema missing, big-endian or with features")
    return _fields(s.b, s._target(1)), _metadata(s, 2)


def _fields(b: Buf, t: int) -> list:
    """The schema's fields, from the vector at ``t``, read inside ``b[t - t % 8:]`` only.

    A flatbuffer builder writes children before their parents, from the end of the buffer down, and
    Arrow builds a schema's fields first: they and their vtables lie above their vector, at the end of
    the footer. Reading them through a buffer that starts at the vector (8-aligned, as the whole) makes
    the fields a function of those bytes alone: a layout that points below the vector is declined (pyarrow
    reads it), and a file whose tail is, byte for byte, one already read has the same fields. Every
    sidecar of a dataset has the same tail (its metadata and blocks lie below), so a fresh process parses
    the fields of its first sidecar only: they were half of a sidecar's parse."""
    if not t:
        return []
    base = t - t % 8
    tail = bytes(b.mv[b.lo + base:b.hi]) if b.n - base <= _FIELDS_TAIL_MAX else None
    got = _FIELDS_MEMO.get((t - base, tail)) if tail is not None else None
    if got is not None:
        return list(got)
    sub = Buf(b.mv, b.lo + base, b.hi)
    fields = []
    for f in tables_at(sub, t - base, 7):
        if f.string(0) is None or f._at(6):
            raise Declined("field without a name, or with metadata")
        fields.append((f.string(0).decode("utf-8", "strict"), f.scalar(1, "<?", False), _type(f)))
    if tail is not None:
        if len(_FIELDS_MEMO) >= _FIELDS_MEMO_MAX:  # bounded: foreign layouts could each add one
            _FIELDS_MEMO.clear()
        _FIELDS_MEMO[(t - base, tail)] = tuple(fields)
    return fields


def _message(mv: memoryview, pos: int, end: int) -> tuple[int, Table, int, int]:
    """(header type, header table, body start, body length) of the encapsulated message at ``pos``."""
    if pos % 8 or pos + 8 > end:
        raise Declined("message outside the file")
    cont, size = struct.unpack_from("<Ii", mv, pos)
    if cont != _CONT or size <= 0 or size % 8 or pos + 8 + size > end:
        raise Declined("bad message prefix")
    m = Buf(mv, pos + 8, pos + 8 + size).root(5)
    kind, body = m.scalar(1, "<B"), m.scalar(3, "<q")
    if m.scalar(0, "<h") != _V5 or m._at(4) or body < 0 or body % 8 or pos + 8 + size + body > end:
        raise Declined("message of another version, with metadata, or a body outside the file")
    header = m.table(2, {_SCHEMA: 4, _DICTIONARY: 3, _RECORD_BATCH: 5}.get(kind, 0))
    if header is None:
        raise Declined("message without a header")
    return kind, header, pos + 8 + size, body


class _Body:
    """One record batch's field nodes and buffers, taken in schema order (Arrow's pre-order)."""

    def __init__(self, mv: memoryview, batch: Table, start: int, size: int):
        if batch._at(3) or batch.vector(4, 8, 8)[1]:
            raise Declined("compressed batch or variadic buffers")
        self.mv, self.start, self.size = mv, start, size
        self.length = batch.scalar(0, "<q")
        self.nodes, self.buffers = batch.structs(1, "<qq"), batch.structs(2, "<qq")
        self.n = self.b = 0

    def done(self) -> bool:
        return self.n == len(self.nodes) and self.b == len(self.buffers)

    def node(self) -> int:
        """The next array's length (no nulls, so no validity buffer: what pyarrow writes then)."""
        if self.n >= len(self.nodes):
            raise Declined("fewer field nodes than the schema needs")
        length, nulls = self.nodes[self.n]
        self.n += 1
        if length < 0 or nulls != 0 or self.buffer()[1] != 0:
            raise Declined("a negative length, nulls or a validity buffer")
        return length

    def buffer(self, need: int = 0) -> tuple[int, int]:
        """(position in the file, length) of the next buffer, which must hold ``need`` bytes."""
        if self.b >= len(self.buffers):
            raise Declined("fewer buffers than the schema needs")
        off, length = self.buffers[self.b]
        self.b += 1
        if off < 0 or length < need or off % 8 or off + length > self.size:
            raise Declined("a buffer outside its body or shorter than its values")
        return self.start + off, length

    def array(self, dtype: str, count: int) -> np.ndarray:
        pos, _ = self.buffer(count * _WIDTH[dtype])
        return np.frombuffer(self.mv, dtype, count, pos)

    def offsets(self, length: int, wide: bool) -> np.ndarray:
        pos, size = self.buffer()
        if not length and not size:  # an empty array's offsets may be left out
            return np.zeros(1, np.int64)
        dtype = "int64" if wide else "int32"
        if size < (length + 1) * _WIDTH[dtype]:
            raise Declined("an offsets buffer shorter than its array")
        offs = np.frombuffer(self.mv, dtype, length + 1, pos).astype(np.int64)
        if offs[0] < 0 or bool((offs[1:] < offs[:-1]).any()):
            raise Declined("offsets below 0 or decreasing")
        return offs

    def utf8(self, length: int) -> tuple[np.ndarray, np.ndarray]:
        offs = self.offsets(length, False)
        pos, size = self.buffer(int(offs[-1]))
        data = np.frombuffer(self.mv, np.uint8, size, pos)
        lo, hi = int(offs[0]), int(offs[-1])
        try:
            bytes(data[lo:hi]).decode("utf-8", "strict")
        except UnicodeDecodeError as e:
            raise Declined("strings that are not UTF-8") from e
        inner = offs[1:-1][offs[1:-1] < hi]  # each string starts on a character: no continuation byte there
        if len(inner) and bool(((data[inner] & 0xC0) == 0x80).any()):
            raise Declined("a string offset inside a UTF-8 character")
        return offs, data


def _column(body: _Body, t: tuple, length: int, dictionaries: dict):
    if body.node() != length:
        raise Declined("a column whose length is not the batch's")
    if t[0] == "utf8":
        return body.utf8(length)
    if t[0] in _WIDTH:
        return body.array(t[0], length)
    if t[0] in ("list", "large_list"):
        offs = body.offsets(length, t[0] == "large_list")
        child = body.node()
        if child < offs[-1] or t[1][0] not in _WIDTH:
            raise Declined("list offsets past their values, or values of another type")
        return offs, body.array(t[1][0], child)
    values = dictionaries.get(t[1])
    if values is None:
        raise Declined("a dictionary column without its dictionary")
    idx = body.array("int32", length)
    if length and (int(idx.min()) < 0 or int(idx.max()) >= len(values)):
        raise Declined("dictionary indices outside the dictionary")
    return [values[i] for i in idx.tolist()]


def read(raw: bytes) -> tuple[list, dict, dict]:
    """(fields, metadata, columns) of an Arrow IPC file shardfeed wrote: fields as (name, nullable,
    type tuple); columns by name: utf8 -> (int64 offsets, uint8 data), int -> array, list -> (int64
    offsets, values array), dictionary -> list of str. Arrays view ``raw``. Declined if not taken."""
    try:
        return _read(raw)
    except (ValueError, IndexError, OverflowError, TypeError, struct.error) as e:  # a check this file lacks
        raise Declined(f"{type(e).__name__}: {e}") from e


def _read(raw: bytes) -> tuple[list, dict, dict]:
    mv, end = memoryview(raw), len(raw)
    if end < 32 or raw[:8] != MAGIC + b"\0\0" or raw[-6:] != MAGIC:
        raise Declined("no Arrow file magic")
    flen = struct.unpack_from("<i", mv, end - 10)[0]
    fstart = end - 10 - flen
    if flen <= 0 or fstart < 16 or fstart % 8:
        raise Declined("bad footer length")
    footer = Buf(mv, fstart, end - 10).root(5)
    if footer.scalar(0, "<h") != _V5 or footer._at(4):
        raise Declined("footer of another version or with metadata")
    fields, meta = _schema(footer.table(1, 4))
    # the stream's own schema message: where it ends is checked; its fields are not read, as pyarrow's
    # file reader does not read them either (the footer's copy is the one both use)
    kind, _, body_at, body_len = _message(mv, 8, fstart)
    if kind != _SCHEMA or body_len:
        raise Declined("no schema message first")
    pos = body_at
    dictionaries: dict = {}
    want = {t[1] for _, _, t in fields if t[0] == "dict"}
    batches = []
    for blocks, expect in ((footer.structs(2, "<qi4xq"), _DICTIONARY), (footer.structs(3, "<qi4xq"), _RECORD_BATCH)):
        for offset, meta_len, blen in blocks:
            kind, header, body_at, body_len = _message(mv, pos, fstart)
            if (offset, meta_len, blen, kind) != (pos, body_at - pos, body_len, expect):
                raise Declined("the footer's blocks disagree with the messages")
            if kind == _DICTIONARY:
                did = header.scalar(0, "<q")
                data = header.table(1, 5)
                if did not in want or did in dictionaries or header.scalar(2, "<?", False) or data is None:
                    raise Declined("an unexpected, repeated or delta dictionary")
                body = _Body(mv, data, body_at, body_len)
                offs, blob = _column(body, ("utf8",), body.length, {})
                if not body.done():
                    raise Declined("more nodes or buffers than the dictionary needs")
                dictionaries[did] = [bytes(blob[offs[i]:offs[i + 1]]).decode() for i in range(len(offs) - 1)]
            else:
                batches.append((header, body_at, body_len))
            pos = body_at + body_len
    if len(batches) != 1 or set(dictionaries) != want:
        raise Declined("not exactly one record batch, or a dictionary missing")
    if pos + 8 != fstart or struct.unpack_from("<Ii", mv, pos) != (_CONT, 0):
        raise Declined("no end-of-stream marker right before the footer")
    body = _Body(mv, *batches[0])
    if body.length < 0:
        raise Declined("negative batch length")
    columns = {}
    for name, _, t in fields:
        if name in columns:
            raise Declined(f"column {name!r} twice")
        columns[name] = _column(body, t, body.length, dictionaries)
    if not body.done():
        raise Declined("more nodes or buffers than the schema needs")
    return fields, meta, columns


def type_name(t: tuple) -> str:
    """pyarrow's ``str()`` of the type (table_digest hashes it); a dictionary column is hashed decoded."""
    if t[0] in ("list", "large_list"):
        return f"{t[0]}<item: {type_name(t[1])}>"
    return {"utf8": "string", "dict": "string"}.get(t[0], t[0])
