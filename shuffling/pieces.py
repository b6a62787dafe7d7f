"""The part of an epoch a plan still has to deliver, as pieces of G.

A fresh plan covers all of G: one piece [0, n). After an elastic re-plan it
covers what the old ranks had not consumed: runs of G (one per old rank's
unread tail) and, where old ranks stopped inside a shuffle buffer or a
locality window, a few explicit positions. The pieces, in order, form the
plan's virtual sequence V; ``to_g`` maps V positions to G positions. Memory
is O(pieces + explicit positions), never O(n).
"""

from __future__ import annotations

import numpy as np


class Pieces:
    __slots__ = ("starts", "src", "explicit", "pool", "length")

    def __init__(self, starts, src, explicit, pool):
        self.starts = np.asarray(starts, dtype=np.int64)  # V offset of each piece, plus the end
        self.src = np.asarray(src, dtype=np.int64)  # G start (range piece) or pool start (explicit)
        self.explicit = np.asarray(explicit, dtype=bool)
        self.pool = np.asarray(pool, dtype=np.int64)  # G positions of explicit pieces
        self.length = int(self.starts[-1])

    @classmethod
    def whole(cls, n: int) -> Pieces:
        return cls([0, n], [0], [False], np.empty(0, np.int64))

    @property
    def is_whole(self) -> bool:
        return self.src.shape[0] == 1 and not self.explicit[0] and self.src[0] == 0

    def __len__(self) -> int:
        return self.length

    def to_g(self, v: np.ndarray) -> np.ndarray:
        """G positions of V positions (each in range(length))."""
        v = np.asarray(v, dtype=np.int64)
        if self.is_whole:
            return v
        k = np.searchsorted(self.starts, v, side="right") - 1
        off = v - self.starts[k]
        g = self.src[k] + off
        ex = self.explicit[k]
        if ex.any():
            g[ex] = self.pool[g[ex]]
        return g

    def runs(self, a: int, b: int):
        """(is_range, g_start or pool slice start, length) pieces covering V[a:b]."""
        if a >= b:
            return
        k = int(np.searchsorted(self.starts, a, side="right")) - 1
        while a < b:
            end = min(b, int(self.starts[k + 1]))
            off = a - int(self.starts[k])
            yield (not bool(self.explicit[k])), int(self.src[k]) + off, end - a
            a = end
            k += 1

    def select(self, items) -> Pieces:
        """New pieces from items over V: ("range", a, b) or ("array", v_positions)."""
        starts, src, explicit, pool = [0], [], [], []
        pool_len = 0

        def add(is_range, s, length, arr=None):
            nonlocal pool_len
            if length <= 0:
                return
            if is_range and src and not explicit[-1] and src[-1] + (starts[-1] - starts[-2]) == s:
                starts[-1] += length  # extends the previous run of G
                return
            if is_range:
                src.append(s)
                explicit.append(False)
            else:
                pool.append(arr)
                src.append(pool_len)
                explicit.append(True)
                pool_len += length
            starts.append(starts[-1] + length)

        for item in items:
            if item[0] == "range":
                for is_range, s, length in self.runs(int(item[1]), int(item[2])):
                    if is_range:
                        add(True, s, length)
                    else:
                        add(False, 0, length, self.pool[s : s + length])
            else:
                arr = np.asarray(item[1], dtype=np.int64)
                add(False, 0, arr.shape[0], self.to_g(arr))
        if not src:
            return Pieces([0, 0], [0], [False], np.empty(0, np.int64))
        return Pieces(starts, src, explicit, np.concatenate(pool) if pool else np.empty(0, np.int64))
