"""Parquet and Arrow shards in a batch: rows taken by row group, laid out like tar samples.

Binary and string columns are copied into the batch buffer after the
sample's other bytes, so a field is ``(starts, sizes)`` into that buffer as
for tar (size -1: null); string columns are marked ``"text"``. Typed columns
(numbers, lists...) stay values: one numpy array per field when possible.

Decoded Parquet row groups are kept (``DecodedGroups``), least recently used
first out, under the process-wide budget for decoded shard bytes held in
memory (decompressed.py, shared with compressed tars). Why: under ``global``
order each batch takes a row or two from each of many row groups; decoding a
row group per batch made Parquet ~20x slower than Arrow IPC, whose record
batches are views of a mapping and cost nothing to keep. With the groups
kept, a Parquet shard is decoded once while it fits in the budget.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict

import numpy as np
import pyarrow as pa

from shardfeed.formats import decompressed
from shardfeed.formats.errors import ShardError
from shardfeed.formats.kernels import copy_ranges
from shardfeed.formats.readers import ColumnarShardReader

KEY = "__key__"


class DecodedGroups:
    """Decoded Parquet row groups of every open shard, LRU, counted against
    decompressed.py's budget (which calls ``reclaim`` when it is short)."""

    def __init__(self):
        self._lock = threading.RLock()
        self._groups: OrderedDict[tuple[int, int], tuple[pa.Table, int]] = OrderedDict()

    def get(self, view: int, g: int) -> pa.Table | None:
        with self._lock:
            got = self._groups.get((view, g))
            if got is None:
                return None
            self._groups.move_to_end((view, g))
            return got[0]

    def put(self, view: int, g: int, table: pa.Table, path: str) -> None:
        # acquire may call reclaim (which takes our lock) while holding the
        # budget's lock: never call it with our lock held
        try:
            nbytes = decompressed.acquire(max(int(table.nbytes), 1), path)
        except ShardError:
            return  # the budget is held by shards in use: decode this group again when next needed
        with self._lock:
            old = self._groups.pop((view, g), None)
            self._groups[(view, g)] = (table, nbytes)
        if old is not None:
            decompressed.release(old[1])

    def reclaim(self, nbytes: int) -> None:
        freed = []
        with self._lock:
            while self._groups and nbytes > 0:
                _, (_, n) = self._groups.popitem(last=False)
                freed.append(n)
                nbytes -= n
        for n in freed:
            decompressed.release(n)

    def drop(self, view: int) -> None:
        with self._lock:
            gone = [k for k in self._groups if k[0] == view]
            freed = [self._groups.pop(k)[1] for k in gone]
        for n in freed:
            decompressed.release(n)

    def nbytes(self) -> int:
        with self._lock:
            return sum(n for _, n in self._groups.values())


DECODED = DecodedGroups()
decompressed.add_reclaimer(DECODED.reclaim)
_view_ids = itertools.count()
_WHOLE = -1  # DECODED's group number for a whole shard


class ColumnarView:
    """One open columnar shard. Arrow record batches are views of the mapping
    (kept by the reader); decoded Parquet row groups are kept in DECODED."""

    def __init__(self, reader: ColumnarShardReader):
        self.reader = reader
        self.path = reader.path
        self._id = next(_view_ids)
        self._parquet = getattr(reader, "_pf", None) is not None

    def _table(self, g: int) -> pa.Table:
        if self._parquet:
            got = DECODED.get(self._id, g)
            if got is not None:
                return got
        batch = self.reader._group(g)  # validated in full there: Arrow follows offsets blindly
        tbl = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        if self._parquet:
            DECODED.put(self._id, g, tbl, self.path)
        return tbl

    def _whole(self) -> pa.Table | None:
        """The whole Parquet shard as one table of single chunks (a take costs
        ~30 us a call: one per shard per batch instead of one per row group),
        built once a batch needs rows of several of its groups (random order);
        None when it does not fit in the budget."""
        got = DECODED.get(self._id, _WHOLE)
        if got is not None:
            return got
        n = len(self.reader.group_start) - 1
        whole = pa.concat_tables([self._table(g) for g in range(n)]).combine_chunks()
        DECODED.drop(self._id)
        DECODED.put(self._id, _WHOLE, whole, self.path)
        return whole if DECODED.get(self._id, _WHOLE) is not None else None

    def rows(self, local: np.ndarray) -> pa.Table:
        """The rows ``local`` (indexes in the shard, any order, repeats allowed), in that order."""
        r = self.reader
        groups = np.searchsorted(r.group_start, local, side="right") - 1
        if self._parquet and len(local) > 1 and groups.min() != groups.max():
            whole = self._whole()
            if whole is not None:
                return whole.take(pa.array(local))
        parts = []
        order = []
        for g in np.unique(groups).tolist():
            sel = np.flatnonzero(groups == g)
            parts.append(self._table(g).take(pa.array(local[sel] - r.group_start[g])))
            order.append(sel)
        tbl = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        inv = np.empty(len(local), np.int64)
        inv[np.concatenate(order)] = np.arange(len(local))
        return tbl.take(pa.array(inv)) if len(parts) > 1 else tbl

    def close(self) -> None:
        DECODED.drop(self._id)
        self.reader.close()


def is_binary(t) -> bool:
    return (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t))


def binary_parts(col: pa.ChunkedArray | pa.Array):
    """(data uint8, starts int64, sizes int64) of a binary/string column; size -1 for nulls."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        arr = arr.cast(pa.large_binary() if pa.types.is_large_string(arr.type) else pa.binary())
    _, offs, data = arr.buffers()
    odt = np.int64 if pa.types.is_large_binary(arr.type) else np.int32
    offsets = np.frombuffer(offs, odt)[arr.offset:arr.offset + len(arr) + 1].astype(np.int64)
    data_np = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    sizes = np.diff(offsets)
    if arr.null_count:
        sizes[np.asarray(arr.is_null())] = -1
    return data_np, offsets[:-1], sizes


def typed_column(parts, n):
    """Typed columnar values in batch order: a numpy array when possible, else a list."""
    arrays = []
    for prow, col in parts:
        try:
            arrays.append((prow, col.to_numpy()))
        except (pa.ArrowException, TypeError, ValueError):
            arrays.append((prow, np.array(col.to_pylist(), dtype=object)))
    dtype = np.result_type(*[a.dtype for _, a in arrays]) if arrays else np.int64
    out = np.empty(n, dtype=dtype)
    for prow, a in arrays:
        out[prow] = a
    return out


def register_fields(tbl: pa.Table, field_ids: dict) -> None:
    """Give each field of ``tbl`` (the key aside) a field id, in column order."""
    for name in tbl.column_names:
        if name != KEY:
            field_ids.setdefault(name, len(field_ids))


def row_bytes(tbl: pa.Table) -> np.ndarray:
    """Bytes each row of ``tbl`` takes in the batch buffer: its binary and string values."""
    out = np.zeros(tbl.num_rows, np.int64)
    for name in tbl.column_names:
        col = tbl.column(name)
        if name != KEY and is_binary(col.type):
            out += np.maximum(binary_parts(col)[2], 0)
    return out


def place(tbl: pa.Table, prow: np.ndarray, buf: np.ndarray, cursor: np.ndarray, fstart: np.ndarray,
          fsize: np.ndarray, field_ids: dict, typed: dict, text_fields: set) -> None:
    """Copy ``tbl``'s binary and string values (row r at batch position
    ``prow[r]``) into ``buf`` from ``cursor[r]`` on, recording them in
    ``fstart``/``fsize``; typed columns are listed in ``typed[name]`` as
    (positions, column) for typed_column, string fields named in ``text_fields``."""
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
