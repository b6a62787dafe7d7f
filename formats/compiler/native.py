"""Raw memory primitives for the jitted batch gather (numba intrinsics, in intrinsics.py).

Why these exist: numba compiles ``dst[a:b] = src[c:d]`` for uint8 arrays into
a checked element loop that first copies the source aside when the arrays
might overlap; measured here at 1.8-2.7 GB/s, against 30 GB/s for memcpy
(and 16 GB/s for numpy slice assignment). ``copy`` emits llvm.memcpy. The
gather also reads several tables of many open shards in one call, so it
takes their addresses (``load_i64``) instead of a dozen array arguments per
shard: numba's per-call type dispatch costs about 1 us per argument.

``hash_fn()`` is the address of the C ``XXH3_64bits(ptr, len)`` that the
``xxhash`` extension module exports (the very code behind
``xxhash.xxh3_64_intdigest``), so checksums run inside the jitted loop with
no Python call per sample. It is checked against ``xxh3_64_intdigest`` at
first use; if the symbol is missing or disagrees, it is 0 and callers hash in
Python instead. Nothing here checks bounds: callers do, before every access.

The intrinsics are defined in intrinsics.py, which imports numba: while the
compiled kernel module serves (formats/compiler/jit.py), the names here are
placeholders that ``jit.use_jit`` resolves, so reading never imports numba.
"""

from __future__ import annotations

import ctypes
import os

import xxhash

from shardfeed.formats.compiler.jit import deferred

_INTRINSICS = "shardfeed.formats.compiler.intrinsics"
copy = deferred(_INTRINSICS, "copy")
load_i64 = deferred(_INTRINSICS, "load_i64")
call_hash = deferred(_INTRINSICS, "call_hash")
call_preadv = deferred(_INTRINSICS, "call_preadv")
call_state = deferred(_INTRINSICS, "call_state")
call_update = deferred(_INTRINSICS, "call_update")


_HASH_FN: int | None = None


def hash_fn() -> int:
    """Address of a C XXH3_64bits equal to ``xxhash.xxh3_64_intdigest``, or 0."""
    global _HASH_FN
    if _HASH_FN is None:
        _HASH_FN = _find_xxh3()
    return _HASH_FN


def _libraries() -> list[str]:
    """The xxhash extension's shared libraries (``_xxhash*.so``), by name. A listing, not ``glob``: glob's
    first use compiles its pattern machinery (~0.15 ms of a fresh process's first batch)."""
    here = os.path.dirname(xxhash.__file__)
    return [os.path.join(here, n) for n in sorted(os.listdir(here)) if n.startswith("_xxhash") and n.endswith(".so")]


def _probes() -> list[bytes]:
    """Inputs on which a C function must agree with ``xxh3_64_intdigest``: empty, short, each of XXH3's
    length classes, and long inputs over many 1 KiB blocks with a partial stripe at the end. The long
    ones repeat 4,099 random bytes (a period no stripe or block divides), not 100 KB of ``os.urandom``:
    drawing those was a third of the check, paid twice at every fresh process's first batch."""
    r = os.urandom(4099)
    return [b"", b"a", b"x" * 17, r[:129], r[:240], bytes(range(256)) * 9, r, (r * 25)[:100_003]]


def _find_xxh3() -> int:
    if os.environ.get("SHARDFEED_NO_NATIVE_XXH3"):
        return 0
    probes = _probes()
    # XXH3_64bits_dispatch first: the same function with its long-input loop chosen for this CPU
    # (AVX2 where there is one), as xxh3_64_intdigest runs it; plain XXH3_64bits is the SSE2 build,
    # about half as fast on long inputs (measured: 11% of a 100 KiB batch read hashing with SSE2)
    for path in _libraries():
        for name in ("XXH3_64bits_dispatch", "XXH3_64bits"):
            try:
                f = getattr(ctypes.CDLL(path), name)
            except (OSError, AttributeError):
                continue
            f.restype, f.argtypes = ctypes.c_uint64, [ctypes.c_char_p, ctypes.c_size_t]
            if all(f(p, len(p)) == xxhash.xxh3_64_intdigest(p) for p in probes):
                return ctypes.cast(f, ctypes.c_void_p).value or 0
    return 0


_STREAM: tuple | None = None


def stream_hash() -> tuple:
    """(reset, update, digest, create_state, free_state): addresses of xxhash's streaming XXH3_64bits
    functions from the same library, checked to give ``xxh3_64_intdigest`` of the pieces joined; ()
    where they are missing or disagree (then a batch's fields are never gathered apart, into_bytes.py)."""
    global _STREAM
    if _STREAM is None:
        _STREAM = _find_stream() if hash_fn() else ()
    return _STREAM


def _find_stream() -> tuple:
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    r = _probes()[-2]
    for path in _libraries():
        try:
            lib = ctypes.CDLL(path)
            update = getattr(lib, "XXH3_64bits_update_dispatch", None) or lib.XXH3_64bits_update
            fns = (lib.XXH3_64bits_reset, update, lib.XXH3_64bits_digest, lib.XXH3_createState,
                   lib.XXH3_freeState)
        except (OSError, AttributeError):
            continue
        reset, update, digest, create, free = fns
        reset.restype, reset.argtypes = ctypes.c_int, [vp]
        update.restype, update.argtypes = ctypes.c_int, [vp, vp, sz]
        digest.restype, digest.argtypes = ctypes.c_uint64, [vp]
        create.restype, create.argtypes = vp, []
        free.restype, free.argtypes = ctypes.c_int, [vp]
        state = create()
        if not state:
            continue
        try:
            ok = True
            for pieces in ([b""], [b"a", b""], [(r * 25)[:100_003], b"7"], [b"x" * 300, r, b"12"], [r[:100], r[100:]]):
                reset(state)
                for p in pieces:
                    update(state, p, len(p))
                ok = ok and digest(state) == xxhash.xxh3_64_intdigest(b"".join(pieces))
        finally:
            free(state)
        if ok:
            return tuple(ctypes.cast(f, vp).value or 0 for f in fns)
    return ()


def preadv_fn() -> int:
    """Address of libc's preadv, or 0 where there is none (reads then copy from the mapping)."""
    try:
        return ctypes.cast(ctypes.CDLL(None).preadv, ctypes.c_void_p).value or 0
    except (OSError, AttributeError):
        return 0

