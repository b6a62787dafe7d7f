"""``njit``: shardfeed's kernels, ahead-of-time compiled when possible, else numba's JIT.

Two ways to run a kernel, chosen once, at the first kernel call (not at import):

- AOT: ``python -m shardfeed.tools.warm`` (run by ``make venv``; also
  ``shardfeed warm``) compiles every signature the kernels were called with
  into one extension module (formats/compiler/aot_build.py). When that module exists
  for these exact sources, ``njit`` returns a thin proxy (formats/compiler/aot.py) that
  calls it, and numba is not even imported: a fresh process reads its first
  batch without numba's ~0.5 s set-up.
- JIT: otherwise (no module yet, no C compiler, ``SHARDFEED_AOT=0``) numba's
  jit with an on-disk cache serves. A proxy that meets argument types the
  module does not hold switches the process to this mode (``use_jit``) and
  carries on; without a module every proxy does so at its first call, so
  numba is imported when a kernel first runs, not when its module is.

The caches cannot go stale: numba's cache checks only the source file of the
function it compiled, so a kernel that inlines a jitted function of another
module would keep running old machine code after that module changed (a
mutation test found ``sequences.py`` still permuting with an old
``permute_one``). Both caches live in a folder keyed by a hash of every module
of the packages that hold kernels (formats/, shuffling/): any change to any of
them starts a fresh folder, whether in development, in ``make test`` or after
an upgrade in place.

Set NUMBA_CACHE_DIR to choose numba's folder yourself (then the key is yours
to manage). Every process that loads kernels from a folder touches its
``last-used`` file, and ``shardfeed warm`` removes the folders of other
sources unused for ``--keep-days`` (14 by default): one folder per source
change piles up otherwise (~1 MB each, hundreds during development). Any
folder can also be deleted by hand at any time; the next run compiles again
(a one-time cost of seconds).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import logging
import os
import sys
import threading

log = logging.getLogger("shardfeed")

_KERNEL_PACKAGES = ("shardfeed.formats", "shardfeed.shuffling", "shardfeed.cache")
AOT_ENV = "SHARDFEED_AOT"  # "0": never load the compiled module (tests, debugging)


def _package_dirs() -> list[str]:
    dirs = []
    for name in _KERNEL_PACKAGES:
        spec = importlib.util.find_spec(name)  # does not import the package itself
        if spec is not None and spec.submodule_search_locations:
            dirs.extend(spec.submodule_search_locations)
    return dirs


def _sources(dirs) -> list[tuple[str, str]]:
    """(name relative to its folder, path) of every .py file under ``dirs``, in a fixed order: a folder's
    files by name, then its subfolders by name (os.walk's order; scandir without its relpath calls is
    about twice as fast, and every fresh process's first kernel call pays this)."""
    out: list = []

    def walk(top: str, rel: str) -> None:
        with os.scandir(top) as it:
            entries = sorted(it, key=lambda e: e.name)
        out.extend((rel + e.name, e.path) for e in entries if e.name.endswith(".py") and not e.is_dir())
        for e in entries:
            if e.is_dir() and not e.is_symlink() and e.name != "__pycache__":  # os.walk: no links followed
                walk(e.path, rel + e.name + os.sep)

    for d in dirs:
        walk(d, "")
    return out


def source_key(dirs) -> str:
    """A hash of every .py file (path and bytes) under ``dirs``, subfolders included."""
    h = hashlib.blake2b(digest_size=8)
    for rel, path in _sources(dirs):
        h.update(rel.encode() + b"\0")
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


_MEMO = "source-keys.json"
_MEMO_ENTRIES = 16  # stamps kept (a few checkouts and venvs); older ones are dropped


def _base() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "shardfeed", "numba")


def memo_source_key(dirs, memo: str | None = None) -> str:
    """``source_key(dirs)``, remembered by the files' (name, size, mtime, ctime, inode): reading and
    hashing every source file cost a fresh process ~5-13 ms of its start, their stat ~0.3 ms. Any
    write to a file moves its ctime (which no program can set back) and a file replaced by a rename
    has another inode, so a changed source never meets its old stamp."""
    memo = memo or os.path.join(_base(), _MEMO)
    h = hashlib.blake2b(digest_size=16)
    for rel, path in _sources(dirs):
        st = os.stat(path)
        h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}\0".encode())
    stamp = h.hexdigest()
    try:
        with open(memo) as f:
            known = json.load(f)
        if not isinstance(known, dict):
            known = {}
    except (OSError, ValueError):
        known = {}
    key = known.get(stamp)
    if isinstance(key, str) and len(key) == 16 and all(c in "0123456789abcdef" for c in key):
        return key
    key = source_key(dirs)
    known = {k: v for k, v in list(known.items())[-(_MEMO_ENTRIES - 1):]}
    known[stamp] = key
    tmp = f"{memo}.tmp-{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(memo), exist_ok=True)
        with open(tmp, "w") as f:
            json.dump(known, f)
        os.replace(tmp, memo)
    except OSError:  # a read-only cache: the key is computed each time, as before
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return key


_lazy: dict = {}  # "KEY", "AOT" once computed (module __getattr__ below)


def key() -> str:
    """These sources' key (``KEY``): computed at the first use, not at import (issue #24)."""
    k = _lazy.get("KEY")
    if k is None:
        k = _lazy["KEY"] = memo_source_key(_package_dirs())
    return k


def cache_dir() -> str:
    return os.path.join(_base(), key())


def aot_dir() -> str:
    """Where the compiled module of these sources lives: beside numba's cache, one folder per
    Python, numpy and numba install, so several venvs sharing the cache each keep their own
    (one folder would be rebuilt by each venv in turn, and the others would fall back to the JIT)."""
    from shardfeed.formats.compiler import aot

    env = hashlib.blake2b(json.dumps(aot._versions(), sort_keys=True).encode(), digest_size=6).hexdigest()
    return os.path.join(cache_dir(), f"aot-{env}")


def _configure(numba) -> None:
    if not os.environ.get("NUMBA_CACHE_DIR"):
        # read by numba when a cached function is decorated, so this runs before any kernel is
        numba.config.CACHE_DIR = cache_dir()


# Every kernel decorated so far, in either mode: the build reads their signatures.
REGISTRY: list = []
_lock = threading.Lock()
_numba_njit = None  # numba.njit once the JIT is in use


LAST_USED = "last-used"


def touch_used(folder: str) -> None:
    """Mark ``folder`` as used now (its ``last-used`` file's mtime), so `shardfeed warm` keeps it."""
    try:
        os.utime(os.path.join(folder, LAST_USED))
    except FileNotFoundError:
        try:
            open(os.path.join(folder, LAST_USED), "a").close()
        except OSError:
            pass  # a read-only cache: nothing to prune there either
    except OSError:
        pass


def _load_aot():
    if os.environ.get(AOT_ENV, "1").strip() in ("0", "false", "no", "off"):
        return None
    from shardfeed.formats.compiler import aot

    loaded = aot.load(aot_dir(), key())
    if loaded is not None:
        touch_used(cache_dir())
    return loaded


def aot_module():
    """The compiled module (``AOT``: an aot.Loaded, or None: JIT mode), loaded at the first kernel call
    rather than when a module with kernels is imported: finding it (the sources' key, ~70 stats) and
    loading it cost ~6 ms, which ``import shardfeed.loader`` no longer pays (issue #24)."""
    if "AOT" not in _lazy:
        with _lock:
            if "AOT" not in _lazy:
                _lazy["AOT"] = _load_aot()
    return _lazy["AOT"]


def __getattr__(name: str):
    # KEY and AOT read as module attributes, as before, computed on first use
    if name == "KEY":
        return key()
    if name == "AOT":
        return aot_module()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _jit(fn, options):
    d = _numba_njit(cache=True, **options)(fn)
    REGISTRY.append(d)
    return d


def use_jit(reason: str = "") -> None:
    """Switch this process to numba's JIT (imports numba; idempotent).

    Every proxy gets its numba dispatcher, and each shardfeed module's global
    that names a proxy or a deferred intrinsic is rebound to the real thing,
    because numba compiles a kernel against the globals of its module."""
    global _numba_njit
    with _lock:
        if _numba_njit is not None:
            return
        import numba

        _configure(numba)
        if os.path.isdir(cache_dir()):
            touch_used(cache_dir())
        from shardfeed.formats.compiler import aot

        if reason:
            log.info("shardfeed: using numba's JIT from now on: %s", reason)
        nj = numba.njit
        swap = {}
        for k in list(REGISTRY):
            if isinstance(k, aot.Kernel):
                k.bind(nj(cache=True, **k.options)(k.py_func))
                swap[id(k)] = k.jitted
        for d in aot.DEFERRED:
            swap[id(d)] = d.resolve()
        for name, mod in list(sys.modules.items()):
            if name.startswith("shardfeed.") and mod is not None:
                g = vars(mod)
                for attr, v in list(g.items()):
                    if id(v) in swap and isinstance(v, (aot.Kernel, aot.Deferred)):
                        g[attr] = swap[id(v)]
        _numba_njit = nj


if "numba" in sys.modules:
    _configure(sys.modules["numba"])
# Without the compiled module every kernel is still a proxy (with no compiled signature): numba is imported
# and the JIT takes over at the first kernel call, not here, so importing a module with kernels stays cheap.


def njit(fn=None, **options):
    """``numba.njit(cache=True, **options)`` once the JIT is in use, else a proxy: of the compiled module,
    or of none (then its first call switches the process to the JIT)."""
    def wrap(f):
        if _numba_njit is not None:
            return _jit(f, options)
        from shardfeed.formats.compiler import aot

        k = aot.Kernel(f, options, aot_module, use_jit)
        REGISTRY.append(k)
        return k

    return wrap(fn) if fn is not None else wrap


def jit_in_use() -> bool:
    return _numba_njit is not None


def deferred(module: str, name: str):
    """``module.name`` now in JIT mode; in AOT mode a placeholder that ``use_jit`` resolves
    (for numba intrinsics, which must not import numba while the compiled module serves)."""
    if _numba_njit is not None:
        return getattr(importlib.import_module(module), name)
    from shardfeed.formats.compiler import aot

    return aot.Deferred(module, name)
