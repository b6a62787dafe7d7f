"""Build the ahead-of-time kernel module (loaded by formats/compiler/aot.py).

Why: numba's first dispatch in a process costs about 0.5 s (its typing and
lowering registries load, numba.np.random and all) even when every kernel
comes from its cache; workers pay it again. A module compiled ahead of time
by ``numba.pycc`` loads in milliseconds without numba.

The signatures are not written by hand: ``build`` exports every signature
each kernel's dispatcher compiled in this process (tools/warm.py first reads
a small dataset through every order and format, which calls every kernel
with the types a read passes), so a changed kernel needs no list updated.
A kernel or type the build did not see still works: the proxy hands it to
the JIT. Runs after ``jit.use_jit()``: it reads numba's dispatchers.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time

from shardfeed.formats.compiler import aot, jit

# types a run-time fingerprint can name exactly (aot.fingerprint); others stay with the JIT
_NAMEABLE = re.compile(r"^(bool|u?int(8|16|32|64)|float(32|64)|(readonly )?array\("
                       r"(bool|u?int(8|16|32|64)|float(32|64)), \d+d, [CFA]\))$")


def exports() -> dict:
    """Kernel name -> [(numba Signature, argument type names)] compiled in this process."""
    out: dict = {}
    for d in _dispatchers():
        if d.targetoptions.get("inline") == "always":
            continue  # an always-inlined helper is never called as a function
        name = f"{d.py_func.__module__}:{d.py_func.__qualname__}"
        for args, cres in d.overloads.items():
            names = [str(a) for a in args]
            if all(_NAMEABLE.match(n) for n in names):
                out.setdefault(name, []).append((cres.signature, names))
    return out


def _dispatchers() -> list:
    return [k.jitted if isinstance(k, aot.Kernel) else k for k in jit.REGISTRY]


def _nogil_flags(base):
    class Flags(base):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.release_gil = True  # as the JIT kernels (nogil=True): reader threads overlap

    return Flags


def build(folder: str | None = None) -> tuple[str, int, float]:
    """Compile the module into ``folder`` (default: jit.aot_dir()); returns (path, signatures, seconds).

    The module and its manifest appear together or not at all: they are
    written to a temporary folder that then replaces ``folder`` by rename."""
    if not jit.jit_in_use():
        raise RuntimeError("the AOT build reads numba's dispatchers: call jit.use_jit() and run the "
                           "kernels first (python -m shardfeed.tools.warm does)")
    import numba.pycc.compiler as pcc
    from numba.pycc import CC

    folder = folder or jit.aot_dir()
    t0 = time.perf_counter()
    found = exports()
    parent = os.path.dirname(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".aot-", dir=parent)
    try:
        module = f"sf_aot_{jit.KEY}_{os.getpid()}"  # a module name of its own per build: no clash on reload
        cc = CC(module)
        cc.output_dir = tmp
        cc.verbose = False
        manifest: dict = {}
        n = 0
        for name, sigs in sorted(found.items()):
            fn = next(d for d in _dispatchers() if f"{d.py_func.__module__}:{d.py_func.__qualname__}" == name)
            for sig, names in sigs:
                sym = f"k{n}"
                n += 1
                cc.export(sym, sig)(fn.py_func)
                manifest.setdefault(name, []).append([sym, names])
        saved = pcc.Flags
        pcc.Flags = _nogil_flags(saved)
        try:
            cc.compile()
        finally:
            pcc.Flags = saved
        so = [f for f in os.listdir(tmp) if f.startswith(module) and f.endswith((".so", ".pyd"))]
        if len(so) != 1:
            raise RuntimeError(f"pycc left {sorted(os.listdir(tmp))} in {tmp}, not one extension module")
        with open(os.path.join(tmp, so[0]), "rb") as f:
            digest = aot.file_digest(f.read())
        with open(os.path.join(tmp, aot.MANIFEST), "w") as f:
            json.dump({"format": aot.FORMAT, "key": jit.KEY, "versions": aot._versions(), "module": module,
                       "file": so[0], "digest": digest, "kernels": manifest}, f, indent=1)
        for junk in os.listdir(tmp):
            if junk.endswith((".o", ".c")):
                os.remove(os.path.join(tmp, junk))
        if os.path.exists(folder):
            old = tempfile.mkdtemp(prefix=".aot-old-", dir=parent)
            os.rename(folder, os.path.join(old, "aot"))
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not os.path.isdir(folder):
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # a build running beside this one finished first
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return os.path.join(folder, so[0]), n, time.perf_counter() - t0
