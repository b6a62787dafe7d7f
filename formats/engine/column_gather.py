"""A batch's Parquet and Arrow rows placed by two jitted calls, whatever their row groups.

Why: under ``global`` order a batch of 256 takes a row or a few from each of
dozens of row groups, and placing them group by group (columns.Rows and
``place``: a dozen numpy calls and a kernel call per group per batch) cost
more than the tar gather of the same samples: Parquet global ran at ~0.4x of
tar global's steady rate with 32 row groups of 1,024 rows, and fell further
with more groups. Here each decoded group carries one row of addresses
(``Decoded``'s binary columns as data / starts / sizes, its fixed-width typed
columns, its keys), cached on it, and a batch's columnar samples are sized,
then copied and keyed, by one call each over all of them: the same buffer
layout, fields, keys and typed values as the group-by-group path.

Batches this does not cover keep the group-by-group path (``ColumnGather.of``
returns None): a typed column with nulls or values numpy cannot hold, a typed
column whose dtype differs between the batch's groups, keys that are not
non-null strings free of NUL (a key blob is NUL-separated, as for tar).
"""

from __future__ import annotations

import numpy as np

from shardfeed.formats.compiler.jit import njit
from shardfeed.formats.compiler.native import copy, load_i64
from shardfeed.formats.engine.columns import KEY, Decoded, binary_parts

# A decoded group's row of addresses: a head, then per binary column (in
# column order: a sample's bytes are laid out in that order) BIN_W entries,
# then per fixed-width typed column TYPED_W entries.
NB, NT, NROWS, KDATA, KSTART, KSIZE, KLEN, HEAD = range(8)
B_FID, B_DATA, B_START, B_SIZE, B_LEN, BIN_W = range(6)
T_FID, T_DATA, T_WIDTH, TYPED_W = range(4)


@njit(nogil=True)
def column_sizes(table, gi, row, sizes, ksizes):
    """Payload bytes (binary columns) and key bytes of each sample; -1, or the first sample out of range."""
    for k in range(gi.shape[0]):
        g = gi[k]
        r = row[k]
        if g < 0 or g >= table.shape[0] or r < 0 or r >= table[g, NROWS]:
            return k
        t = 0
        for j in range(table[g, NB]):
            s = load_i64(table[g, HEAD + j * BIN_W + B_SIZE], r)
            if s > 0:
                t += s
        sizes[k] = t
        ksizes[k] = load_i64(table[g, KSIZE], r)
    return -1


@njit(nogil=True)
def column_gather(table, gi, row, prow, dst, dst_pos, fstart, fsize, kbuf, kpos, tdst):
    """Copy each sample's binary values into ``dst`` from ``dst_pos[prow[k]]`` on (column
    order), its typed values to ``tdst[field]`` (an address) at ``prow[k]``, its key + NUL
    to ``kbuf`` at ``kpos[prow[k]]``. -1, or the first sample whose entries point outside
    their buffers (never expected: the groups were validated in full)."""
    dbase, dlen = dst.ctypes.data, dst.shape[0]
    kbase, klen = kbuf.ctypes.data, kbuf.shape[0]
    nf = fstart.shape[0]
    for k in range(gi.shape[0]):
        g = gi[k]
        r = row[k]
        p = prow[k]
        cur = dst_pos[p]
        nb = table[g, NB]
        for j in range(nb):
            c = HEAD + j * BIN_W
            f = table[g, c + B_FID]
            a = load_i64(table[g, c + B_START], r)
            s = load_i64(table[g, c + B_SIZE], r)
            if f < 0 or f >= nf:
                return k
            if s > 0:
                if a < 0 or a + s > table[g, c + B_LEN] or cur + s > dlen:
                    return k
                copy(dbase + cur, table[g, c + B_DATA] + a, s)
            fstart[f, p] = cur
            fsize[f, p] = s
            if s > 0:
                cur += s
        for j in range(table[g, NT]):
            c = HEAD + nb * BIN_W + j * TYPED_W
            f = table[g, c + T_FID]
            w = table[g, c + T_WIDTH]
            if f < 0 or f >= tdst.shape[0] or tdst[f] == 0:
                return k
            copy(tdst[f] + p * w, table[g, c + T_DATA] + r * w, w)
        ka = load_i64(table[g, KSTART], r)
        ks = load_i64(table[g, KSIZE], r)
        q = kpos[p]
        if ka < 0 or ks < 0 or ka + ks > table[g, KLEN] or q + ks + 1 > klen:
            return k
        copy(kbase + q, table[g, KDATA] + ka, ks)
        kbuf[q + ks] = 0
    return -1


class _Row:
    """A decoded group's address row (``row``), the arrays it points into (kept
    alive with it), its typed columns' dtypes and its text fields; or, for a
    group the kernels cannot take, ``row`` None."""

    __slots__ = ("row", "keep", "dtypes", "text")

    def __init__(self, dec: Decoded, field_ids: dict):
        self.row = None
        self.keep: list = []
        self.dtypes: dict[str, np.dtype] = {}
        self.text = tuple(name for name, parts in dec.binary.items() if parts[3])
        if dec.keys is None:
            return
        kcol = dec.table.column(KEY)
        if kcol.null_count or not _is_string(kcol.type):
            return
        kdata, kstart, ksize = binary_parts(kcol)
        if len(ksize) and np.count_nonzero(kdata[int(kstart[0]):int(kstart[-1] + ksize[-1])]) != int(ksize.sum()):
            return  # a NUL in some key: the blob could not be split back
        head = [0] * HEAD
        bins, typed = [], []
        for name in dec.names:
            if name in dec.binary:
                data, starts, sizes, _ = dec.binary[name]
                starts, sizes = np.ascontiguousarray(starts, np.int64), np.ascontiguousarray(sizes, np.int64)
                self.keep += [data, starts, sizes]
                bins += [field_ids[name], _addr(data), starts.ctypes.data, sizes.ctypes.data, len(data)]
            elif name in dec.typed:
                values = dec.typed[name]
                if values is None or not values.flags.c_contiguous or values.dtype.hasobject:
                    return
                self.keep.append(values)
                self.dtypes[name] = values.dtype
                typed += [field_ids[name], _addr(values), values.dtype.itemsize]
        kstart, ksize = np.ascontiguousarray(kstart, np.int64), np.ascontiguousarray(ksize, np.int64)
        self.keep += [kdata, kstart, ksize]
        head[NB], head[NT], head[NROWS] = len(bins) // BIN_W, len(typed) // TYPED_W, len(ksize)
        head[KDATA], head[KSTART], head[KSIZE], head[KLEN] = _addr(kdata), kstart.ctypes.data, ksize.ctypes.data, \
            len(kdata)
        self.row = np.array(head + bins + typed, np.int64)


def _addr(a: np.ndarray) -> int:
    return a.ctypes.data if a.size else 0


def _is_string(t) -> bool:
    import pyarrow as pa

    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _row_of(dec: Decoded, field_ids: dict) -> _Row:
    # worked out once per decoded group: field ids only grow, so its fields' ids never change
    got = getattr(dec, "_gather_row", None)
    if got is None:
        got = dec._gather_row = _Row(dec, field_ids)
    return got


class ColumnGather:
    """The columnar samples of one batch: ``prow`` (their batch positions),
    ``gi`` (their group among ``rows``), ``row`` (their row in it), and the
    groups' address table."""

    def __init__(self, rows: list[_Row], gi, row, prow):
        self.rows = rows
        self.gi = gi
        self.row = row
        self.prow = prow
        widths = {len(r.row) for r in rows}
        if len(widths) == 1:
            self.table = np.stack([r.row for r in rows])
        else:
            self.table = np.zeros((len(rows), max(widths)), np.int64)
            for i, r in enumerate(rows):
                self.table[i, :len(r.row)] = r.row
        dtypes: dict[str, np.dtype] = {}
        for r in rows:
            dtypes.update(r.dtypes)
        self.dtypes = dtypes

    @classmethod
    def of(cls, located, pos_of, field_ids: dict) -> ColumnGather | None:
        """From ``located``: [(rows of the batch, decoded groups, group of each, row in it)]
        per columnar shard; None when some group needs the group-by-group path."""
        rows: list[_Row] = []
        gis, grows, prows = [], [], []
        dtypes: dict[str, np.dtype] = {}
        for batch_rows, decs, gi, grow in located:
            base = len(rows)
            for dec in decs:
                r = _row_of(dec, field_ids)
                if r.row is None:
                    return None
                for name, dt in r.dtypes.items():
                    if dtypes.setdefault(name, dt) != dt:
                        return None  # one typed column, two dtypes: typed_column's promotion
                rows.append(r)
            gis.append(gi + base if base else gi)
            grows.append(grow)
            prows.append(pos_of[batch_rows])
        if not rows:
            return None
        one = len(located) == 1
        cat = (lambda parts: np.ascontiguousarray(parts[0], np.int64)) if one else (
            lambda parts: np.concatenate(parts).astype(np.int64, copy=False))
        return cls(rows, cat(gis), cat(grows), cat(prows))

    def sizes(self) -> tuple[np.ndarray, np.ndarray]:
        """(payload bytes, key bytes) of each columnar sample, in ``prow`` order."""
        n = len(self.gi)
        sizes, ksizes = np.zeros(n, np.int64), np.zeros(n, np.int64)
        k = column_sizes(self.table, self.gi, self.row, sizes, ksizes)
        if k >= 0:
            raise IndexError(f"columnar sample {k} of the batch lies outside its row group")
        return sizes, ksizes

    def place(self, n: int, buf, dst_pos, fstart, fsize, ksizes, field_ids: dict, typed: dict,
              text_fields: set) -> bytes:
        """Copy the samples into ``buf`` (batch of ``n``), fill ``typed`` and
        ``text_fields`` as columns.place does; returns the batch's keys as UTF-8
        joined by NUL, empty where a position is not columnar."""
        tdst = np.zeros(len(field_ids), np.int64)
        outs = {}
        for name, dt in self.dtypes.items():
            outs[name] = out = np.empty(n, dt)
            tdst[field_ids[name]] = _addr(out)
        for r in self.rows:
            text_fields.update(r.text)
        klen = np.zeros(n, np.int64)
        klen[self.prow] = ksizes
        kpos = np.zeros(n + 1, np.int64)
        np.cumsum(klen + 1, out=kpos[1:])
        kbuf = np.zeros(int(kpos[-1]), np.uint8)  # zeros: NULs at positions not columnar
        k = column_gather(self.table, self.gi, self.row, self.prow, buf, dst_pos, fstart, fsize, kbuf, kpos, tdst)
        if k >= 0:
            raise IndexError(f"columnar sample {k} of the batch points outside its row group's buffers")
        for name, out in outs.items():
            typed[name] = [self._written(name, n, out)]
        return kbuf[:-1].tobytes()

    def _written(self, name: str, n: int, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(positions, values) of ``name`` the kernel wrote: only the rows of
        groups that hold it, so the rest of ``out`` (never written) is never read."""
        has = np.array([name in r.dtypes for r in self.rows], np.bool_)
        pos = self.prow if has.all() else self.prow[has[self.gi]]
        if len(pos) == n:
            return _all(n), out
        return pos, out[pos]


def _all(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64)
