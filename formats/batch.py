"""Batch reads: many samples of a dataset at once, with few Python objects.

The per-sample readers in readers.py build a dict of ``bytes`` per sample;
every peer library is bound by exactly that kind of per-sample Python work
(PEERS.md). Here all tar samples of a batch, whatever their shards, are
gathered by one jitted call (``_tar_gather``) into one contiguous buffer,
sample after sample, each sample's members in member order, read with
preadv from the page cache (see the note above MAPPED_BUDGET_BYTES). A
sample's bytes are therefore one contiguous range, so its xxh3 checksum is
one C call over that range, made inside the same loop. Per field we keep two
int64 arrays (start, size) into the buffer; ``-1`` marks a sample lacking the
field.

The buffer comes from the caller (``alloc``) so a loader worker can gather
straight into shared memory. Parquet and Arrow shards are read by row group:
typed numeric columns stay numpy arrays, binary and string columns are copied
into the same buffer layout.

Damaged samples are not returned as data: with ``skip=True`` they are left
out of the batch and reported in ``RawBatch.errors``; otherwise ShardError.
"""

from __future__ import annotations

import mmap
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

import numba
import numpy as np
import pyarrow as pa
import xxhash

from shardfeed.formats.errors import ShardError
from shardfeed.formats.native import call_hash, call_preadv, copy, hash_fn, load_i64, preadv_fn
from shardfeed.formats.readers import ColumnarShardReader, TarShardReader, open_shard

# Tar shards on disk are read with preadv (native.py) straight from the page
# cache into the batch buffer: one copy, no page faults, and no mapped file
# pages in RSS however large the dataset. Measured on the 2-core dev VM, 2 KiB
# samples in global order over 0.5 GiB: copying from a fully mapped shard
# is fastest (~250k samples/s end to end) but maps the whole dataset into RSS
# (+450 MB); bounding that by dropping the mapping (MADV_DONTNEED) every
# 64-256 MiB costs a re-fault per sample (45-147k/s); preadv ran at 163k/s
# with RSS flat. Where preadv is missing the gather copies from the mapping
# and drops it past MAPPED_BUDGET_BYTES (estimated as bytes + FAULT_AROUND per
# sample: a read fault maps up to 64 KiB around the byte asked for).
#
# read_mode="mmap" (opt-in) trades that flat RSS for speed: the gather copies
# from a mapping kept for the shard's open life (~1.6x the samples/s of preadv
# for 2 KiB global-order reads from page cache: no ~1.5 us syscall per run of
# bytes). The mapped page-cache pages count in
# RSS and grow with the shards touched; only closing a shard (the LRU of
# max_open shards) unmaps them. No MADV_RANDOM for global order: measured
# no gain with the shards in page cache, and from a cold cache it disables
# the readahead that makes mmap mode fast (2 KiB, global, first epoch of a
# 0.5 GiB dataset: ~10k samples/s with it, ~100k without, ~12-25k pread).
READ_MODES = ("pread", "mmap")
MAPPED_BUDGET_BYTES = 64 << 20
FAULT_AROUND = 64 << 10
MAX_OPEN_SHARDS = 256
_MAX_IOV = 512  # under IOV_MAX (1024 on Linux)
_JUNK_BYTES = 64 << 10


# Columns of the open-shard table (_Slots): addresses and lengths of each
# open tar shard's bytes and sidecar arrays, so one jitted call per batch
# reads from every shard the batch touches.
(_SRC, _SRC_LEN, _MSTART, _NSAMP, _OFF, _SIZE, _FID, _NMEM, _KOFF, _KDATA, _KLEN, _CSUM, _FD,
 _NCOL) = range(14)


@numba.njit(cache=True, nogil=True)
def _tar_sizes(table, slot, local, sizes, ksizes):
    """Payload and key bytes of each sample; -1, or the row of a sample out of range."""
    for k in range(local.shape[0]):
        s = slot[k]
        i = local[k]
        if i < 0 or i >= table[s, _NSAMP]:
            return k
        a = load_i64(table[s, _MSTART], i)
        b = load_i64(table[s, _MSTART], i + 1)
        if a < 0 or b > table[s, _NMEM] or a > b:
            return k
        t = 0
        for j in range(a, b):
            t += load_i64(table[s, _SIZE], j)
        sizes[k] = t
        ksizes[k] = load_i64(table[s, _KOFF], i + 1) - load_i64(table[s, _KOFF], i)
    return -1


@numba.njit(cache=True, nogil=True)
def _flush(io_fn, fd, iov, cnt, start, want):
    return call_preadv(io_fn, fd, iov.ctypes.data, cnt, start) == want


@numba.njit(cache=True, nogil=True)
def _hash_rows(hash_fn, table, slot, local, rows, dst, dst_pos, bad, lo, hi):
    nbad = 0
    base = dst.ctypes.data
    for k in range(lo, hi):
        r = rows[k]
        h = call_hash(hash_fn, base + dst_pos[r], dst_pos[r + 1] - dst_pos[r])
        if np.int64(h) != load_i64(table[slot[k], _CSUM], local[k]):
            bad[k] = True
            nbad += 1
    return nbad


@numba.njit(cache=True, nogil=True)
def _tar_gather(table, slot, local, rows, dst, dst_pos, fstart, fsize, kbuf, kpos, hash_fn, bad,
                io_fn, iov, junk):
    """Copy each sample's members (in member order, so a sample is one
    contiguous range whose xxh3 is its checksum) and its key + NUL; with a
    hash_fn, mark samples failing their checksum in ``bad``.

    Shards with a file descriptor are read with preadv, straight from the
    page cache into ``dst``: members that follow each other in the file
    (a sample's members; consecutive samples with shuffle none/block) go in
    one call, tar headers between them into ``junk``. In-memory shards
    (decompressed) are copied. Returns (bad samples, error, row): error 1:
    row's table entries point outside the shard or the buffers (never
    expected after validation); error 2: the file is shorter than its
    sidecar says (read from the run starting at row)."""
    dbase = dst.ctypes.data
    dlen = dst.shape[0]
    kbase = kbuf.ctypes.data
    jbase, jlen = junk.ctypes.data, junk.shape[0]
    max_iov = iov.shape[0]
    nf = fstart.shape[0]
    nbad = 0
    cnt = 0  # pending iovecs
    run_fd, run_start, run_pos, run_k, want = -1, 0, 0, 0, 0
    hashed = 0
    for k in range(local.shape[0]):
        if cnt and want >= (1 << 20):  # read what is pending, hash it while it is in cache
            if not _flush(io_fn, run_fd, iov, cnt, run_start, want):
                return nbad, 2, run_k
            cnt, want = 0, 0
            if hash_fn != 0:
                nbad += _hash_rows(hash_fn, table, slot, local, rows, dst, dst_pos, bad, hashed, k)
            hashed = k
        s = slot[k]
        i = local[k]
        r = rows[k]
        p = dst_pos[r]
        src, src_len, fd = table[s, _SRC], table[s, _SRC_LEN], table[s, _FD]
        use_io = io_fn != 0 and fd >= 0
        a = load_i64(table[s, _MSTART], i)
        b = load_i64(table[s, _MSTART], i + 1)
        for j in range(a, b):
            o = load_i64(table[s, _OFF], j)
            n = load_i64(table[s, _SIZE], j)
            f = load_i64(table[s, _FID], j)
            if o < 0 or n < 0 or o + n > src_len or p + n > dlen or f < 0 or f >= nf:
                return nbad, 1, k
            if use_io:
                if cnt and (fd != run_fd or o < run_pos or o - run_pos > jlen or cnt + 2 > max_iov):
                    if not _flush(io_fn, run_fd, iov, cnt, run_start, want):
                        return nbad, 2, run_k
                    cnt, want = 0, 0
                if cnt == 0:
                    run_fd, run_start, run_pos, run_k = fd, o, o, k
                if o > run_pos:
                    iov[cnt, 0] = jbase
                    iov[cnt, 1] = o - run_pos
                    want += o - run_pos
                    cnt += 1
                iov[cnt, 0] = dbase + p
                iov[cnt, 1] = n
                want += n
                cnt += 1
                run_pos = o + n
            else:
                copy(dbase + p, src + o, n)
            fstart[f, r] = p
            fsize[f, r] = n
            p += n
        ka = load_i64(table[s, _KOFF], i)
        kb = load_i64(table[s, _KOFF], i + 1)
        q = kpos[k]
        if ka < 0 or kb < ka or kb > table[s, _KLEN] or q + kb - ka + 1 > kbuf.shape[0]:
            return nbad, 1, k
        copy(kbase + q, table[s, _KDATA] + ka, kb - ka)
        kbuf[q + kb - ka] = 0
    if cnt and not _flush(io_fn, run_fd, iov, cnt, run_start, want):
        return nbad, 2, run_k
    if hash_fn != 0:
        nbad += _hash_rows(hash_fn, table, slot, local, rows, dst, dst_pos, bad, hashed, local.shape[0])
    return nbad, 0, 0


@numba.njit(cache=True, nogil=True)
def _copy_ranges(src, src_start, sizes, dst, dst_start):
    sb, db = src.ctypes.data, dst.ctypes.data
    for k in range(sizes.shape[0]):
        s = sizes[k]
        a, d = src_start[k], dst_start[k]
        if s > 0:
            if a < 0 or a + s > src.shape[0] or d < 0 or d + s > dst.shape[0]:
                raise IndexError("column range outside its buffer")
            copy(db + d, sb + a, s)


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
    Keys are ``keys`` (a list), or for tar-only batches ``key_blob``: the
    keys as UTF-8 joined by NUL (no key holds one), decoded on first use of
    ``keys`` (a worker passes the blob on without ever building the list).
    """

    ids: np.ndarray
    key_list: list | None
    buf: np.ndarray
    fields: dict
    shards: np.ndarray  # shard of each sample, for error messages
    errors: list = field(default_factory=list)  # (shard path, reason) of skipped samples/shards
    bytes_read: int = 0
    key_blob: bytes | None = None

    @property
    def keys(self) -> list:
        if self.key_list is None:
            self.key_list = self.key_blob.decode("utf-8").split("\0") if len(self.ids) else []
        return self.key_list

    def __len__(self) -> int:
        return len(self.ids)


class _TarView:
    """One open tar shard: its arrays, kept alive while its row of the slot table points at them."""

    def __init__(self, reader: TarShardReader, field_ids: dict):
        self.reader = reader
        self.path = reader.path
        t = reader.table
        self.src = np.frombuffer(reader.data, np.uint8)
        self.member_start = np.ascontiguousarray(t.member_start, np.int64)
        self.offset = np.ascontiguousarray(t.offset, np.int64)
        self.size = np.ascontiguousarray(t.size, np.int64)
        field_map = np.array([field_ids.setdefault(f, len(field_ids)) for f in t.fields], np.int64)
        self.fid = np.ascontiguousarray(field_map[t.member_field]) if len(t.offset) else np.zeros(0, np.int64)
        self.keys = t.keys
        # keys as one UTF-8 blob + offsets: the gather copies them next to the
        # payloads and the batch's keys come back with one decode and split
        enc = [k.encode("utf-8") for k in t.keys]
        if any(b"\0" in k for k in enc):
            raise ShardError(self.path, "a sample key contains a NUL byte (impossible in a tar name: corrupt sidecar)")
        self.key_data = np.frombuffer(b"".join(enc), np.uint8) if enc else np.zeros(0, np.uint8)
        self.key_off = np.zeros(len(enc) + 1, np.int64)
        np.cumsum([len(k) for k in enc], out=self.key_off[1:])
        self.checksum = np.ascontiguousarray(t.checksum, np.uint64)
        self.slot = -1
        # a mapped shard is read with preadv through its own descriptor: the
        # mapping's pages are never touched, so they never count in RSS
        self.fd = -1
        if isinstance(reader.data, mmap.mmap):
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            now = os.fstat(fd).st_size
            if now != self.src.size:
                os.close(fd)
                raise ShardError(self.path, f"shard changed size while opened ({self.src.size} -> {now} bytes)")
            self.fd = fd

    def row(self) -> list[int]:
        def addr(a):
            return a.ctypes.data if a.size else 0
        return [addr(self.src), self.src.size, addr(self.member_start), len(self.member_start) - 1,
                addr(self.offset), addr(self.size), addr(self.fid), self.offset.size, addr(self.key_off),
                addr(self.key_data), self.key_data.size, addr(self.checksum), self.fd]

    def short(self) -> bool:
        """Whether the file is now shorter than its mapping (truncated while open):
        copying from the mapping past its end would raise SIGBUS."""
        return self.fd >= 0 and os.fstat(self.fd).st_size < self.src.size

    def release_pages(self) -> None:
        if isinstance(self.reader.data, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
            self.reader.data.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        self.src = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.reader.close()


class _Slots:
    """The slot table: one row of addresses per open tar shard (see _tar_gather)."""

    def __init__(self, capacity: int):
        self.table = np.zeros((max(capacity, 1), _NCOL), np.int64)
        self.free = list(range(len(self.table)))[::-1]

    def add(self, view: _TarView) -> None:
        if not self.free:
            grown = np.zeros((2 * len(self.table), _NCOL), np.int64)
            grown[:len(self.table)] = self.table
            self.free = list(range(len(grown) - 1, len(self.table) - 1, -1))
            self.table = grown
        view.slot = self.free.pop()
        self.table[view.slot] = view.row()

    def remove(self, view: _TarView) -> None:
        if view.slot >= 0:
            self.table[view.slot] = 0
            self.free.append(view.slot)
            view.slot = -1


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


def check_read_mode(read_mode) -> str:
    """``read_mode`` if it is one of READ_MODES, else ValueError naming it and the valid ones."""
    if read_mode not in READ_MODES:
        raise ValueError(f"read_mode={read_mode!r} is not one of {', '.join(map(repr, READ_MODES))}: 'pread' "
                         "keeps RSS flat, 'mmap' copies from mapped shards (faster for small samples, mapped "
                         "pages count in RSS)")
    return read_mode


class BatchReader:
    """Reads batches of global sample ids from a DatasetIndex.

    ``open`` maps a shard number to a local path (a cache may supply one);
    shards stay open (LRU, at most ``max_open`` between reads). ``skip``
    decides what a damaged sample or unreadable shard does: raise
    ShardError, or leave the samples out and list the error in
    ``RawBatch.errors``.

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
                 read_mode: str = "pread"):
        self.read_mode = check_read_mode(read_mode)
        self.index = index
        self.verify = verify
        self.skip = skip
        self.max_open = max_open
        self.path_of = path_of
        self.mapped_budget = mapped_budget
        self.field_ids: dict[str, int] = {}
        self._open: OrderedDict[int, object] = OrderedDict()
        self._bad: dict[int, str] = {}  # shards that failed to open (skip mode): reason
        self._slots = _Slots(min(max_open, len(index.counts)) + 1)
        self._hash_fn = hash_fn() if verify else 0
        self._io_fn = preadv_fn() if read_mode == "pread" else 0
        self._iov = np.zeros((_MAX_IOV, 2), np.int64)  # struct iovec {void *base; size_t len}
        self._junk = np.empty(_JUNK_BYTES, np.uint8)  # tar headers and padding between members read at once
        self._mapped = 0  # estimated bytes mapped since the last release
        self._touched: set[int] = set()

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
        if isinstance(reader, TarShardReader):
            try:
                v = _TarView(reader, self.field_ids)
            except BaseException:
                reader.close()
                raise
            self._slots.add(v)
        else:
            v = _ColumnarView(reader)
        self._open[s] = v
        return v

    def _evict(self) -> None:
        # only between reads: a read may need more than max_open shards at once
        while len(self._open) > self.max_open:
            s, old = self._open.popitem(last=False)
            self._close_view(s, old)

    def _close_view(self, s: int, v) -> None:
        if isinstance(v, _TarView):
            self._slots.remove(v)
            self._touched.discard(s)
        v.close()

    def close(self) -> None:
        while self._open:
            s, v = self._open.popitem()
            self._close_view(s, v)

    def release_pages(self) -> None:
        """Unmap the pages read so far (the page cache keeps them): bounds RSS."""
        for s in self._touched:
            v = self._open.get(s)
            if isinstance(v, _TarView):
                v.release_pages()
        self._touched.clear()
        self._mapped = 0

    def warm(self) -> None:
        """Load the jitted gather now (from numba's cache: ~0.5-1 s in a fresh
        process) instead of inside the first batch; a loader worker calls it
        as it starts, so workers load in parallel while the first tasks are
        sent rather than one after the other on the batch path."""
        z, b, f2 = np.zeros(0, np.int64), np.zeros(0, np.uint8), np.zeros((1, 0), np.int64)
        _tar_sizes(self._slots.table, z, z, z, z)
        _tar_gather(self._slots.table, z, z, z, b, np.zeros(1, np.int64), f2, f2, np.zeros(1, np.uint8),
                    np.zeros(1, np.int64), self._hash_fn, np.zeros(0, np.bool_), self._io_fn, self._iov, self._junk)
        parse_ints(b, z, z)

    # -- batches --------------------------------------------------------
    def read(self, ids, alloc: Callable[[int], np.ndarray] | None = None) -> RawBatch:
        """The samples ``ids`` (global, any order, repeats allowed) as one RawBatch.

        ``alloc(n)`` must return a writable uint8 array of at least n bytes
        (default: a fresh numpy array); it is called once per gather.
        """
        ids = np.ascontiguousarray(ids, np.int64)
        n_total = self.index.num_samples
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= n_total):
            raise IndexError(f"sample ids must lie in 0..{n_total - 1}, got {int(ids.min())}..{int(ids.max())}")
        errors: list = []
        shard, local = self.index.locate(ids)
        keep = np.ones(len(ids), np.bool_)
        alloc = alloc or (lambda n: np.empty(n, np.uint8))
        try:
            slot, groups = self._groups(shard, keep, errors)
            while True:
                batch = self._gather(ids, shard, local, keep, slot, groups, alloc, errors)
                if batch is not None:
                    return batch
                slot, groups = self._groups(shard, keep, errors)  # samples failed: read again without them
        finally:
            self._evict()

    def _groups(self, shard, keep, errors):
        """(slot of each sample: tar slot, -1 columnar, -2 left out; [(columnar view, rows)]),
        opening shards (unreadable ones skipped or raised)."""
        slot = np.full(len(shard), -2, np.int64)
        live = np.flatnonzero(keep)
        out = []
        if not live.size:
            return slot, out
        uniq, inv = np.unique(shard[live], return_inverse=True)
        slot_u = np.empty(len(uniq), np.int64)
        for u, s in enumerate(uniq.tolist()):
            try:
                view = self._view(s)
                if not self._io_fn and isinstance(view, _TarView) and view.short():
                    self._shard_short(s, view)
            except ShardError as e:
                if not self.skip:
                    raise
                rows = live[inv == u]
                errors.append((e.shard, e.reason, len(rows)))
                keep[rows] = False
                slot_u[u] = -2
                continue
            if isinstance(view, _TarView):
                slot_u[u] = view.slot
                self._touched.add(s)
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
        self._bad[s] = reason
        self._close_view(s, self._open.pop(s))
        raise ShardError(self.index.path(s), reason)

    def _gather(self, ids, shard, local, keep, slot, groups, alloc, errors):
        live = np.flatnonzero(keep)
        n = len(live)
        slot_l = slot[live]
        tar_pos = np.flatnonzero(slot_l >= 0)  # positions (in the batch) of tar samples
        all_tar = len(tar_pos) == n
        tar_rows = live[tar_pos]
        t_slot, t_local = slot_l[tar_pos], local[tar_rows]
        sizes = np.zeros(n, np.int64)
        ksizes = np.zeros(len(tar_pos), np.int64)
        tsz = np.empty(len(tar_pos), np.int64)
        table = self._slots.table
        if len(tar_pos):
            k = _tar_sizes(table, t_slot, t_local, tsz, ksizes)
            if k >= 0:
                raise ShardError(self.index.path(int(shard[tar_rows[k]])),
                                 f"sample {int(t_local[k])} is outside the shard's sample table (corrupt sidecar)")
            sizes[tar_pos] = tsz
        pos_of = None
        col_tables = []
        if groups:
            pos_of = np.full(len(ids), -1, np.int64)
            pos_of[live] = np.arange(n)
        for view, rows in groups:
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
        typed: dict[str, list] = {}
        text_fields: set[str] = set()
        keys = None
        if len(tar_pos):
            kpos = np.zeros(len(tar_pos) + 1, np.int64)
            np.cumsum(ksizes + 1, out=kpos[1:])
            kbuf = np.empty(int(kpos[-1]), np.uint8)
            bad = np.zeros(len(tar_pos), np.bool_)
            hfn = self._hash_fn if self.verify else 0
            _, err, k = _tar_gather(table, t_slot, t_local, tar_pos, buf, dst_pos, fstart, fsize, kbuf, kpos, hfn,
                                    bad, self._io_fn, self._iov, self._junk)
            if err:
                s = int(shard[tar_rows[k]])
                path = self.index.path(s)
                reason = (f"sample {int(t_local[k])}'s sidecar entries point outside the shard (corrupt sidecar)"
                          if err == 1 else f"reading sample {int(t_local[k])} came up short: the shard is shorter "
                                           "than its sidecar says (truncated while open?)")
                if not self.skip:
                    raise ShardError(path, reason)
                # the whole shard is unreadable from here on: leave it out, like one that fails to open
                self._bad[s] = reason
                self._close_view(s, self._open.pop(s))
                rows = live[shard[live] == s]
                keep[rows] = False
                errors.append((path, reason, len(rows)))
                return None
            key_blob = kbuf[:-1].tobytes()
            tar_bytes = int(tsz.sum())
            if not self._io_fn and self.read_mode == "pread":  # fallback copied from the mapping: bound its RSS
                self._mapped += tar_bytes + FAULT_AROUND * len(tar_pos)
            if self._mapped > self.mapped_budget:
                self.release_pages()
            if self.verify and not hfn:  # no native xxh3: the same check from Python
                mv = memoryview(buf)
                h = xxhash.xxh3_64_intdigest
                st, en = dst_pos[tar_pos].tolist(), dst_pos[tar_pos + 1].tolist()
                sums = np.array([h(mv[a:b]) for a, b in zip(st, en)], np.uint64)
                del mv
                bad = sums != self._checksums(t_slot, t_local)
            if bad.any():
                failed = []
                tar_keys = key_blob.decode("utf-8").split("\0")
                for w in np.flatnonzero(bad).tolist():
                    row = int(tar_rows[w])
                    failed.append((row, self.index.path(int(shard[row])),
                                   f"sample {int(t_local[w])} ({tar_keys[w]!r}) fails its checksum "
                                   "(bytes damaged on disk)"))
                if not self.skip:
                    raise ShardError(failed[0][1], failed[0][2])
                for row, path, reason in failed:
                    keep[row] = False
                    errors.append((path, reason, 1))
                return None
        if not all_tar or not len(tar_pos):
            keys_np = np.empty(n, dtype=object)
            if len(tar_pos):
                keys_np[tar_pos] = key_blob.decode("utf-8").split("\0")
            for view, rows, tbl in col_tables:
                keys_np[pos_of[rows]] = np.array(tbl.column("__key__").to_pylist(), dtype=object)
            keys = keys_np.tolist()
        for view, rows, tbl in col_tables:
            prow = pos_of[rows]
            cursor = dst_pos[prow].copy()
            for name in tbl.column_names:
                col = tbl.column(name)
                if name == "__key__":
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
        if keys is None:
            return RawBatch(ids[live], None, buf[:total], fields, shard[live], errors, total, key_blob)
        return RawBatch(ids[live], keys, buf[:total], fields, shard[live], errors, total)

    def _checksums(self, t_slot, t_local) -> np.ndarray:
        by_slot = {v.slot: v for v in self._open.values() if isinstance(v, _TarView)}
        return np.array([by_slot[s].checksum[i] for s, i in zip(t_slot.tolist(), t_local.tolist())], np.uint64)


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
