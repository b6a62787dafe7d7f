"""BatchReader's steady-state path: every shard of a batch an open tar shard
and nothing failing, laid out by one jitted call (kernels_batch.tar_layout)
and gathered by another, into scratch arrays kept between reads. Anything
else falls back to the general path in batch.py.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from shardfeed.formats.engine.into_bytes import IntoBytes
from shardfeed.formats.engine.kernels import NO_FADDR
from shardfeed.formats.engine.kernels_batch import DST_POS, KPOS, LOCAL, NROWS, OK, SHARD, SLOT, tar_layout
from shardfeed.formats.engine.raw_batch import RawBatch, _arange
from shardfeed.formats.engine.read_modes import FAULT_AROUND

_NO_XS = np.zeros((2, 4), np.int64)


class SteadyRead:
    """The steady path's methods of BatchReader (a mixin: the state is BatchReader's)."""

    _into: IntoBytes | None = None

    def gather_into_bytes(self, want: Callable[[str], bool] | None,
                          before: Callable[[int], None] | None = None) -> bool:
        """From the next read on, gather the large values of the tar fields whose name ``want``
        accepts straight into ``bytes`` objects (into_bytes.py): ``RawBatch.fields[name]`` is then
        ``("objects", values)``. ``before(nbytes)`` is called before a batch's objects are made.
        None turns it off. False where this Python cannot (the buffer path serves)."""
        self._into = IntoBytes(want, before) if want is not None and IntoBytes.available() else None
        return self._into is not None

    def _plan_into(self, slot, local, rows, n: int, total: int):
        """(faddr, xs, {name: ("objects", values)} or None) for a gather of these tar samples."""
        into = self._into
        if into is None:
            return NO_FADDR, _NO_XS, None
        planned = into.plan(self.shards.table, slot, local, rows, n, self._field_names(), total)
        if planned is None:
            return NO_FADDR, into.xs, None
        return planned[0], into.xs, planned[1]

    def _layout_scratch(self, n: int, nf: int):
        """(work, present, uniq): tar_layout's scratch, reused by every read (reads are never concurrent)."""
        if self._work.shape[1] < n + 1:
            cap = max(n + 1, 2 * self._work.shape[1])
            self._work = np.empty((NROWS, cap), np.int64)
            self._uniq = np.empty(cap, np.int64)
            self._rows = None
        if len(self._present) < nf:
            self._present = np.empty(max(nf, 2 * len(self._present)), np.uint8)
        return self._work, self._present, self._uniq

    def _work_rows(self, n: int) -> tuple:
        """(slot, local, dst_pos, kpos) of a batch of n: views of the work array, kept while n repeats."""
        rows = self._rows
        if rows is None or rows[0] != n:
            w = self._work
            rows = self._rows = (n, w[SLOT, :n], w[LOCAL, :n], w[DST_POS, :n + 1], w[KPOS, :n + 1])
        return rows[1:]

    def _read_open(self, ids, alloc) -> RawBatch | None:
        """The steady state: every shard of the batch is an open tar shard and
        nothing fails; laid out by one jitted call (kernels_batch.tar_layout)
        and gathered by another. None otherwise (an id out of range, a shard
        to open, a columnar shard, any error: the general path then reads the
        batch and raises or skips as it says). No pins: nothing can close a
        file-backed shard during this read (no cache; eviction runs between
        reads); a decompressed shard in memory is never read here, because
        another reader's decompression may reclaim an unpinned one
        (decoded_budget.py)."""
        shards = self.shards
        table = shards.table
        n = len(ids)
        nf = len(self.field_ids)
        work, present, uniq = self._layout_scratch(n, nf)
        fpos = np.empty((2, nf, n), np.int64)
        status, m = tar_layout(self.index.offsets, shards.slot_of, table, ids, work, fpos, present, uniq)
        if status != OK:
            return None
        uniq = uniq[:m].tolist()
        if not self._io_fn:  # copied from mappings: a shard truncated since opened would be SIGBUS
            views = shards.views
            if any(views[s].short() for s in uniq):
                return None
        slot, local, dst_pos, kpos = self._work_rows(n)
        total = int(dst_pos[n])
        faddr, xs, made = self._plan_into(slot, local, _arange(n), n, total)
        buf = alloc(total)  # members sent to objects leave their place here unwritten
        fstart, fsize = fpos[0], fpos[1]
        kbuf = self._key_scratch(int(kpos[n]))
        bad = np.zeros(n, np.bool_)
        hfn = self._hash_fn if self.verify else 0
        nbad, err, _ = self._tar_gather(table, slot, local, _arange(n), buf, dst_pos, fstart, fsize, kbuf, kpos, hfn, bad,
                                  self._io_fn, self._iov, self._junk, faddr, xs)
        if err or nbad or (self.verify and not hfn):
            return None
        shards.use(uniq)
        if not self._io_fn and self.read_mode == "pread":  # fallback copied from the mapping: bound its RSS
            self._mapped += total + FAULT_AROUND * n
        if self._mapped > self.mapped_budget:
            self.release_pages()
        names = self._field_names()
        # the fields some sample has, in field id order (as _fields)
        fields = {names[f]: ("bytes", fstart[f], fsize[f]) for f, has in enumerate(present[:nf].tolist()) if has}
        if made:
            fields.update(made)
        return RawBatch(ids.copy(), None, buf[:total], fields, work[SHARD, :n].copy(), [], total,
                        kbuf[:-1].tobytes())

    def _key_scratch(self, n: int) -> np.ndarray:
        if len(self._kbuf) < n:
            self._kbuf = np.empty(max(n, 2 * len(self._kbuf)), np.uint8)
        return self._kbuf[:n]
