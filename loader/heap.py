"""Keep the memory freed by one batch's ``bytes`` for the next batch (glibc only).

The copied form of a byte field (``bytes_as="bytes"``) makes one ``bytes``
object per sample: 25 MB per batch of 256 x 100 KiB, allocated by malloc
from the heap. When the consumer drops the previous batch, glibc gives the
freed top of the heap back to the kernel as soon as more than 128 KiB is
free there (``M_TRIM_THRESHOLD``), so the next batch gets its memory as
fresh pages again: measured here 3,583 page faults per batch, ~7 ms of a
~17 ms batch at 0 workers (fresh pages are zeroed, and on this VM each
costs ~0.7 ms per MB). glibc raises that threshold by itself only after a
block of 128 KiB..32 MiB that it had mapped is freed, which a fresh
process reading 100 KiB samples may never do.

``reserve(nbytes)`` raises the trim threshold to twice the bytes of the
batch just made (so the top of the heap keeps the previous batch's memory)
and the mmap threshold to glibc's own dynamic ceiling, 32 MiB (so objects
of 128 KiB..32 MiB come from the heap, where freed memory is reused, not
each from a mapping of its own, which is fresh pages every time). That is
the state glibc reaches by itself once it has freed such a mapping; it
keeps up to two batches of freed memory mapped for reuse (the peak, when
two batches are alive at once, is the same). A process that set either
threshold itself (``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_``,
or ``GLIBC_TUNABLES``) is left alone, as is any libc that is not glibc.
"""

from __future__ import annotations

import ctypes
import os

_M_TRIM_THRESHOLD = -1  # glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_MMAP_MAX = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit; mallopt refuses more
_MIN_TRIM = 64 << 20

_mallopt = None  # the function, False where it must not be used, None before the first call
_trim = 0  # the trim threshold set so far


def _find_mallopt():
    env = os.environ
    tunables = env.get("GLIBC_TUNABLES", "")
    if ("MALLOC_TRIM_THRESHOLD_" in env or "MALLOC_MMAP_THRESHOLD_" in env or "trim_threshold" in tunables
            or "mmap_threshold" in tunables):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - present only in glibc
        fn = libc.mallopt
    except (OSError, AttributeError):
        return False
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if fn(_M_MMAP_THRESHOLD, _MMAP_MAX) != 1:
        return False
    return fn


def reserve(nbytes: int) -> None:
    """A batch of ``nbytes`` of bytes objects was just made: keep that much freed memory for the next."""
    global _mallopt, _trim
    want = max(_MIN_TRIM, 2 * nbytes)
    if want <= _trim:
        return
    if _mallopt is None:
        _mallopt = _find_mallopt()
    if not _mallopt or _mallopt(_M_TRIM_THRESHOLD, min(want, 2**31 - 1)) != 1:
        _trim = 1 << 62  # nothing to do in this process: later calls return at once
        return
    _trim = want
