"""A reused batch buffer, grown as batches need.

A fresh buffer per batch costs a page fault per 4 KiB: malloc hands out new
mmapped pages for large blocks. The columns made in it are valid until it is
handed out again.
"""

from __future__ import annotations

import numpy as np


class Scratch:
    """``alloc(n)``: n bytes of one kept array, grown by a quarter more than asked when too small."""

    def __init__(self):
        self._buf: np.ndarray | None = None

    def alloc(self, n: int) -> np.ndarray:
        if self._buf is None or len(self._buf) < n:
            self._buf = np.empty(max(n, int(n * 1.25)), np.uint8)
        return self._buf[:n]
