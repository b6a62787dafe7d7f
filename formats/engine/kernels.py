"""The jitted loops of a batch read (numba, ``nogil``): no Python object per sample.

``tar_gather`` reads every tar sample of a batch, whatever its shard, into
one buffer in one call (or some fields straight into objects of their own,
into_bytes.py); it finds each open shard's bytes and sidecar arrays
through a row of addresses in the open-shard table (open_shards.Slots), whose
columns are named below. ``copy_ranges`` places columnar binary values in the
same buffer; ``parse_ints`` turns decimal fields into one int64 array.
"""

from __future__ import annotations

import numpy as np

from shardfeed.formats.compiler.jit import njit
from shardfeed.formats.compiler.native import call_hash, call_preadv, call_state, call_update, copy, load_i64

# Columns of the open-shard table (open_shards.Slots), one row per open tar
# shard: addresses and lengths of its bytes and sidecar arrays, so one jitted
# call per batch reads from every shard the batch touches. SRC: the shard's
# bytes (SRC_LEN long); MSTART: first member of each sample (NSAMP + 1
# entries); OFF, SIZE, FID: offset, size and field id of each member (NMEM of
# them); KOFF, KDATA, KLEN: the keys as one UTF-8 blob and its offsets; CSUM:
# each sample's xxh3; FD: a descriptor to preadv from, or -1.
(SRC, SRC_LEN, MSTART, NSAMP, OFF, SIZE, FID, NMEM, KOFF, KDATA, KLEN, CSUM, FD, NCOL) = range(14)

NO_FADDR = np.zeros((2, 0, 0), np.int64)  # tar_gather's faddr when every member goes to dst


@njit(nogil=True)
def tar_sizes(table, slot, local, sizes, ksizes):
    """Payload and key bytes of each sample; -1, or the row of a sample out of range."""
    for k in range(local.shape[0]):
        s = slot[k]
        i = local[k]
        if i < 0 or i >= table[s, NSAMP]:
            return k
        a = load_i64(table[s, MSTART], i)
        b = load_i64(table[s, MSTART], i + 1)
        if a < 0 or b > table[s, NMEM] or a > b:
            return k
        t = 0
        for j in range(a, b):
            t += load_i64(table[s, SIZE], j)
        sizes[k] = t
        ksizes[k] = load_i64(table[s, KOFF], i + 1) - load_i64(table[s, KOFF], i)
    return -1


@njit(nogil=True)
def _flush(io_fn, fd, iov, cnt, start, want):
    return call_preadv(io_fn, fd, iov.ctypes.data, cnt, start) == want


@njit(nogil=True)
def member_sizes(table, slot, local, rows, want, out):
    """``out[f, rows[k]]``: the size of sample k's member of field f, for each field with ``want[f]``
    (``out`` comes filled with -1: absent). Run before the gather, on entries tar_layout or tar_sizes
    checked; a member outside the table is left -1 (the gather then reports it)."""
    for k in range(local.shape[0]):
        s = slot[k]
        i = local[k]
        a = load_i64(table[s, MSTART], i)
        b = load_i64(table[s, MSTART], i + 1)
        for j in range(a, b):
            f = load_i64(table[s, FID], j)
            if 0 <= f < want.shape[0] and want[f]:
                out[f, rows[k]] = load_i64(table[s, SIZE], j)


@njit(nogil=True)
def _pieces_hash(table, s, i, r, p, faddr, xs):
    # xxh3 of a sample whose members lie apart (some in objects of their own): streamed in member order,
    # which gives the value of the one-shot hash of the members joined (xs: reset, update, digest, state)
    st = xs[3]
    call_state(xs[0], st)
    for j in range(load_i64(table[s, MSTART], i), load_i64(table[s, MSTART], i + 1)):
        n = load_i64(table[s, SIZE], j)
        f = load_i64(table[s, FID], j)
        a = faddr[0, f, r] if f < faddr.shape[1] and r < faddr.shape[2] and faddr[0, f, r] != 0 else p
        call_update(xs[1], st, a, n)
        p += n
    return call_state(xs[2], st)


@njit(nogil=True)
def hash_rows(hash_fn, table, slot, local, rows, dst, dst_pos, bad, lo, hi, faddr, xs):
    nbad = 0
    base = dst.ctypes.data
    for k in range(lo, hi):
        r = rows[k]
        if faddr.shape[2] == 0:
            h = call_hash(hash_fn, base + dst_pos[r], dst_pos[r + 1] - dst_pos[r])
        else:
            h = _pieces_hash(table, slot[k], local[k], r, base + dst_pos[r], faddr, xs)
        if np.int64(h) != load_i64(table[slot[k], CSUM], local[k]):
            bad[k] = True
            nbad += 1
    return nbad


@njit(nogil=True)
def tar_gather(table, slot, local, rows, dst, dst_pos, fstart, fsize, kbuf, kpos, hash_fn, bad,
               io_fn, iov, junk, faddr, xs):
    """Copy each sample's members (in member order, so a sample is one
    contiguous range whose xxh3 is its checksum) and its key + NUL; with a
    hash_fn, mark samples failing their checksum in ``bad``.

    ``faddr`` (2, fields, rows) sends members elsewhere: the member of field f
    of row r goes to address ``faddr[0, f, r]`` (when not 0), which holds
    ``faddr[1, f, r]`` bytes, instead of its place in ``dst`` (left unwritten);
    such samples are hashed piece by piece with the streaming xxh3 in ``xs``
    (into_bytes.py). An empty ``faddr`` (2, 0, 0) sends nothing elsewhere.

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
                nbad += hash_rows(hash_fn, table, slot, local, rows, dst, dst_pos, bad, hashed, k, faddr, xs)
            hashed = k
        s = slot[k]
        i = local[k]
        r = rows[k]
        p = dst_pos[r]
        src, src_len, fd = table[s, SRC], table[s, SRC_LEN], table[s, FD]
        use_io = io_fn != 0 and fd >= 0
        a = load_i64(table[s, MSTART], i)
        b = load_i64(table[s, MSTART], i + 1)
        for j in range(a, b):
            o = load_i64(table[s, OFF], j)
            n = load_i64(table[s, SIZE], j)
            f = load_i64(table[s, FID], j)
            if o < 0 or n < 0 or o + n > src_len or p + n > dlen or f < 0 or f >= nf:
                return nbad, 1, k
            d = dbase + p
            if f < faddr.shape[1] and r < faddr.shape[2] and faddr[0, f, r] != 0:
                if n != faddr[1, f, r]:
                    return nbad, 1, k
                d = faddr[0, f, r]
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
                iov[cnt, 0] = d
                iov[cnt, 1] = n
                want += n
                cnt += 1
                run_pos = o + n
            else:
                copy(d, src + o, n)
            fstart[f, r] = p
            fsize[f, r] = n
            p += n
        ka = load_i64(table[s, KOFF], i)
        kb = load_i64(table[s, KOFF], i + 1)
        q = kpos[k]
        if ka < 0 or kb < ka or kb > table[s, KLEN] or q + kb - ka + 1 > kbuf.shape[0]:
            return nbad, 1, k
        copy(kbase + q, table[s, KDATA] + ka, kb - ka)
        kbuf[q + kb - ka] = 0
    if cnt and not _flush(io_fn, run_fd, iov, cnt, run_start, want):
        return nbad, 2, run_k
    if hash_fn != 0:
        nbad += hash_rows(hash_fn, table, slot, local, rows, dst, dst_pos, bad, hashed, local.shape[0], faddr,
                          xs)
    return nbad, 0, 0


@njit(nogil=True)
def copy_ranges(src, src_start, sizes, dst, dst_start):
    sb, db = src.ctypes.data, dst.ctypes.data
    for k in range(sizes.shape[0]):
        s = sizes[k]
        a, d = src_start[k], dst_start[k]
        if s > 0:
            if a < 0 or a + s > src.shape[0] or d < 0 or d + s > dst.shape[0]:
                raise IndexError("column range outside its buffer")
            copy(db + d, sb + a, s)


@njit(nogil=True)
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


def warm(table: np.ndarray, hash_fn: int, io_fn: int, iov: np.ndarray, junk: np.ndarray) -> None:
    """Load the jitted loops now (from numba's cache: ~0.5-1 s in a fresh process) by calling each on
    nothing, with the argument types a batch read passes."""
    z, b, f2 = np.zeros(0, np.int64), np.zeros(0, np.uint8), np.zeros((1, 0), np.int64)
    tar_sizes(table, z, z, z, z)
    tar_gather(table, z, z, z, b, np.zeros(1, np.int64), f2, f2, np.zeros(1, np.uint8), np.zeros(1, np.int64),
               hash_fn, np.zeros(0, np.bool_), io_fn, iov, junk, NO_FADDR, np.zeros(4, np.int64))
    member_sizes(table, z, z, z, np.zeros(0, np.uint8), f2)
    parse_ints(b, z, z)
