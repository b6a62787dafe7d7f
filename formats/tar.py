"""POSIX tar, the WebDataset way: plain ustar headers out, any common header in.

Writing: one 512-byte ustar header per member with an integer mtime, so no
PAX header precedes each member (WebDataset's writer stores a float mtime and
Python's tarfile then adds a PAX header: 2 KiB samples take 6 KiB on disk).

Reading: ``scan_headers`` walks the 512-byte headers of an in-memory tar with
a numba-jitted loop. Why numba rather than a Python loop: a Python loop pays
~3 us per header (slicing, octal parsing, checksum), which is ~3 s for a
shard of a million small members; the jitted loop does the arithmetic at
memory speed and leaves Python only the name decoding (see `shardfeed bench
formats` for the measured figure). Member names are never used as paths.
"""

from __future__ import annotations

import tarfile

import numpy as np

from shardfeed.formats.compiler.jit import njit
from shardfeed.formats.errors import ShardError

BLOCK = 512

# scan status codes
_OK, _TRUNCATED_HEADER, _BAD_CHECKSUM, _BAD_SIZE, _MEMBER_PAST_END = 0, 1, 2, 3, 4


def member_header(name: str, size: int) -> bytes:
    """A ustar header (PAX only for names ustar cannot hold)."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uname = info.gname = ""
    try:
        return info.tobuf(format=tarfile.USTAR_FORMAT)
    except ValueError:  # name longer than ustar's 255 bytes
        return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8")


def padding(size: int) -> bytes:
    return b"\0" * (-size % BLOCK)


END_OF_ARCHIVE = b"\0" * (2 * BLOCK)


@njit(nogil=True)
def _parse_octal(buf, start, length):
    # GNU base-256 for sizes >= 8 GiB: high bit of the first byte set.
    if buf[start] & 0x80:
        # Only 8 bytes fit an int64: longer values with leading non-zero
        # bytes would overflow, so they are rejected as unreadable (-1).
        if buf[start] & 0x40:
            return np.int64(-1)  # negative base-256 (a GNU extension for mtimes, never a size)
        v = np.int64(buf[start] & 0x3F)
        for i in range(start + 1, start + length):
            if v >= (np.int64(1) << 55):
                return np.int64(-1)
            v = (v << 8) | np.int64(buf[i])
        return v
    v = np.int64(0)
    seen = False
    for i in range(start, start + length):
        c = buf[i]
        if c == 0 or c == 32:
            if seen:
                break
            continue
        if c < 48 or c > 55:
            return np.int64(-1)
        v = v * 8 + (c - 48)
        seen = True
    return v


@njit(nogil=True)
def _scan(buf, out_hdr, out_size, out_type):
    """Fill header offsets, sizes and type flags; returns (count, status, offset)."""
    n = buf.shape[0]
    pos = np.int64(0)
    count = 0
    while pos + BLOCK <= n:
        zero = True
        for i in range(pos, pos + BLOCK):
            if buf[i] != 0:
                zero = False
                break
        if zero:
            return count, _OK, pos
        stored = _parse_octal(buf, pos + 148, 8)
        s = np.int64(0)
        signed = np.int64(0)  # some old writers summed signed chars; tarfile accepts both
        for i in range(pos, pos + BLOCK):
            if pos + 148 <= i < pos + 156:
                s += 32
                signed += 32
            else:
                c = np.int64(buf[i])
                s += c
                signed += c - 256 if c > 127 else c
        if stored != s and stored != signed:
            return count, _BAD_CHECKSUM, pos
        size = _parse_octal(buf, pos + 124, 12)
        if size < 0:
            return count, _BAD_SIZE, pos
        # Compare against the room left rather than computing pos + size: a
        # hostile base-256 size near 2**63 would overflow and walk backwards.
        if size > n - pos - BLOCK:
            return count, _MEMBER_PAST_END, pos
        data_end = pos + BLOCK + size
        if count >= out_hdr.shape[0]:
            return count, -1, pos  # caller grows the arrays and resumes
        out_hdr[count] = pos
        out_size[count] = size
        out_type[count] = buf[pos + 156]
        count += 1
        pos = data_end + ((BLOCK - size % BLOCK) % BLOCK)
    if pos != n:
        # pos < n: a partial header; pos > n: the file ends inside the last
        # member's padding. Either way the file was cut short.
        return count, _TRUNCATED_HEADER, min(pos, n)
    return count, _OK, pos


def scan_headers(buf: np.ndarray, shard: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Header offsets, data sizes and type flags of every header in ``buf``.

    A missing end-of-archive marker is accepted (many writers stop short), but
    a partial header or a member running past the end is a truncated shard.
    """
    cap = max(16, buf.shape[0] // (4 * BLOCK))
    hdr = np.empty(cap, np.int64)
    size = np.empty(cap, np.int64)
    typ = np.empty(cap, np.uint8)
    start = 0
    parts = []
    while True:
        count, status, pos = _scan(buf[start:], hdr, size, typ)
        parts.append((hdr[:count] + start, size[:count].copy(), typ[:count].copy()))
        if status == -1:
            start += int(pos)
            continue
        break
    pos = int(pos) + start
    if status == _OK and pos < buf.shape[0]:
        # an end-of-archive marker: only zero padding may follow it, else
        # the rest of the file (its samples) would vanish without a word
        junk = np.flatnonzero(buf[pos:])
        if junk.size:
            raise ShardError(shard, f"tar end-of-archive (zero) block at byte {pos}, but non-zero bytes follow "
                                    f"at byte {pos + int(junk[0])} of {buf.shape[0]}: a zeroed block "
                                    "inside the archive (corrupt shard); the members after it would be lost")
    if status == _BAD_CHECKSUM:
        raise ShardError(shard, f"tar header at byte {pos} has a bad checksum (corrupt shard)")
    if status == _BAD_SIZE:
        raise ShardError(shard, f"tar header at byte {pos} has an unreadable size field")
    if status == _MEMBER_PAST_END:
        raise ShardError(shard, f"member at byte {pos} claims more bytes than the file's "
                                f"{buf.shape[0]} (truncated shard)")
    if status == _TRUNCATED_HEADER:
        raise ShardError(shard, f"file ends inside a tar header or padding at byte {pos} (truncated shard)")
    if len(parts) == 1:
        return parts[0]
    return tuple(np.concatenate(p) for p in zip(*parts))  # type: ignore[return-value]


class BadName(ShardError):
    """A member name that is not UTF-8: under ``on_error="skip"`` its sample
    alone is left out of a scanned foreign tar (``list_members(bad=...)``)."""


def _field(raw: bytes, shard: str = "", at: int = 0) -> str:
    """A NUL-terminated name; ShardError unless it is UTF-8 (keys must be
    text that reads back as itself)."""
    b = raw.split(b"\0", 1)[0]
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        raise BadName(shard, f"member name {b[:120]!r} at byte {at} is not UTF-8 (sample keys must be "
                             "text); rename the member or re-encode the archive's names") from None


def _pax_records(data: bytes, shard: str, at: int) -> dict[str, str]:
    out = {}
    pos = 0
    while pos < len(data):
        sp = data.find(b" ", pos)
        if sp < 0:
            break
        try:
            length = int(data[pos:sp])
        except ValueError:
            raise ShardError(shard, f"malformed PAX header at byte {at}") from None
        if length <= 0 or pos + length > len(data):
            raise ShardError(shard, f"malformed PAX record length at byte {at}")
        rec = data[sp + 1: pos + length - 1]
        k, _, v = rec.partition(b"=")
        out[k.decode("utf-8", "replace")] = v.decode("utf-8", "surrogateescape")
        pos += length
    return out


def list_members(buf: np.ndarray, shard: str, bad: list | None = None) -> list[tuple[str, int, int]]:
    """Regular-file members as (name, data offset, size), in archive order.

    Directories, links and devices are skipped: a member's name is only ever
    a sample key, never a path we open. A name that is not UTF-8 is a
    ShardError, or, given a list ``bad``, that member is left out and
    (its raw key, the reason) appended there.
    """
    hdr, size, typ = scan_headers(buf, shard)
    mv = memoryview(buf)
    members = []
    long_name: str | BadName | None = None
    pax: dict[str, str] = {}
    for off, sz, t in zip(hdr.tolist(), size.tolist(), typ.tolist()):
        data_off = off + BLOCK
        if t in (0x30, 0x00, 0x37):  # '0', NUL, '7' (contiguous): regular file
            h = bytes(mv[off:off + BLOCK])
            try:
                if isinstance(long_name, BadName):
                    raise long_name
                name = _field(h[0:100], shard, off)
                if h[257:262] == b"ustar":
                    prefix = _field(h[345:500], shard, off)
                    if prefix:
                        name = prefix + "/" + name
                if long_name is not None:
                    name = long_name
                if "path" in pax:
                    name = _field(pax["path"].encode("utf-8", "surrogateescape"), shard, off)
            except BadName as e:
                if bad is None:
                    raise
                raw = h[0:100].split(b"\0", 1)[0]
                # the reason, not the error: its traceback's frames hold views of the mapping
                bad.append((raw.rsplit(b"/", 1)[-1].split(b".", 1)[0], e.reason))
                long_name, pax = None, {}
                continue
            if "size" in pax:
                raise ShardError(shard, f"PAX size override at byte {off} is not supported")
            members.append((name, data_off, sz))
            long_name, pax = None, {}
        elif t == 0x4C:  # 'L': GNU long name for the next member
            try:
                long_name = _field(bytes(mv[data_off:data_off + sz]), shard, off)
            except BadName as e:
                if bad is None:
                    raise
                long_name = BadName(e.shard, e.reason)  # the member it names is left out (no traceback kept)
        elif t == 0x78:  # 'x': PAX extended header for the next member
            pax = _pax_records(bytes(mv[data_off:data_off + sz]), shard, off)
        else:  # directories, links, devices, global PAX headers: not samples
            long_name, pax = None, {}
    return members


def split_name(name: str) -> tuple[str, str] | None:
    """WebDataset's key/extension split: the key ends at the first dot of the basename."""
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot <= slash + 1 or dot == len(name) - 1:
        return None
    return name[:dot], name[dot + 1:]
