"""Package namespaces whose public names are imported on first use (PEP 562).

`import shardfeed.loader` (or `.formats`, `.cache`, `.shuffling`) loads no
submodule: each public name is imported from its submodule the first time it
is asked for (`from shardfeed.loader import Loader` imports loader.py and
what it needs, not pyarrow.parquet or the streaming and mixture code). A
fresh process thus pays only for what it uses: a training script that reads
local tar shards never imports the Parquet reader, fsspec or numba.
"""

from __future__ import annotations

import importlib
import importlib.util


def exports(package: str, names: dict[str, str]):
    """``(__getattr__, __dir__)`` for ``package`` whose public ``names`` map to the submodule (relative to
    the package) that defines each; other attributes that name a submodule import it."""

    def __getattr__(name: str):
        module = names.get(name)
        if module is not None:
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
