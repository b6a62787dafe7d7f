"""The steady read: a batch whose shards are all open tar shards, nothing failing, laid out by one
jitted call (kernels_batch.tar_layout) and gathered by another, into scratch arrays kept between reads.

A BatchReader holds one (``BatchReader._steady``) and tries it first; where it returns None the
reader's general path (batch.py) reads the batch and raises or skips as it says.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from shardfeed.formats.engine.into_bytes import IntoBytes, gather_plan
from shardfeed.formats.engine.kernels_batch import DST_POS, KPOS, LOCAL, NROWS, OK, SHARD, SLOT, tar_layout
from shardfeed.formats.engine.open_shards import OpenShards
from shardfeed.formats.engine.raw_batch import RawBatch, _arange
from shardfeed.formats.engine.split_gather import SplitGather


class SteadyRead:
    """One reader's steady path and its scratch (reads are never concurrent). It reads the reader's open
    shards with the reader's gather; the rest (field names, the ``bytes`` objects plan, how shards are
    read and checked) each read is handed."""

    def __init__(self, shards: OpenShards, gather: SplitGather, iov: np.ndarray, junk: np.ndarray):
        self.shards = shards
        self.gather = gather
        self.iov, self.junk = iov, junk
        self.work = np.empty((NROWS, 0), np.int64)  # tar_layout's rows (scratch)
        self.rows: tuple | None = None  # views of it (work_rows)
        self.uniq = np.empty(0, np.int64)
        self.present = np.empty(0, np.uint8)
        self.kbuf = np.empty(0, np.uint8)

    def scratch(self, n: int, nf: int):
        """(work, present, uniq): tar_layout's scratch for n samples and nf fields, grown as needed."""
        if self.work.shape[1] < n + 1:
            cap = max(n + 1, 2 * self.work.shape[1])
            self.work = np.empty((NROWS, cap), np.int64)
            self.uniq = np.empty(cap, np.int64)
            self.rows = None
        if len(self.present) < nf:
            self.present = np.empty(max(nf, 2 * len(self.present)), np.uint8)
        return self.work, self.present, self.uniq

    def work_rows(self, n: int) -> tuple:
        """(slot, local, dst_pos, kpos) of a batch of n: views of the work array, kept while n repeats."""
        rows = self.rows
        if rows is None or rows[0] != n:
            w = self.work
            rows = self.rows = (n, w[SLOT, :n], w[LOCAL, :n], w[DST_POS, :n + 1], w[KPOS, :n + 1])
        return rows[1:]

    def key_scratch(self, n: int) -> np.ndarray:
        if len(self.kbuf) < n:
            self.kbuf = np.empty(max(n, 2 * len(self.kbuf)), np.uint8)
        return self.kbuf[:n]

    def read(self, ids, alloc: Callable[[int], np.ndarray], names: list, into: IntoBytes | None, io_fn: int,
             hash_fn: int, verify: bool) -> RawBatch | None:
        """The batch of ``ids``, or None (an id out of range, a shard to open, a columnar shard, any
        error). ``names``: field id -> name, every field id there. ``io_fn``/``hash_fn``: preadv and
        native xxh3 (0: copy from the mapping, check from Python). No pins: nothing can close a
        file-backed shard during this read (no cache; eviction runs between reads); a decompressed
        shard in memory is never read here, because another reader's decompression may reclaim an
        unpinned one (decoded_budget.py)."""
        shards = self.shards
        table = shards.table
        n = len(ids)
        nf = len(names)
        work, present, uniq = self.scratch(n, nf)
        fpos = np.empty((2, nf, n), np.int64)
        status, m = tar_layout(shards.index.offsets, shards.slot_of, table, ids, work, fpos, present, uniq)
        if status != OK:
            return None
        uniq = uniq[:m].tolist()
        if not io_fn:  # copied from mappings: a shard truncated since opened would be SIGBUS
            views = shards.views
            if any(views[s].short() for s in uniq):
                return None
        slot, local, dst_pos, kpos = self.work_rows(n)
        total = int(dst_pos[n])
        faddr, xs, made = gather_plan(into, table, slot, local, _arange(n), n, names, total)
        buf = alloc(total)  # members sent to objects leave their place here unwritten
        fstart, fsize = fpos[0], fpos[1]
        kbuf = self.key_scratch(int(kpos[n]))
        bad = np.zeros(n, np.bool_)
        hfn = hash_fn if verify else 0
        nbad, err, _ = self.gather(table, slot, local, _arange(n), buf, dst_pos, fstart, fsize, kbuf, kpos, hfn, bad,
                                   io_fn, self.iov, self.junk, faddr, xs)
        if err or nbad or (verify and not hfn):
            return None
        shards.use(uniq)
        # the fields some sample has, in field id order (as BatchReader._fields)
        fields = {names[f]: ("bytes", fstart[f], fsize[f]) for f, has in enumerate(present[:nf].tolist()) if has}
        if made:
            fields.update(made)
        return RawBatch(ids.copy(), None, buf[:total], fields, work[SHARD, :n].copy(), [], total,
                        kbuf[:-1].tobytes())
