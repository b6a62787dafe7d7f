"""Calling the ahead-of-time compiled kernels (built by formats/compiler/aot_build.py).

The module is numba's ``pycc`` output: one C function per (kernel, signature)
that the build saw, plus ``manifest.json`` naming, for each kernel, its
symbols and their argument types (numba's own type names). pycc's wrappers
check nothing: an int32 array passed where an int64 one was compiled is read
as int64, and a wrong dtype can crash the process. So ``Kernel.__call__``
types its arguments the way numba's dispatcher does (``fingerprint``) and
calls a symbol only on an exact match; anything else (a type the build never
saw) switches the process to numba's JIT (jit.use_jit), which compiles it.

This module and the compiled one import neither numba nor llvmlite.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import logging
import mmap
import os
import sys

import numpy as np

log = logging.getLogger("shardfeed")

MANIFEST = "manifest.json"
FORMAT = 1

# numba's names for the numpy dtypes kernels take; other dtypes always go to the JIT
_DTYPES = {np.dtype(t): str(np.dtype(t)) for t in
           ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64")}
_SCALARS = {bool: "bool", float: "float64", **{d.type: name for d, name in _DTYPES.items()}}
_C, _F, _W = 0x1, 0x2, 0x400  # numpy's NPY_ARRAY_C_CONTIGUOUS, _F_CONTIGUOUS, _WRITEABLE
_arrays: dict = {}


def _array_name(dtype, ndim, flags):
    name = _DTYPES.get(dtype)
    if name is None or not dtype.isnative:
        return None
    layout = "C" if flags & _C else "F" if flags & _F else "A"
    return f"{'' if flags & _W else 'readonly '}array({name}, {ndim}d, {layout})"


def fingerprint(a):
    """numba's name for the type ``numba.typeof(a)``, or None where this cannot tell."""
    t = type(a)
    if t is np.ndarray or (isinstance(a, np.ndarray) and not isinstance(a, np.ma.MaskedArray)):
        k = (a.dtype, a.ndim, a.flags.num & _CFW)
        s = _arrays.get(k)
        if s is None:
            s = _arrays[k] = _array_name(*k)
        return s
    if t is int:
        n = a.bit_length()
        return "int64" if n < 64 else "uint64" if n == 64 and a >= 0 else None
    return _SCALARS.get(t)


_CFW = _C | _F | _W
_I63 = 1 << 63
_by_flags: dict = {}  # (dtype, ndim, whole flags word) -> name, for fingerprints


def fingerprints(args, _nd=np.ndarray, _names=_by_flags, _lo=-_I63, _hi=_I63) -> tuple:
    """``tuple(map(fingerprint, args))``, inlined for the common types: this runs
    on every call (~0.2 us an argument). Arrays are looked up by their whole
    flags word, so no masking per argument; the defaults bind globals as locals."""
    out = []
    add = out.append
    for a in args:
        t = type(a)
        if t is _nd:
            k = (a.dtype, a.ndim, a.flags.num)
            s = _names.get(k)
            if s is None:
                s = _names[k] = fingerprint(a)
            add(s)
        elif t is int and _lo < a < _hi:
            add("int64")
        else:
            add(fingerprint(a))
    return tuple(out)


def file_digest(data) -> str:
    import xxhash

    return xxhash.xxh3_128_hexdigest(data)


class Loaded:
    """A compiled module and its manifest: kernel name -> {argument types: function}."""

    def __init__(self, module, kernels: dict):
        self.module = module
        self.kernels = kernels

    def variants(self, name: str) -> dict:
        return self.kernels.get(name, {})


def _versions() -> dict:
    # numba's installed files, not importlib.metadata (0.1 s) nor numba itself: an upgrade rewrites them
    spec = importlib.util.find_spec("numba")
    origin = spec.origin if spec is not None and spec.origin else ""
    stamp = os.stat(origin).st_mtime_ns if origin else 0
    return {"python": sys.implementation.cache_tag, "numpy": np.__version__, "numba": f"{origin}@{stamp}"}


def load(folder: str, key: str) -> Loaded | None:
    """The compiled module of sources ``key`` in ``folder``, or None (then the JIT serves)."""
    path = os.path.join(folder, MANIFEST)
    try:
        with open(path) as f:
            man = json.load(f)
    except FileNotFoundError:
        log.info("shardfeed: no compiled kernels for these sources in %s; numba's JIT serves "
                 "(about 0.5 s more per fresh process). Run `shardfeed warm` once to build them.", folder)
        return None
    except (OSError, ValueError) as e:
        log.info("shardfeed: ignoring unreadable %s (%s); numba's JIT serves", path, e)
        return None
    try:
        if man.get("format") != FORMAT or man.get("key") != key:
            raise ValueError(f"built for sources {man.get('key')!r}, these are {key!r}")
        if man.get("versions") != _versions():
            raise ValueError(f"built for {man.get('versions')}, this is {_versions()}")
        so = os.path.join(folder, os.path.basename(man["file"]))
        with open(so, "rb") as f:
            # hashed in place through a read-only mapping (the library is mapped again by dlopen):
            # reading 0.8 MB into a fresh bytes object cost ~0.4 ms of a fresh process's first batch
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
                digest = file_digest(view)
        if digest != man.get("digest"):
            # checked before dlopen: a truncated library can crash the process (SIGBUS), not raise
            raise ValueError(f"{os.path.basename(so)} is damaged: its xxh3 is {digest}, the build wrote "
                             f"{man.get('digest')}")
        spec = importlib.util.spec_from_file_location(man["module"], so,
                                                      loader=importlib.machinery.ExtensionFileLoader(man["module"], so))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        kernels = {name: {tuple(args): getattr(mod, sym) for sym, args in entries}
                   for name, entries in man["kernels"].items()}
    except Exception as e:  # noqa: BLE001 - a bad module must never stop a read: the JIT serves instead
        log.info("shardfeed: ignoring the compiled kernels in %s (%s: %s); numba's JIT serves. "
                 "Rebuild them with `shardfeed warm`.", folder, type(e).__name__, e)
        return None
    return Loaded(mod, kernels)


class Kernel:
    """A jitted function served by the compiled module while its types match."""

    def __init__(self, fn, options: dict, loaded, use_jit):
        """``loaded``: the compiled module (Loaded or None), or a function that returns it, called at the
        first call of the kernel (so a process that imports kernels but runs none never loads it).
        ``use_jit(reason)``: switches the process to numba's JIT and binds every kernel (jit.use_jit),
        called when the compiled module lacks the types of a call."""
        self.py_func = self.__wrapped__ = fn
        self.options = options
        self.use_jit = use_jit
        self.name = f"{fn.__module__}:{fn.__qualname__}"
        self.__name__, self.__qualname__, self.__doc__, self.__module__ = (
            fn.__name__, fn.__qualname__, fn.__doc__, fn.__module__)
        self.jitted = None
        if callable(loaded):
            self.variants, self.built = _Pending(self, loaded), False
        else:
            self._take(loaded)

    def _take(self, loaded: Loaded | None) -> None:
        self.variants = loaded.variants(self.name) if loaded is not None else {}
        self.built = loaded is not None

    def bind(self, dispatcher) -> None:
        self.jitted = dispatcher

    def __call__(self, *args):
        if self.jitted is None:
            f = self.variants.get(fingerprints(args))
            if f is not None:
                return f(*args)
            self.use_jit(f"{self.name} was called with types {[fingerprint(a) for a in args]}, "
                         f"which the compiled module does not hold" if self.built else
                         "no compiled kernels for these sources (`shardfeed warm` builds them)")
        return self.jitted(*args)

    def __repr__(self) -> str:
        return f"<shardfeed kernel {self.name} ({len(self.variants)} compiled signatures)>"

    def __reduce__(self):
        # by name, as numba pickles a dispatcher: the compiled module is not importable by its own name
        return _kernel, (self.py_func.__module__, self.py_func.__qualname__)


class _Pending:
    """A kernel's ``variants`` until its first call: that call's lookup loads the compiled module and puts
    the real table in its place, so a call costs the same as before (no "loaded yet?" test on every call)."""

    __slots__ = ("kernel", "load")

    def __init__(self, kernel: Kernel, load):
        self.kernel, self.load = kernel, load

    def get(self, types):
        self.kernel._take(self.load())
        return self.kernel.variants.get(types)

    def __len__(self) -> int:
        return len(self.load().variants(self.kernel.name)) if self.load() is not None else 0


def _kernel(module: str, qualname: str):
    return getattr(importlib.import_module(module), qualname)


DEFERRED: list = []


class Deferred:
    """A numba intrinsic not built yet: only jitted code uses it, and jit.use_jit resolves it."""

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name
        DEFERRED.append(self)

    def resolve(self):
        return getattr(importlib.import_module(self.module), self.name)

    def __call__(self, *args):
        raise TypeError(f"{self.module}.{self.name} is a numba intrinsic: call it from jitted code only")
