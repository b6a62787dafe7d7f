"""Parquet and Arrow shards in a batch: rows taken by row group, laid out like tar samples.

Binary and string columns are copied into the batch buffer after the
sample's other bytes, so a field is ``(starts, sizes)`` into that buffer as
for tar (size -1: null); string columns are marked ``"text"``. Typed columns
(numbers, lists...) stay values: one numpy array per field when possible.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from shardfeed.formats.kernels import copy_ranges
from shardfeed.formats.readers import ColumnarShardReader

KEY = "__key__"


class ColumnarView:
    """One open columnar shard; keeps the last row group it decoded."""

    def __init__(self, reader: ColumnarShardReader):
        self.reader = reader
        self.path = reader.path
        self._group: tuple[int, pa.Table] | None = None

    def rows(self, local: np.ndarray) -> pa.Table:
        """The rows ``local`` (indexes in the shard, any order, repeats allowed), in that order."""
        r = self.reader
        groups = np.searchsorted(r.group_start, local, side="right") - 1
        parts = []
        order = []
        for g in np.unique(groups).tolist():
            sel = np.flatnonzero(groups == g)
            if self._group is None or self._group[0] != g:
                got = r._group(g)  # validated in full there: Arrow follows offsets blindly
                self._group = (g, got if isinstance(got, pa.Table) else pa.Table.from_batches([got]))
            parts.append(self._group[1].take(pa.array(local[sel] - r.group_start[g])))
            order.append(sel)
        tbl = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        inv = np.empty(len(local), np.int64)
        inv[np.concatenate(order)] = np.arange(len(local))
        return tbl.take(pa.array(inv)) if len(parts) > 1 else tbl

    def close(self) -> None:
        self._group = None
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
