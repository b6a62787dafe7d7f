"""Each order's epoch sequence G: position g in range(n) -> sample id.

G is the order of the whole epoch before it is dealt to ranks. It is never
materialised: ``ids(g)`` evaluates any positions, ``ids_range(a, b)`` a
contiguous run (the fast path when a rank reads a contiguous part of G).
Ids here are relative to the first shard of the plan; the plan adds the
offset of that shard.
"""

from __future__ import annotations

import numpy as np

from shardfeed.formats.compiler.jit import njit
from shardfeed.shuffling.keys import STREAM_GLOBAL, STREAM_SHARDS, STREAM_WINDOWS, derive_key, epoch_key
from shardfeed.shuffling.permutation import (
    Permutation,
    _encrypt,
    _encrypt_lr,
    _walk_out,
    feistel_params,
    permute_one,
)


@njit(inline="always")
def _bisect_right_in(a, x, lo, hi):
    # Largest k in [lo, hi) with a[k] <= x, for sorted a with a[lo] <= x (empty
    # shards repeat an offset; taking the last equal one skips them). A window's
    # few shards are searched by passing that window's bounds.
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if a[mid] <= x:
            lo = mid
        else:
            hi = mid
    return lo


@njit(inline="always")
def _bisect_right(a, x):
    return _bisect_right_in(a, x, 0, a.shape[0])


@njit
def _concat_ids(g, soff, order, offsets, out):
    for j in range(g.shape[0]):
        t = _bisect_right(soff, g[j])
        out[j] = offsets[order[t]] + g[j] - soff[t]


@njit
def _block_ids(g, wstart, wa, wb, wkeys, soff, order, offsets, block, out):
    w = 0
    for j in range(g.shape[0]):
        x = g[j]
        # Reads run through a window: reuse the last window when x is in it.
        if not (wstart[w] <= x < wstart[w + 1]):
            w = _bisect_right(wstart, x)
        size = wstart[w + 1] - wstart[w]
        q = wstart[w] + permute_one(x - wstart[w], size, wa[w], wb[w], wkeys[w])
        t = _bisect_right_in(soff, q, w * block, min((w + 1) * block, soff.shape[0] - 1) + 1)
        out[j] = offsets[order[t]] + q - soff[t]


class Sequence:
    """Base: n positions; subclasses map positions to ids."""

    n: int = 0

    def ids(self, g: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def ids_range(self, a: int, b: int) -> np.ndarray:
        return self.ids(np.arange(a, b, dtype=np.int64))


class InOrder(Sequence):
    """`none`: shards in stored order, samples in stored order."""

    def __init__(self, counts: np.ndarray):
        self.n = int(counts.sum())

    def ids(self, g):
        return np.asarray(g, dtype=np.int64).copy()

    def ids_range(self, a, b):
        return np.arange(a, b, dtype=np.int64)


class GlobalPermuted(Sequence):
    """`global`: one keyed permutation of every sample."""

    def __init__(self, counts: np.ndarray, seed: int, epoch: int):
        self.n = int(counts.sum())
        self.perm = Permutation(self.n, epoch_key(seed, epoch, STREAM_GLOBAL))

    def ids(self, g):
        return self.perm.take(g)

    def ids_range(self, a, b):
        return self.perm.range(a, b)


def shard_order(num_shards: int, seed: int, epoch: int) -> np.ndarray:
    """The epoch's shuffled shard order (shards are few: an array is fine)."""
    return Permutation(num_shards, epoch_key(seed, epoch, STREAM_SHARDS)).range(0, num_shards)


class ShardsShuffled(Sequence):
    """`shard`: whole shards in a shuffled order, samples in stored order.

    The bounded sample buffer is applied per rank after dealing (buffer.py),
    as WebDataset does after splitting shards by node.
    """

    def __init__(self, counts: np.ndarray, seed: int, epoch: int):
        self.n = int(counts.sum())
        self.order = shard_order(counts.shape[0], seed, epoch)
        self.offsets = np.zeros(counts.shape[0] + 1, dtype=np.int64)
        np.cumsum(counts, out=self.offsets[1:])
        self.soff = np.zeros(counts.shape[0] + 1, dtype=np.int64)
        np.cumsum(counts[self.order], out=self.soff[1:])

    def ids(self, g):
        g = np.ascontiguousarray(g, dtype=np.int64).reshape(-1)
        out = np.empty_like(g)
        _concat_ids(g, self.soff, self.order, self.offsets, out)
        return out


class Windows(Sequence):
    """`block`: shuffled shards in windows of W; samples permuted per window."""

    def __init__(self, counts: np.ndarray, seed: int, epoch: int, block_shards: int):
        ns = counts.shape[0]
        self.n = int(counts.sum())
        self.order = shard_order(ns, seed, epoch)
        self.offsets = np.zeros(ns + 1, dtype=np.int64)
        np.cumsum(counts, out=self.offsets[1:])
        self.soff = np.zeros(ns + 1, dtype=np.int64)
        np.cumsum(counts[self.order], out=self.soff[1:])
        self.block = block_shards
        nwin = max(1, -(-ns // block_shards))
        self.wstart = self.soff[np.minimum(np.arange(nwin + 1) * block_shards, ns)]
        sizes = np.diff(self.wstart)
        self.wa = np.empty(nwin, dtype=np.int64)
        self.wb = np.empty(nwin, dtype=np.int64)
        self.wkeys = np.empty((nwin, len(feistel_params(1, 0)[2])), dtype=np.uint64)
        base = epoch_key(seed, epoch, STREAM_WINDOWS)
        for w in range(nwin):
            a, b, rk = feistel_params(int(sizes[w]), derive_key(base, w))
            self.wa[w], self.wb[w], self.wkeys[w] = a, b, rk

    def ids(self, g):
        g = np.ascontiguousarray(g, dtype=np.int64).reshape(-1)
        out = np.empty_like(g)
        _block_ids(g, self.wstart, self.wa, self.wb, self.wkeys, self.soff, self.order, self.offsets, self.block, out)
        return out


@njit
def _strided_perm(start, stop, w, s, cw, length, n, a, b, rkeys, out):
    # Fused deal + permutation for `global` plans that cover the whole epoch:
    # rank position p -> dealt position -> padding folded -> perm.
    if w == 1:
        # v = p*s + cw steps by s: keep v split as (left, right) for the
        # Feistel and add s's split each step, no division per value.
        v = start * s + cw
        left = v // b
        right = v - left * b
        ds_left = s // b
        ds_right = s - ds_left * b
        for j in range(stop - start):
            if v < length:
                out[j] = _encrypt_lr(left, right, a, b, rkeys)
            else:
                out[j] = _encrypt(v % length, a, b, rkeys)
            v += s
            left += ds_left
            right += ds_right
            if right >= b:
                right -= b
                left += 1
    else:
        for j in range(stop - start):
            p = start + j
            v = (p // w) * s + cw + p % w
            if v >= length:
                v = v % length
            out[j] = _encrypt(v, a, b, rkeys)
    _walk_out(out, n, a, b, rkeys)


def strided_global_ids(seq: GlobalPermuted, start, stop, w, s, cw, length) -> np.ndarray:
    out = np.empty(stop - start, np.int64)
    p = seq.perm
    _strided_perm(start, stop, w, s, cw, length, p.n, p._a, p._b, p._rkeys, out)
    return out
