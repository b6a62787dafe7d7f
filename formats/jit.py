"""``njit``: numba's jit with an on-disk cache that cannot go stale.

numba's cache checks only the source file of the function it compiled. A
kernel that inlines (or calls) a jitted function of another module keeps
running the old machine code after that module changes: a mutation test
found ``sequences.py`` still permuting with an old ``permute_one``, and the
suite passed a broken permutation until the cache was cleared. So the cache
lives in a folder keyed by a hash of every module of the packages that hold
kernels (formats/, shuffling/): any change to any of them starts a fresh
cache, whether in development, in ``make test`` or after an upgrade in place.

Set NUMBA_CACHE_DIR to choose the folder yourself (then the key is yours to
manage). Old folders under ``~/.cache/shardfeed/numba`` can be deleted at
any time; the next import compiles again (a one-time cost of seconds).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os

import numba

_KERNEL_PACKAGES = ("shardfeed.formats", "shardfeed.shuffling")


def _package_dirs() -> list[str]:
    dirs = []
    for name in _KERNEL_PACKAGES:
        spec = importlib.util.find_spec(name)  # does not import the package itself
        if spec is not None and spec.submodule_search_locations:
            dirs.extend(spec.submodule_search_locations)
    return dirs


def source_key(dirs) -> str:
    """A hash of every .py file (name and bytes) in ``dirs``."""
    h = hashlib.blake2b(digest_size=8)
    for d in dirs:
        for name in sorted(os.listdir(d)):
            if name.endswith(".py"):
                h.update(name.encode() + b"\0")
                with open(os.path.join(d, name), "rb") as f:
                    h.update(f.read())
    return h.hexdigest()


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "shardfeed", "numba", source_key(_package_dirs()))


if not os.environ.get("NUMBA_CACHE_DIR"):
    # read by numba when a cached function is decorated, so this runs before any kernel module
    numba.config.CACHE_DIR = cache_dir()

njit = functools.partial(numba.njit, cache=True)
