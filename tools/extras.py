"""Optional dependencies: imported only by the commands that need them.

matplotlib (plots) and psutil (RSS of process trees) serve the benchmarks
and the trainer's plot, not training: they are in the ``bench`` extra, so a
trainer that imports shardfeed neither installs nor loads them.
"""

from __future__ import annotations

import importlib

INSTALL = "pip install 'shardfeed[bench]' (from a clone: pip install -e '.[bench]')"


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message says how to install it."""


def require(module: str, purpose: str):
    """``import module`` for ``purpose``; MissingExtra naming the install command if it is absent."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".", 1)[0]
        raise MissingExtra(f"{purpose} needs {top}, which is not installed: {INSTALL}") from e
