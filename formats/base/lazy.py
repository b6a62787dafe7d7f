"""Package namespaces whose public names are imported on first use (PEP 562).

`import shardfeed.loader` (or `.formats`, `.cache`, `.shuffling`) loads no
submodule: each public name is imported from its submodule the first time it
is asked for (`from shardfeed.loader import Loader` imports loader.py and
what it needs, not pyarrow.parquet or the streaming and mixture code). A
fresh process thus pays only for what it uses: a training script that reads
local tar shards never imports the Parquet reader, fsspec or numba.

``gc_paused``: the cyclic collector is paused while those imports, the
dataset's opening and the first batch run. Right after ``import torch`` the
collector is a few thousand allocations away from a full pass over torch's
~170,000 objects (60-180 ms here); without the pause that pass lands inside
shardfeed's start-up. Paused, it runs later, in whatever code allocates
next, as in a program without shardfeed (``gc.freeze()`` after the imports
spares it altogether). Nothing is left uncollected: the collector's state is
restored on the way out, and a collector the program had disabled stays so.

``lazy_module``: a module-level name for a dependency that only some paths of
a module use (pyarrow in the modules the tar read path shares with Parquet
and Arrow shards), imported at its first attribute read.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
from contextlib import contextmanager


@contextmanager
def gc_paused():
    """Automatic garbage collection off for the block (or a decorated function), then as it was."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def first_gc_paused(items):
    """``items`` with the collector paused while the first one is made (see ``gc_paused``)."""
    with gc_paused():
        first = [next(items, _END)]
    if first[0] is _END:
        return
    # popped, not kept in this frame: a first batch whose values are objects of their own (bytes
    # gathered into, formats/engine/into_bytes.py) would otherwise stay alive the whole epoch
    yield first.pop()
    yield from items


_END = object()


class _LazyModule:
    """Stands for module ``name`` bound to ``alias`` in ``namespace``: the first attribute read imports it
    and rebinds ``alias`` to the real module, so later reads cost nothing extra.

    Not importlib.util.LazyLoader: that puts a half-made module into sys.modules at once, so every
    ``"pyarrow" in sys.modules`` check (ours, and libraries' that convert to Arrow when it is loaded)
    would see it imported and load it."""

    __slots__ = ("_name", "_namespace", "_alias")

    def __init__(self, name: str, namespace: dict, alias: str):
        self._name, self._namespace, self._alias = name, namespace, alias

    def __getattr__(self, attr: str):
        module = importlib.import_module(self._name)
        if self._namespace.get(self._alias) is self:
            self._namespace[self._alias] = module
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<{self._name}, imported on first use>"


def lazy_module(name: str, namespace: dict, alias: str):
    """``alias = lazy_module(name, globals(), alias)``: ``import name as alias`` at the first use of ``alias``."""
    return _LazyModule(name, namespace, alias)


def exports(package: str, names: dict[str, str]):
    """``(__getattr__, __dir__)`` for ``package`` whose public ``names`` map to the submodule (relative to
    the package) that defines each; other attributes that name a submodule import it."""

    def __getattr__(name: str):
        module = names.get(name)
        if module is not None:
            with gc_paused():
                value = getattr(importlib.import_module(f"{package}.{module}"), name)
        elif not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}") is not None:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(importlib.import_module(package), name, value)  # later lookups skip this function
        return value

    def __dir__():
        return sorted(set(names) | set(vars(importlib.import_module(package))))

    return __getattr__, __dir__
