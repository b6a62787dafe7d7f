"""Parquet and Arrow shards in a batch: rows taken by row group, laid out like tar samples.

Binary and string columns are copied into the batch buffer after the
sample's other bytes, so a field is ``(starts, sizes)`` into that buffer as
for tar (size -1: null); string columns are marked ``"text"``. Typed columns
(numbers, lists...) stay values: one numpy array per field when possible.

Decoded Parquet row groups are kept (row_group_cache.py), least recently used
first out, under the process-wide budget for decoded shard bytes held in
memory (decoded_budget.py, shared with compressed tars). Why: under ``global``
order each batch takes a row or two from each of many row groups; decoding a
row group per batch made Parquet ~20x slower than Arrow IPC, whose record
batches are views of a mapping and cost nothing to keep. With the groups
kept, a Parquet shard is decoded once while it fits in the budget.

Each decoded group is worked out once (``Decoded``: keys, binary columns as
data/starts/sizes, typed columns as numpy) and a batch's rows are copied from
it straight into the batch buffer (``Rows``, ``place``): no Arrow ``take``
per shard per batch, which kept Parquet and Arrow at ~0.65x of tar under
``global`` (now ~1.2x, measured side by side; README "Format and order
pairings").
"""

from __future__ import annotations

import itertools

import numpy as np

from shardfeed.formats.base.lazy import lazy_module
from shardfeed.formats.engine import row_group_share
from shardfeed.formats.engine.kernels import copy_ranges
from shardfeed.formats.engine.row_group_cache import DECODED
from shardfeed.formats.readers import ColumnarShardReader
from shardfeed.formats.sidecar import as_numpy

pa = lazy_module("pyarrow", globals(), "pa")  # Parquet and Arrow shards only: a tar read never imports it

KEY = "__key__"
_RUN = 8  # rows in a contiguous run taken as stored order (the chance of a random one: nil)


_view_ids = itertools.count()


class Decoded:
    """One decoded row group (Parquet) or record batch (Arrow), with what a
    batch needs of it worked out once: keys as an object array, binary and
    string columns as (data, starts, sizes) arrays, typed columns as numpy
    where that is exact. A batch then indexes these arrays and copies its
    rows' bytes straight into the batch buffer: no Arrow ``take`` (a copy of
    every byte taken, ~30 us a call) and no per-batch column unpacking."""

    def __init__(self, table: pa.Table):
        self.table = table
        self.nbytes = int(table.nbytes)
        self.names = table.column_names
        self.keys = np.array(table.column(KEY).to_pylist(), dtype=object) if KEY in self.names else None
        self.binary: dict[str, tuple] = {}
        self.typed: dict[str, np.ndarray | None] = {}
        for name in self.names:
            if name == KEY:
                continue
            col = table.column(name)
            if is_binary(col.type):
                text = pa.types.is_string(col.type) or pa.types.is_large_string(col.type)
                self.binary[name] = (*binary_parts(col), text)
            else:
                # numpy only when it is what a column of any subset of rows
                # gives (no nulls: those make ints floats); else take per batch
                try:
                    values = as_numpy(col) if col.null_count == 0 else None
                except (pa.ArrowException, TypeError, ValueError):
                    values = None
                self.typed[name] = values if values is not None and values.dtype != object else None

    def typed_rows(self, name: str, rows: np.ndarray):
        values = self.typed[name]
        return values[rows] if values is not None else self.table.column(name).take(_indices(rows))


def _indices(rows: np.ndarray) -> pa.Array:
    # pa.array(ndarray) imports pandas (~0.3 s of a fresh process's first batch)
    rows = np.ascontiguousarray(rows, np.int64)
    return pa.Array.from_buffers(pa.int64(), len(rows), [None, pa.py_buffer(rows)])


class _Listed(list):
    def to_pylist(self) -> list:
        return list(self)


class Rows:
    """Rows of one shard for a batch, without copying them: segments of
    (decoded group, rows in it, their positions among these rows). Offers what
    batch.py asks of a table (``column_names``, ``num_rows``,
    ``column(KEY).to_pylist()``); ``row_bytes`` and ``place`` read the segments."""

    def __init__(self, names: list[str], segments: list[tuple[Decoded, np.ndarray, np.ndarray]], n: int):
        self.column_names = names
        self.segments = segments
        self.num_rows = n

    def column(self, name: str):
        if name == KEY:
            out = np.empty(self.num_rows, dtype=object)
            for dec, rows, sel in self.segments:
                out[sel] = dec.keys[rows]
            return _Listed(out.tolist())
        parts = [(sel, dec.table.column(name).take(_indices(rows))) for dec, rows, sel in self.segments]
        order = np.argsort(np.concatenate([sel for sel, _ in parts]), kind="stable")
        return pa.chunked_array([c for _, c in parts]).take(_indices(order))


class ColumnarView:
    """One open columnar shard. Arrow record batches are views of the mapping
    (kept by the reader), their Decoded kept here (a few arrays per batch);
    decoded Parquet row groups are kept in DECODED under the budget."""

    def __init__(self, reader: ColumnarShardReader):
        self.reader = reader
        self.path = reader.path
        self._id = next(_view_ids)
        self._parquet = getattr(reader, "_pf", None) is not None
        self._mapped: dict[int, Decoded] = {}
        self._behind = 0  # groups below this one were dropped by a stored-order run
        self.registered = False  # its fields have field ids (one schema per file: registered once)

    def decoded(self, g: int, wait: bool = True) -> Decoded | None:
        """Group ``g`` decoded (and kept); None (only when not ``wait``) while a sibling worker decodes it."""
        got = DECODED.get(self._id, g) if self._parquet else self._mapped.get(g)
        if got is not None:
            return got
        share = row_group_share.active() if self._parquet else None
        name = share.name(self.path, g) if share is not None else None
        if name is not None:
            table = share.load(name, lambda: self.reader._group(g), wait)
            if table is None:
                return None
        else:
            table = self.reader._group(g)  # validated in full there: Arrow follows offsets blindly
        dec = Decoded(table if isinstance(table, pa.Table) else pa.Table.from_batches([table]))
        if self._parquet:
            DECODED.put(self._id, g, dec, self.path)  # not kept if the budget is held by shards in use
        else:
            self._mapped[g] = dec
        return dec

    def missing_groups(self, local: np.ndarray) -> list[int]:
        """The groups the rows ``local`` need that are not decoded yet (row_group_threads.py)."""
        start = self.reader.group_start
        if (DECODED.kept.get(self._id, 0) if self._parquet else len(self._mapped)) == len(start) - 1:
            return []  # every group held: the steady case, one look a shard
        groups = np.flatnonzero(np.bincount(np.searchsorted(start, local, side="right") - 1, minlength=len(start) - 1))
        if self._parquet:
            return [g for g in groups.tolist() if DECODED.get(self._id, g) is None]
        return [g for g in groups.tolist() if g not in self._mapped]

    def locate(self, local: np.ndarray) -> tuple[list[Decoded], np.ndarray, np.ndarray]:
        """The rows ``local`` (indexes in the shard, any order, repeats allowed) as (their
        decoded groups, ascending; each row's group among them; its row in that group)."""
        start = self.reader.group_start
        n = len(local)
        if n and local[-1] - local[0] == n - 1 and bool(np.all(np.diff(local) == 1)):
            g0 = int(np.searchsorted(start, local[0], side="right") - 1)  # a stored-order run
            g1 = int(np.searchsorted(start, local[-1], side="right") - 1)
            if self._parquet and n >= _RUN:
                # a stored-order run past these groups: a loader worker that takes
                # every other batch never reads a group's last rows itself, so
                # without this it kept every group it decoded (fresh memory each).
                # Not for a short run: a global batch's row or two of a shard
                for g in range(self._behind, g0):
                    DECODED.drop_group(self._id, g)
                self._behind = g0
            decs = []
            for g in range(g0, g1 + 1):
                decs.append(self.decoded(g))
                if self._parquet and local[-1] >= start[g + 1] - 1:
                    # read to its end in stored order: next needed next epoch, so
                    # give its memory back now (the allocator reuses it at once)
                    DECODED.drop_group(self._id, g)
            groups = np.searchsorted(start, local, side="right") - 1 if g1 > g0 else np.full(n, g0, np.int64)
            return decs, groups - g0, local - start[groups]
        groups = np.searchsorted(start, local, side="right") - 1
        # the groups' ranks by counting, not np.unique's sort (~40 us a call, once per shard per batch)
        present = np.bincount(groups, minlength=len(start) - 1) > 0
        uniq = np.flatnonzero(present)
        rank = np.cumsum(present) - 1
        # groups a sibling worker is decoding (row_group_share.py) are taken last, once it is done
        decs = [self.decoded(g, wait=False) for g in uniq.tolist()]
        for k, dec in enumerate(decs):
            if dec is None:
                decs[k] = self.decoded(int(uniq[k]))
        return decs, rank[groups], local - start[groups]

    def rows(self, local: np.ndarray) -> Rows:
        """The rows ``local`` (indexes in the shard, any order, repeats allowed), in that order."""
        return rows_of(*self.locate(local))

    def close(self) -> None:
        DECODED.drop(self._id)
        self._mapped = {}
        self.reader.close()


def rows_of(decs: list[Decoded], gi: np.ndarray, grow: np.ndarray) -> Rows:
    """Rows from ColumnarView.locate's answer."""
    n = len(gi)
    segments = []
    for k, dec in enumerate(decs):
        sel = np.flatnonzero(gi == k) if len(decs) > 1 else np.arange(n)
        segments.append((dec, grow[sel], sel))
    names = segments[0][0].names if segments else [KEY]
    return Rows(names, segments, n)


def is_binary(t) -> bool:
    return (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t))


def binary_parts(col: pa.ChunkedArray | pa.Array):
    """(data uint8, starts int64, sizes int64) of a binary/string column; size -1 for nulls."""
    if isinstance(col, pa.ChunkedArray):
        # combine_chunks copies even a single chunk (a 25 MB row group of
        # 100 KiB values: 60-120 ms of fresh pages): take that chunk as it is
        arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    else:
        arr = col
    # a string column's buffers are laid out as binary's: read them as they are
    # (a cast would import pyarrow.compute, ~0.1 s of a fresh process's first batch)
    valid, offs, data = arr.buffers()
    odt = np.int64 if pa.types.is_large_binary(arr.type) or pa.types.is_large_string(arr.type) else np.int32
    offsets = np.frombuffer(offs, odt)[arr.offset:arr.offset + len(arr) + 1].astype(np.int64)
    data_np = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    sizes = np.diff(offsets)
    if arr.null_count:
        bits = np.unpackbits(np.frombuffer(valid, np.uint8), bitorder="little")
        sizes[bits[arr.offset:arr.offset + len(arr)] == 0] = -1
    return data_np, offsets[:-1], sizes


def typed_column(parts, n, absent=None):
    """Typed columnar values in batch order: a numpy array when possible, else
    an object array. Positions no part covers (a sample whose shard lacks the
    field) hold None, as a null in the column does; ``absent(positions)`` is
    called with them first, to refuse those that hold the field in another form."""
    arrays = []
    for prow, col in parts:
        if isinstance(col, np.ndarray):
            arrays.append((prow, col))
            continue
        try:
            arrays.append((prow, as_numpy(col)))
        except (pa.ArrowException, TypeError, ValueError):
            arrays.append((prow, np.array(col.to_pylist(), dtype=object)))
    covered = np.zeros(n, np.bool_)
    for prow, _ in arrays:
        covered[prow] = True
    missing = np.flatnonzero(~covered)
    if len(missing) and absent is not None:
        absent(missing)
    if len(missing) or not arrays:
        out = np.full(n, None, dtype=object)  # never np.empty: unwritten slots would be stale memory
    else:
        out = np.empty(n, dtype=np.result_type(*[a.dtype for _, a in arrays]))
    for prow, a in arrays:
        out[prow] = a
    return out


def register_fields(tbl: pa.Table, field_ids: dict) -> None:
    """Give each field of ``tbl`` (the key aside) a field id, in column order."""
    for name in tbl.column_names:
        if name != KEY:
            field_ids.setdefault(name, len(field_ids))


def row_bytes(tbl: pa.Table | Rows) -> np.ndarray:
    """Bytes each row of ``tbl`` takes in the batch buffer: its binary and string values."""
    out = np.zeros(tbl.num_rows, np.int64)
    if isinstance(tbl, Rows):
        for dec, rows, sel in tbl.segments:
            for _, _, sizes, _ in dec.binary.values():
                out[sel] += np.maximum(sizes[rows], 0)
        return out
    for name in tbl.column_names:
        col = tbl.column(name)
        if name != KEY and is_binary(col.type):
            out += np.maximum(binary_parts(col)[2], 0)
    return out


def place(tbl: pa.Table | Rows, prow: np.ndarray, buf: np.ndarray, cursor: np.ndarray, fstart: np.ndarray,
          fsize: np.ndarray, field_ids: dict, typed: dict, text_fields: set) -> None:
    """Copy ``tbl``'s binary and string values (row r at batch position
    ``prow[r]``) into ``buf`` from ``cursor[r]`` on, recording them in
    ``fstart``/``fsize``; typed columns are listed in ``typed[name]`` as
    (positions, column) for typed_column, string fields named in ``text_fields``."""
    if isinstance(tbl, Rows):
        _place_rows(tbl, prow, buf, cursor, fstart, fsize, field_ids, typed, text_fields)
        return
    for name in tbl.column_names:
        if name == KEY:
            continue
        col = tbl.column(name)
        f = field_ids[name]
        if is_binary(col.type):
            data, starts, sz = binary_parts(col)
            copy_ranges(data, starts, np.maximum(sz, 0), buf, cursor)
            fstart[f, prow] = cursor
            fsize[f, prow] = sz
            cursor += np.maximum(sz, 0)
            if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
                text_fields.add(name)
        else:
            typed.setdefault(name, []).append((prow, col))


def _place_rows(tbl: Rows, prow, buf, cursor, fstart, fsize, field_ids, typed, text_fields) -> None:
    """``place`` for Rows: each segment's bytes copied from its decoded group
    straight into the buffer, field after field in column order as for a table."""
    for name in tbl.column_names:
        if name == KEY:
            continue
        f = field_ids[name]
        for dec, rows, sel in tbl.segments:
            if name in dec.binary:
                data, starts, sizes, text = dec.binary[name]
                sz = sizes[rows]
                width = np.maximum(sz, 0)
                at = cursor[sel]
                copy_ranges(data, starts[rows], width, buf, at)
                fstart[f, prow[sel]] = at
                fsize[f, prow[sel]] = sz
                cursor[sel] = at + width
                if text:
                    text_fields.add(name)
            else:
                typed.setdefault(name, []).append((prow[sel], dec.typed_rows(name, rows)))
