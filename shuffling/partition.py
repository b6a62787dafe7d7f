"""Dealing the epoch's sequence V to ranks: equal (or weighted) shares.

With unit weights w (the topology's weights over their gcd; all 1 without
weights) and S = sum(w), the epoch has R "rounds" of S samples:
R = ceil(L / S), or floor(L / S) with drop_last, for L = len(V). Rank r
takes R * w[r] samples. So padding repeats at most S-1 samples (world_size-1
with equal weights) and drop_last skips at most S-1; with weights equal to
the per-rank batch sizes, S-1 is less than one global step.

Padding positions L, L+1, ... of the dealt sequence V' repeat V[0], V[1],
... (the first samples of the epoch); position v of V' is V[v mod L].

Two layouts of V' over ranks:

- contiguous: rank r reads V'[R*cw[r] : R*cw[r+1]] (cw = cumulative
  weights). Each rank reads its own run of shards or windows (locality).
- strided: rank r's position p is V'[(p // w[r]) * S + cw[r] + p % w[r]],
  i.e. round j gives every rank w[r] consecutive samples. The first t
  rounds are a prefix of V, so when all ranks have taken the same number of
  steps the consumed samples are exactly V[:t*S], and a global batch is a
  contiguous slice of the global permutation.
"""

from __future__ import annotations

import numpy as np

from shardfeed.formats.base.records import SlotRecord


class Deal(SlotRecord):
    # a SlotRecord, not a dataclass: a dataclass compiles its methods at import (issue #24); not frozen: nothing assigns to it
    __slots__ = ("length", "weights", "drop_last", "strided")

    def __init__(self, length: int, weights: tuple[int, ...], drop_last: bool, strided: bool):
        self.length = length
        self.weights = weights
        self.drop_last = drop_last
        self.strided = strided

    @property
    def world_size(self) -> int:
        return len(self.weights)

    @property
    def round_size(self) -> int:
        return sum(self.weights)

    @property
    def rounds(self) -> int:
        s = self.round_size
        return self.length // s if self.drop_last else -(-self.length // s)

    @property
    def padded(self) -> int:
        return max(0, self.rounds * self.round_size - self.length)

    @property
    def dropped(self) -> int:
        return max(0, self.length - self.rounds * self.round_size)

    def cum_weight(self, rank: int) -> int:
        return sum(self.weights[:rank])

    def count(self, rank: int) -> int:
        return self.rounds * self.weights[rank]

    def dealt(self, rank: int, p: np.ndarray) -> np.ndarray:
        """Positions in V' (padding not yet folded) of rank positions p."""
        p = np.asarray(p, dtype=np.int64)
        if not self.strided:
            return p + self.rounds * self.cum_weight(rank)
        w = self.weights[rank]
        if w == 1:
            return p * self.round_size + self.cum_weight(rank)
        return (p // w) * self.round_size + self.cum_weight(rank) + p % w

    def fold(self, v: np.ndarray) -> np.ndarray:
        """V positions of V' positions: padding repeats the start of V."""
        if self.padded:
            v = np.where(v >= self.length, v % max(1, self.length), v)
        return v
