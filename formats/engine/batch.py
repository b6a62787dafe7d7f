"""Batch reads: many samples of a dataset at once, with few Python objects.

The per-sample readers in readers.py build a dict of ``bytes`` per sample;
every peer library is bound by exactly that kind of per-sample Python work
(PEERS.md). Here all tar samples of a batch, whatever their shards, are
gathered by one jitted call (``kernels.tar_gather``) into one contiguous
buffer, sample after sample, each sample's members in member order, read
with preadv from the page cache (see read_modes.py). A sample's bytes are
therefore one contiguous range, so its xxh3 checksum is one C call over that
range, made inside the same loop. Per field we keep two int64 arrays (start,
size) into the buffer; ``-1`` marks a sample lacking the field.

The buffer comes from the caller (``alloc``) so a loader worker can gather
straight into shared memory. Parquet and Arrow shards are read by row group:
typed numeric columns stay numpy arrays, binary and string columns are copied
into the same buffer layout (columns.py).

Damaged samples are not returned as data: with ``skip=True`` they are left
out of the batch and reported in ``RawBatch.errors`` (ReadError records);
otherwise ShardError. This module is that skip-and-retry loop; the jitted
loops are in kernels.py, the open shards in open_shards.py, the steady path
(every shard open, nothing failing) in steady_read.py, RawBatch in raw_batch.py:
parts a BatchReader holds, each with its own state.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import xxhash

from shardfeed.formats.base.lazy import lazy_module
from shardfeed.formats.compiler.native import hash_fn, preadv_fn
from shardfeed.formats.engine.into_bytes import IntoBytes, gather_plan
from shardfeed.formats.engine.kernels import parse_ints, tar_sizes, warm
from shardfeed.formats.engine.kernels_batch import tar_layout
from shardfeed.formats.engine.open_shards import MAX_OPEN_SHARDS, OpenShards, TarView
from shardfeed.formats.engine.raw_batch import RawBatch, _new_buffer
from shardfeed.formats.engine.read_modes import FAULT_AROUND, MAPPED_BUDGET_BYTES, READ_MODES, check_read_mode
from shardfeed.formats.engine.split_gather import SplitGather
from shardfeed.formats.engine.steady_read import SteadyRead
from shardfeed.formats.errors import ReadError, ShardError

columns = lazy_module("shardfeed.formats.engine.columns", globals(), "columns")  # columnar shards only (issue #24)

__all__ = ["BatchReader", "FAULT_AROUND", "MAPPED_BUDGET_BYTES", "MAX_OPEN_SHARDS", "READ_MODES", "RawBatch",
           "ReadError", "check_read_mode", "parse_ints"]

_MAX_IOV = 512  # under IOV_MAX (1024 on Linux)
_JUNK_BYTES = 64 << 10


class BatchReader:
    """Reads batches of global sample ids from a DatasetIndex.

    ``path_of`` maps a shard number to a local path (a cache may supply one)
    and ``release(s)`` is called once per ``path_of(s)`` when that file is
    closed (open_shards.py); shards stay open (LRU, at most ``max_open`` between reads, see
    open_shards.py; the shards of a batch are pinned while it is read).
    ``skip`` decides what a damaged sample or unreadable shard does: raise
    ShardError, or leave the samples out and list a ReadError in
    ``RawBatch.errors``. ``update_index`` takes a grown index (new shards
    after the old ones) between reads.

    ``read_mode`` says how plain tar shards are read: ``"pread"`` (default)
    with preadv into the batch buffer, RSS flat however much is read;
    ``"mmap"`` by copying from the shard's mapping, kept mapped while the
    shard is open: faster for small samples, but the page-cache pages read
    count in RSS, up to the size of the ``max_open`` shards open at once.
    Checksums are verified the same way in both modes. Limitation of a
    mapping (the mmap mode and the no-preadv fallback): each shard's size
    is checked against its sidecar before every batch, and a shard found
    short is an error (or skipped whole under skip), but a shard truncated
    *during* a batch's copy raises SIGBUS in the process; pread mode has
    no such window.
    """

    def __init__(self, index, verify: bool = True, skip: bool = False, max_open: int = MAX_OPEN_SHARDS,
                 path_of: Callable[[int], str] | None = None, mapped_budget: int = MAPPED_BUDGET_BYTES,
                 read_mode: str = "pread", release: Callable[[int], None] | None = None):
        self.read_mode = check_read_mode(read_mode)
        self.verify = verify
        self.skip = skip
        self.mapped_budget = mapped_budget
        self.field_ids: dict[str, int] = {}
        self._names: list[str] = []  # field id -> name
        self.shards = OpenShards(index, verify=verify, max_open=max_open, path_of=path_of, field_ids=self.field_ids,
                                  release=release)
        self._hash_fn = hash_fn() if verify else 0
        self._io_fn = preadv_fn() if read_mode == "pread" else 0
        self._iov = np.zeros((_MAX_IOV, 2), np.int64)  # struct iovec {void *base; size_t len}
        self._junk = np.empty(_JUNK_BYTES, np.uint8)  # tar headers and padding between members read at once
        self._mapped = 0  # estimated bytes mapped since the last release
        self._tar_gather = SplitGather(self._iov, self._junk)  # one call unless allowed threads (split_gather.py)
        self._steady = SteadyRead(self.shards, self._tar_gather, self._iov, self._junk)
        self._into: IntoBytes | None = None  # fields gathered into bytes objects (gather_into_bytes)

    def allow_threads(self, n: int) -> None:
        """Let a batch's gather use up to ``n`` threads (2: split when it pays, see
        split_gather.py); for the process that reads at num_workers=0."""
        self._tar_gather.threads = n

    @property
    def index(self):
        return self.shards.index

    @property
    def max_open(self) -> int:
        return self.shards.max_open

    @property
    def _open(self):
        return self.shards.views

    def gather_into_bytes(self, want: Callable[[str], bool] | None,
                          before: Callable[[int], None] | None = None) -> bool:
        """From the next read on, gather the large values of the tar fields whose name ``want``
        accepts straight into ``bytes`` objects (into_bytes.py): ``RawBatch.fields[name]`` is then
        ``("objects", values)``. ``before(nbytes)`` is called before a batch's objects are made.
        None turns it off. False where this Python cannot (the buffer path serves)."""
        self._into = IntoBytes(want, before) if want is not None and IntoBytes.available() else None
        return self._into is not None

    def update_index(self, index) -> None:
        """Read from ``index``, a grown version of the current one (its shards
        first, unchanged, then new ones), from the next read on; ValueError if
        it is not one."""
        self.shards.update_index(index)

    def close(self) -> None:
        self._into = None
        self._tar_gather.close()
        self.shards.close()

    def _count_mapped(self, nbytes: int, n: int) -> None:
        if not self._io_fn and self.read_mode == "pread":  # fallback copied from the mapping: bound its RSS
            self._mapped += nbytes + FAULT_AROUND * n
        if self._mapped > self.mapped_budget:
            self.release_pages()

    def release_pages(self) -> None:
        """Unmap the pages read so far (the page cache keeps them): bounds RSS."""
        self.shards.release_pages()
        self._mapped = 0

    def warm(self) -> None:
        """Load the jitted gather now (from numba's cache: ~0.5-1 s in a fresh
        process) instead of inside the first batch; a loader worker calls it
        as it starts, so workers load in parallel while the first tasks are
        sent rather than one after the other on the batch path."""
        warm(self.shards.table, self._hash_fn, self._io_fn, self._iov, self._junk)
        work, present, uniq = self._steady.scratch(0, 0)
        tar_layout(self.index.offsets, self.shards.slot_of, self.shards.table, np.empty(0, np.int64), work,
                   np.empty((2, 0, 0), np.int64), present, uniq)

    # -- batches --------------------------------------------------------
    def read(self, ids, alloc: Callable[[int], np.ndarray] | None = None) -> RawBatch:
        """The samples ``ids`` (global, any order, repeats allowed) as one RawBatch.

        ``alloc(n)`` must return a writable uint8 array of at least n bytes
        (default: a fresh numpy array); it is called once per gather.
        """
        ids = np.ascontiguousarray(ids, np.int64)
        alloc = alloc or _new_buffer
        if ids.size and self.shards.path_of is None:
            batch = self._steady.read(ids, alloc, self._field_names(), self._into, self._io_fn, self._hash_fn,
                                      self.verify)
            if batch is not None:
                self._count_mapped(batch.bytes_read, len(ids))
                return batch
        n_total = self.index.num_samples
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= n_total):
            raise IndexError(f"sample ids must lie in 0..{n_total - 1}, got {int(ids.min())}..{int(ids.max())}")
        errors: list[ReadError] = []
        shard, local = self.index.locate(ids)
        keep = np.ones(len(ids), np.bool_)
        held: list[int] = []  # shards pinned by this read, once per pin
        try:
            slot, groups = self._groups(shard, keep, errors, held)
            while True:
                batch = self._gather(ids, shard, local, keep, slot, groups, alloc, errors)
                if batch is not None:
                    return batch
                slot, groups = self._groups(shard, keep, errors, held)  # samples failed: read again without them
        finally:
            for s in held:
                self.shards.unpin(s)
            self.shards.evict()  # only between reads: a read may need more than max_open shards at once

    def _field_names(self) -> list[str]:
        """Field id -> name; ids are dense and only grow: extended, never rebuilt."""
        names = self._names
        if len(names) < len(self.field_ids):
            names.extend(list(self.field_ids)[len(names):])
        return names

    def _groups(self, shard, keep, errors, held):
        """(slot of each sample: tar slot, -1 columnar, -2 left out; [(columnar view, rows)]),
        opening and pinning shards (unreadable ones skipped or raised)."""
        slot = np.full(len(shard), -2, np.int64)
        live = np.flatnonzero(keep)
        out = []
        if not live.size:
            return slot, out
        uniq, inv = np.unique(shard[live], return_inverse=True)
        slot_u = np.empty(len(uniq), np.int64)
        for u, s in enumerate(uniq.tolist()):
            try:
                view = self.shards.get(s)
                if not self._io_fn and isinstance(view, TarView) and view.short():
                    self._shard_short(s, view)
                self.shards.pin(s)
                held.append(s)
            except ShardError as e:
                if not self.skip:
                    raise
                rows = live[inv == u]
                errors.append(ReadError.of(e, len(rows)))
                keep[rows] = False
                slot_u[u] = -2
                continue
            if isinstance(view, TarView):
                slot_u[u] = view.slot
                self.shards.touch(s)
            else:
                slot_u[u] = -1
                out.append((view, live[inv == u]))
        slot[live] = slot_u[inv]
        return slot, out

    def _shard_short(self, s: int, view) -> None:
        # checked before each batch copied from a mapping: a copy past the
        # file's end would be SIGBUS, not an error
        reason = (f"the shard is shorter than its sidecar says ({os.fstat(view.fd).st_size} < {view.src.size} "
                  "bytes): truncated while open?")
        self.shards.retire(s, reason)
        raise ShardError(self.index.path(s), reason)

    def _gather(self, ids, shard, local, keep, slot, groups, alloc, errors):
        """The batch of the samples still kept, or None after leaving failed ones out (skip mode)."""
        live = np.flatnonzero(keep)
        n = len(live)
        slot_l = slot[live]
        tar_pos = np.flatnonzero(slot_l >= 0)  # positions (in the batch) of tar samples
        tar_rows = live[tar_pos]
        t_slot, t_local = slot_l[tar_pos], local[tar_rows]
        sizes = np.zeros(n, np.int64)
        ksizes = np.zeros(len(tar_pos), np.int64)
        tsz = np.empty(len(tar_pos), np.int64)
        table = self.shards.table
        if len(tar_pos):
            k = tar_sizes(table, t_slot, t_local, tsz, ksizes)
            if k >= 0:
                raise ShardError(self.index.path(int(shard[tar_rows[k]])),
                                 f"sample {int(t_local[k])} is outside the shard's sample table (corrupt sidecar)")
            sizes[tar_pos] = tsz
        pos_of = None
        col_tables = []
        gather = None  # the columnar samples placed by one jitted call (column_gather.py)
        if groups:
            from shardfeed.formats.engine import column_gather, row_group_threads  # columnar shards only: pyarrow

            row_group_threads.decode_missing(groups, local, self._tar_gather.threads)  # a global batch's, on 2 threads

            pos_of = np.full(len(ids), -1, np.int64)
            pos_of[live] = np.arange(n)
            located = []
            for view, rows in groups:
                try:
                    decs, gi, grow = view.locate(local[rows])
                except ShardError as e:
                    if not self.skip:
                        raise
                    errors.append(ReadError.of(e, len(rows)))
                    keep[rows] = False
                    return None
                if decs and not view.registered:
                    columns.register_fields(decs[0].table, self.field_ids)
                    view.registered = True
                located.append((rows, decs, gi, grow))
            gather = column_gather.ColumnGather.of(located, pos_of, self.field_ids)
            if gather is not None:
                col_sizes, col_ksizes = gather.sizes()
                sizes[gather.prow] += col_sizes
            else:
                for rows, decs, gi, grow in located:
                    tbl = columns.rows_of(decs, gi, grow)
                    col_tables.append((pos_of[rows], tbl))
                    sizes[pos_of[rows]] += columns.row_bytes(tbl)
        dst_pos = np.zeros(n + 1, np.int64)
        np.cumsum(sizes, out=dst_pos[1:])
        total = int(dst_pos[-1])
        buf = alloc(total)
        nf = len(self.field_ids)
        fstart = np.full((nf, n), -1, np.int64)
        fsize = np.full((nf, n), -1, np.int64)
        key_blob = made = None
        if len(tar_pos):
            kpos = np.zeros(len(tar_pos) + 1, np.int64)
            np.cumsum(ksizes + 1, out=kpos[1:])
            kbuf = np.empty(int(kpos[-1]), np.uint8)
            # fields into bytes objects (into_bytes.py) in all-tar batches only: one field, one form
            faddr, xs, made = gather_plan(self._into, table, t_slot, t_local, tar_pos, n, self._field_names(),
                                          0 if groups else total)
            if not self._gather_tar(shard, live, tar_pos, t_slot, t_local, buf, dst_pos, fstart, fsize, kbuf, kpos,
                                    keep, errors, faddr, xs):
                return None
            key_blob = kbuf[:-1].tobytes()
            self._count_mapped(int(tsz.sum()), len(tar_pos))
        keys = None
        typed: dict[str, list] = {}
        text_fields: set[str] = set()
        if gather is not None:
            col_blob = gather.place(n, buf, dst_pos, fstart, fsize, col_ksizes, self.field_ids, typed, text_fields)
            if not len(tar_pos):
                key_blob = col_blob  # every sample columnar: keys stay one blob, as for tar
            else:
                keys_np = np.array(col_blob.decode("utf-8").split("\0"), dtype=object)
                keys_np[tar_pos] = key_blob.decode("utf-8").split("\0")
                keys = keys_np.tolist()
        elif len(tar_pos) < n or not len(tar_pos):
            keys_np = np.empty(n, dtype=object)
            if len(tar_pos):
                keys_np[tar_pos] = key_blob.decode("utf-8").split("\0")
            for prow, tbl in col_tables:
                keys_np[prow] = np.array(tbl.column(columns.KEY).to_pylist(), dtype=object)
            keys = keys_np.tolist()
        for prow, tbl in col_tables:
            columns.place(tbl, prow, buf, dst_pos[prow].copy(), fstart, fsize, self.field_ids, typed, text_fields)
        fields = self._fields(fstart, fsize, typed, text_fields, n, shard[live])
        if made:
            fields.update(made)
        if keys is None:
            return RawBatch(ids[live], None, buf[:total], fields, shard[live], errors, total, key_blob)
        return RawBatch(ids[live], keys, buf[:total], fields, shard[live], errors, total)

    def _gather_tar(self, shard, live, tar_pos, t_slot, t_local, buf, dst_pos, fstart, fsize, kbuf, kpos, keep,
                    errors, faddr, xs) -> bool:
        """Read the tar samples (positions ``tar_pos`` of the batch) into ``buf`` and their keys into
        ``kbuf``, checking them; False when some were left out (skip mode)."""
        tar_rows = live[tar_pos]
        bad = np.zeros(len(tar_pos), np.bool_)
        hfn = self._hash_fn if self.verify else 0
        _, err, k = self._tar_gather(self.shards.table, t_slot, t_local, tar_pos, buf, dst_pos, fstart, fsize, kbuf, kpos,
                               hfn, bad, self._io_fn, self._iov, self._junk, faddr, xs)
        if err:
            s = int(shard[tar_rows[k]])
            path = self.index.path(s)
            reason = (f"sample {int(t_local[k])}'s sidecar entries point outside the shard (corrupt sidecar)"
                      if err == 1 else f"reading sample {int(t_local[k])} came up short: the shard is shorter "
                                       "than its sidecar says (truncated while open?)")
            if not self.skip:
                raise ShardError(path, reason)
            # the whole shard is unreadable from here on: leave it out, like one that fails to open
            self.shards.retire(s, reason)
            rows = live[shard[live] == s]
            keep[rows] = False
            errors.append(ReadError(path, reason, len(rows)))
            return False
        if self.verify and not hfn:  # no native xxh3: the same check from Python
            mv = memoryview(buf)
            st, en = dst_pos[tar_pos].tolist(), dst_pos[tar_pos + 1].tolist()
            sums = np.array([xxhash.xxh3_64_intdigest(mv[a:b]) for a, b in zip(st, en)], np.uint64)
            del mv
            bad = sums != self.shards.checksums(t_slot, t_local)
        if not bad.any():
            return True
        failed = []
        tar_keys = kbuf[:-1].tobytes().decode("utf-8").split("\0")
        for w in np.flatnonzero(bad).tolist():
            row = int(tar_rows[w])
            failed.append((row, self.index.path(int(shard[row])),
                           f"sample {int(t_local[w])} ({tar_keys[w]!r}) fails its checksum (bytes damaged on disk)"))
        if not self.skip:
            raise ShardError(failed[0][1], failed[0][2])
        for row, path, reason in failed:
            keep[row] = False
            errors.append(ReadError(path, reason, 1))
        return False

    def _fields(self, fstart, fsize, typed, text_fields, n, shard_of) -> dict:
        """RawBatch.fields, in field id order, typed columns after any not seen as field ids."""
        names = self._field_names()

        def absent(name):
            f = self.field_ids.get(name)

            def check(missing):
                # one field typed in some shards and bytes in others: no column can hold both
                if f is not None and f < len(fsize) and (fsize[f, missing] >= 0).any():
                    row = int(missing[np.flatnonzero(fsize[f, missing] >= 0)[0]])
                    raise ShardError(self.index.path(int(shard_of[row])),
                                     f"field {name!r} is bytes here but a typed column in other shards of "
                                     f"this dataset; write it with one type in every shard")
            return check
        fields: dict = {}
        # only the fields some sample of this batch has, found in one pass: a loop
        # over every field ever seen made reading quadratic in distinct field names
        has = (fsize >= 0).any(axis=1) if fsize.size else np.zeros(len(fsize), np.bool_)
        present = np.flatnonzero(has).tolist()
        if typed:
            present = sorted(set(present) | {self.field_ids[t] for t in typed if t in self.field_ids})
        for f in present:
            name = names[f]
            if name in typed:
                fields[name] = ("array", columns.typed_column(typed[name], n, absent(name)))
            elif has[f]:
                fields[name] = ("text" if name in text_fields else "bytes", fstart[f], fsize[f])
        for name, parts in typed.items():
            if name not in fields:
                fields[name] = ("array", columns.typed_column(parts, n, absent(name)))
        return fields
