"""Batch reads: many samples of a dataset at once, with few Python objects.

The per-sample readers in readers.py build a dict of ``bytes`` per sample;
every peer library is bound by exactly that kind of per-sample Python work
(PEERS.md). Here a batch's sample ids are grouped by shard and each group is
gathered by one jitted loop straight from the shard's mmap into one
contiguous buffer, sample after sample, each sample's members in member
order. A sample's bytes are therefore one contiguous range, so its xxh3
checksum is one call over that range. Per field we keep two int64 arrays
(start, size) into the buffer; ``-1`` marks a sample lacking the field.

The buffer comes from the caller (``alloc``) so a loader worker can gather
straight into shared memory. Parquet and Arrow shards are read by row group:
typed numeric columns stay numpy arrays, binary and string columns are copied
into the same buffer layout.

Damaged samples are not returned as data: with ``skip=True`` they are left
out of the batch and reported in ``RawBatch.errors``; otherwise ShardError.
"""

from __future__ import annotations

import mmap
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

import numba
import numpy as np
import pyarrow as pa
import xxhash

from shardfeed.formats.errors import ShardError
from shardfeed.formats.readers import ColumnarShardReader, TarShardReader, open_shard

# mmapped pages that were read count in a process's RSS until unmapped; past
# this many bytes read from one shard its mapping is dropped from the page
# tables (MADV_DONTNEED: the page cache keeps the data), so RSS stays flat
# however large the dataset is.
RELEASE_EVERY_BYTES = 64 << 20
MAX_OPEN_SHARDS = 256


@numba.njit(cache=True, nogil=True)
def _sample_bytes(member_start, size, local, out):
    for k in range(local.shape[0]):
        i = local[k]
        s = 0
        for j in range(member_start[i], member_start[i + 1]):
            s += size[j]
        out[k] = s


@numba.njit(cache=True, nogil=True)
def _gather(src, member_start, offset, size, member_field, field_map, local, rows, dst, dst_pos,
            fstart, fsize):
    for k in range(local.shape[0]):
        i = local[k]
        r = rows[k]
        p = dst_pos[r]
        for j in range(member_start[i], member_start[i + 1]):
            o = offset[j]
            s = size[j]
            dst[p:p + s] = src[o:o + s]
            f = field_map[member_field[j]]
            fstart[f, r] = p
            fsize[f, r] = s
            p += s


@numba.njit(cache=True, nogil=True)
def _copy_ranges(src, src_start, sizes, dst, dst_start):
    for k in range(sizes.shape[0]):
        s = sizes[k]
        if s > 0:
            dst[dst_start[k]:dst_start[k] + s] = src[src_start[k]:src_start[k] + s]


@numba.njit(cache=True, nogil=True)
def _parse_ints(buf, starts, sizes, out, ok):
    # ASCII decimal with optional sign and surrounding whitespace, as int().
    for k in range(starts.shape[0]):
        a = starts[k]
        b = a + sizes[k]
        ok[k] = False
        if sizes[k] < 0:
            continue
        while a < b and (buf[a] == 32 or (9 <= buf[a] <= 13)):
            a += 1
        while b > a and (buf[b - 1] == 32 or (9 <= buf[b - 1] <= 13)):
            b -= 1
        neg = False
        if a < b and (buf[a] == 45 or buf[a] == 43):
            neg = buf[a] == 45
            a += 1
        if a >= b or b - a > 18:
            continue
        v = np.int64(0)
        good = True
        for p in range(a, b):
            c = buf[p]
            if c < 48 or c > 57:
                good = False
                break
            v = v * 10 + (c - 48)
        if good:
            out[k] = -v if neg else v
            ok[k] = True


def parse_ints(buf: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decimal ints at ``buf[starts:starts+sizes]`` -> (int64 values, ok mask)."""
    out = np.zeros(len(starts), np.int64)
    ok = np.zeros(len(starts), np.bool_)
    _parse_ints(buf, np.ascontiguousarray(starts, np.int64), np.ascontiguousarray(sizes, np.int64), out, ok)
    return out, ok


@dataclass
class RawBatch:
    """Undecoded samples of one batch, in the order asked for (minus skips).

    ``fields[name]`` is ``("bytes", starts, sizes)`` into ``buf`` (size -1:
    the sample lacks the field), ``("text", starts, sizes)`` for columnar
    UTF-8 strings, or ``("array", values)`` for typed columnar values.
    """

    ids: np.ndarray
    keys: list
    buf: np.ndarray
    fields: dict
    shards: np.ndarray  # shard of each sample, for error messages
    errors: list = field(default_factory=list)  # (shard path, reason) of skipped samples/shards
    bytes_read: int = 0

    def __len__(self) -> int:
        return len(self.ids)


class _TarView:
    """One open tar shard as flat arrays for the jitted gather."""

    def __init__(self, reader: TarShardReader, field_ids: dict):
        self.reader = reader
        self.path = reader.path
        t = reader.table
        self.src = np.frombuffer(reader.data, np.uint8)
        self.member_start, self.offset, self.size = t.member_start, t.offset, t.size
        self.member_field = t.member_field.astype(np.int64)
        self.field_map = np.array([field_ids.setdefault(f, len(field_ids)) for f in t.fields], np.int64)
        self.keys = t.keys
        self.keys_np = np.array(t.keys, dtype=object)  # gathered by numpy, not a Python loop
        self.checksum = t.checksum
        self.since_release = 0

    def release_pages(self) -> None:
        if isinstance(self.reader.data, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
            self.reader.data.madvise(mmap.MADV_DONTNEED)
        self.since_release = 0

    def close(self) -> None:
        self.src = None
        self.reader.close()


class _ColumnarView:
    def __init__(self, reader: ColumnarShardReader):
        self.reader = reader
        self.path = reader.path
        self._group: tuple[int, pa.Table] | None = None

    def rows(self, local: np.ndarray) -> pa.Table:
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


def _binary_parts(col: pa.ChunkedArray | pa.Array):
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


class BatchReader:
    """Reads batches of global sample ids from a DatasetIndex.

    ``open`` maps a shard number to a local path (a cache may supply one);
    shards stay open (LRU, at most ``max_open``). ``skip`` decides what a
    damaged sample or unreadable shard does: raise ShardError, or leave the
    samples out and list the error in ``RawBatch.errors``.
    """

    def __init__(self, index, verify: bool = True, skip: bool = False, max_open: int = MAX_OPEN_SHARDS,
                 path_of: Callable[[int], str] | None = None):
        self.index = index
        self.verify = verify
        self.skip = skip
        self.max_open = max_open
        self.path_of = path_of
        self.field_ids: dict[str, int] = {}
        self._open: OrderedDict[int, object] = OrderedDict()
        self._bad: dict[int, str] = {}  # shards that failed to open (skip mode): reason

    # -- shards ---------------------------------------------------------
    def _view(self, s: int):
        v = self._open.get(s)
        if v is not None:
            self._open.move_to_end(s)
            return v
        if s in self._bad:
            raise ShardError(self.index.path(s), self._bad[s])
        path = self.path_of(s) if self.path_of else None
        try:
            reader = open_shard(self.index, s, path=path, verify=self.verify)
        except ShardError as e:
            self._bad[s] = e.reason
            raise
        v = _TarView(reader, self.field_ids) if isinstance(reader, TarShardReader) else _ColumnarView(reader)
        self._open[s] = v
        while len(self._open) > self.max_open:
            _, old = self._open.popitem(last=False)
            old.close()
        return v

    def close(self) -> None:
        while self._open:
            _, v = self._open.popitem()
            v.close()

    # -- batches --------------------------------------------------------
    def read(self, ids, alloc: Callable[[int], np.ndarray] | None = None) -> RawBatch:
        """The samples ``ids`` (global, any order, repeats allowed) as one RawBatch.

        ``alloc(n)`` must return a writable uint8 array of at least n bytes
        (default: a fresh numpy array); it is called once per read.
        """
        ids = np.ascontiguousarray(ids, np.int64)
        n_total = self.index.num_samples
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= n_total):
            raise IndexError(f"sample ids must lie in 0..{n_total - 1}, got {int(ids.min())}..{int(ids.max())}")
        errors: list = []
        shard, local = self.index.locate(ids)
        keep = np.ones(len(ids), np.bool_)
        groups = self._groups(shard, keep, errors)
        alloc = alloc or (lambda n: np.empty(n, np.uint8))
        while True:
            batch = self._gather(ids, shard, local, keep, groups, alloc, errors)
            if batch is not None:
                return batch
            groups = self._groups(shard, keep, errors)  # samples failed their checksum: read again without them

    def _groups(self, shard, keep, errors):
        """[(view, rows)] per shard present, opening shards (unreadable ones skipped or raised)."""
        out = []
        live = np.flatnonzero(keep)
        if not live.size:
            return out
        sh = shard[live]
        order = np.argsort(sh, kind="stable")
        sh_sorted = sh[order]
        cuts = np.flatnonzero(np.diff(sh_sorted)) + 1
        for rows_idx in np.split(order, cuts):
            s = int(sh[rows_idx[0]])
            rows = live[rows_idx]
            try:
                view = self._view(s)
            except ShardError as e:
                if not self.skip:
                    raise
                errors.append((e.shard, e.reason, len(rows)))
                keep[rows] = False
                continue
            out.append((view, rows))
        return out

    def _gather(self, ids, shard, local, keep, groups, alloc, errors):
        live = np.flatnonzero(keep)
        n = len(live)
        pos_of = np.full(len(ids), -1, np.int64)
        pos_of[live] = np.arange(n)
        sizes = np.zeros(n, np.int64)
        col_tables = []
        for view, rows in groups:
            if isinstance(view, _TarView):
                tmp = np.empty(len(rows), np.int64)
                _sample_bytes(view.member_start, view.size, local[rows], tmp)
                sizes[pos_of[rows]] = tmp
            else:
                try:
                    tbl = view.rows(local[rows])
                except ShardError as e:
                    if not self.skip:
                        raise
                    errors.append((e.shard, e.reason, len(rows)))
                    keep[rows] = False
                    return None
                for name in tbl.column_names:
                    self.field_ids.setdefault(name, len(self.field_ids)) if name != "__key__" else None
                col_tables.append((view, rows, tbl))
                for name in tbl.column_names:
                    col = tbl.column(name)
                    if name != "__key__" and _is_binary(col.type):
                        _, _, sz = _binary_parts(col)
                        sizes[pos_of[rows]] += np.maximum(sz, 0)
        dst_pos = np.zeros(n + 1, np.int64)
        np.cumsum(sizes, out=dst_pos[1:])
        total = int(dst_pos[-1])
        buf = alloc(total)
        nf = len(self.field_ids)
        fstart = np.full((nf, n), -1, np.int64)
        fsize = np.full((nf, n), -1, np.int64)
        keys = np.empty(n, dtype=object)
        typed: dict[str, list] = {}
        text_fields: set[str] = set()
        bad = []
        for view, rows in groups:
            if not isinstance(view, _TarView):
                continue
            loc = local[rows]
            prow = pos_of[rows]
            _gather(view.src, view.member_start, view.offset, view.size, view.member_field, view.field_map, loc,
                    prow, buf, dst_pos, fstart, fsize)
            view.since_release += int(sizes[prow].sum())
            if view.since_release > RELEASE_EVERY_BYTES:
                view.release_pages()
            keys[prow] = view.keys_np[loc]
            if self.verify:
                mv = memoryview(buf)
                h = xxhash.xxh3_64_intdigest
                got = np.array([h(mv[a:b]) for a, b in zip(dst_pos[prow].tolist(), dst_pos[prow + 1].tolist())],
                               np.uint64)
                wrong = np.flatnonzero(got != view.checksum[loc])
                for w in wrong.tolist():
                    bad.append((rows[w], view.path, f"sample {int(loc[w])} ({view.keys[int(loc[w])]!r}) fails its "
                                                    "checksum (bytes damaged on disk)"))
        for view, rows, tbl in col_tables:
            prow = pos_of[rows]
            cursor = dst_pos[prow].copy()
            for name in tbl.column_names:
                col = tbl.column(name)
                if name == "__key__":
                    keys[prow] = np.array(col.to_pylist(), dtype=object)
                    continue
                f = self.field_ids[name]
                if _is_binary(col.type):
                    data, starts, sz = _binary_parts(col)
                    _copy_ranges(data, starts, np.maximum(sz, 0), buf, cursor)
                    fstart[f, prow] = cursor
                    fsize[f, prow] = sz
                    cursor += np.maximum(sz, 0)
                    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
                        text_fields.add(name)
                else:
                    typed.setdefault(name, []).append((prow, col))
        if bad:
            if not self.skip:
                _, path, reason = bad[0]
                raise ShardError(path, reason)
            for row, path, reason in bad:
                keep[row] = False
                errors.append((path, reason, 1))
            return None
        names = {v: k for k, v in self.field_ids.items()}
        fields: dict = {}
        for f in range(nf):
            name = names[f]
            if name in typed:
                fields[name] = ("array", _typed_column(typed[name], n))
            elif (fsize[f] >= 0).any():
                fields[name] = ("text" if name in text_fields else "bytes", fstart[f], fsize[f])
        for name, parts in typed.items():
            if name not in fields:
                fields[name] = ("array", _typed_column(parts, n))
        kept = ids[live]
        return RawBatch(kept, keys.tolist(), buf[:total], fields, shard[live], errors, total)


def _is_binary(t) -> bool:
    return (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t))


def _typed_column(parts, n):
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
