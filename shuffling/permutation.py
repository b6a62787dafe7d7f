"""A keyed pseudo-random permutation of range(n): O(1) memory, random access.

A Feistel network over the mixed-radix domain Z_a x Z_b (a = ceil(sqrt(n)),
b = ceil(n / a), so n <= a*b < n + a): a round maps (L, R) to
(R, (L + F(R)) mod |L|), which is invertible whatever F is, so the whole
network is a bijection of range(a*b). Values that land in [n, a*b) are
encrypted again ("cycle walking") until they fall inside range(n); fewer than
one value in sqrt(n) needs a walk. A power-of-two Feistel would walk up to
half of all values when n sits just above a power of two, which halves the
throughput; the mixed radix avoids that for the price of one division.

F is SplitMix64's finalizer on (R xor round key), brought into range(|L|)
by a multiply-shift (Lemire) rather than a modulo. Everything that touches
values is jitted with numba; ``take`` and ``range`` loop in numba too, so
Python is crossed once per call, not once per value.
"""

from __future__ import annotations

import math

import numpy as np

from shardfeed.formats.compiler.jit import njit
from shardfeed.shuffling.keys import GOLDEN, MASK64, mix64

ROUNDS = 4  # Luby-Rackoff: 4 rounds of a good round function make a strong PRP; 6 cost 1.5x
MAX_N = 1 << 62  # keeps a, b < 2**31, so the multiply-shift stays exact in uint64

_U64 = np.uint64
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


@njit(inline="always")
def _mix(z):
    z = (z ^ (z >> _U64(30))) * _M1
    z = (z ^ (z >> _U64(27))) * _M2
    return z ^ (z >> _U64(31))


@njit(inline="always")
def _f(r, rkey, m):
    # Round function into range(m): top 32 bits of the mix, scaled (m < 2**31).
    return np.int64(((_mix(_U64(r) ^ rkey) >> _U64(32)) * _U64(m)) >> _U64(32))


@njit(inline="always")
def _encrypt(x, a, b, rkeys):
    left = x // b
    return _encrypt_lr(left, x - left * b, a, b, rkeys)


@njit(inline="always")
def _encrypt_lr(left, right, a, b, rkeys):
    # x = left * b + right already split: callers walking consecutive x keep
    # (left, right) as a counter and skip the 64-bit division (~40 cycles).
    ma = a  # modulus of left
    mb = b  # modulus of right
    for r in range(rkeys.shape[0]):
        t = left + _f(right, rkeys[r], ma)
        if t >= ma:
            t -= ma
        left = right
        right = t
        ma, mb = mb, ma
    return left * mb + right


@njit(inline="always")
def _decrypt(x, a, b, rkeys):
    nr = rkeys.shape[0]
    ma = a
    mb = b
    if nr % 2 == 1:
        ma, mb = mb, ma
    left = x // mb
    right = x - left * mb
    for i in range(nr):
        r = nr - 1 - i
        # Undo (L, R) -> (R, (L + F(R)) mod m): the old right is the new left.
        old_right = left
        t = right - _f(old_right, rkeys[r], mb)
        if t < 0:
            t += mb
        left = t
        right = old_right
        ma, mb = mb, ma
    return left * mb + right


@njit(inline="always")
def permute_one(i, n, a, b, rkeys):
    """perm[i] for one int64 i in range(n); callable from other jitted code."""
    x = _encrypt(i, a, b, rkeys)
    while x >= n:
        x = _encrypt(x, a, b, rkeys)
    return x


@njit
def _walk_out(out, n, a, b, rkeys):
    # Second pass: the rare values that fell in [n, a*b) walk on. Keeping the
    # branchy loop out of the first pass lets the CPU overlap independent
    # values there (about 1.5x faster than walking inline).
    for j in range(out.shape[0]):
        x = out[j]
        while x >= n:
            x = _encrypt(x, a, b, rkeys)
        out[j] = x


@njit
def _take(idx, n, a, b, rkeys, out):
    for j in range(idx.shape[0]):
        out[j] = _encrypt(idx[j], a, b, rkeys)
    _walk_out(out, n, a, b, rkeys)


@njit
def _range(start, stop, n, a, b, rkeys, out):
    left = start // b
    right = start - left * b
    for j in range(stop - start):
        out[j] = _encrypt_lr(left, right, a, b, rkeys)
        right += 1
        if right == b:
            right = 0
            left += 1
    _walk_out(out, n, a, b, rkeys)


@njit
def _inverse(vals, n, a, b, rkeys, out):
    for j in range(vals.shape[0]):
        x = _decrypt(vals[j], a, b, rkeys)
        while x >= n:
            x = _decrypt(x, a, b, rkeys)
        out[j] = x


def round_keys(key: int) -> np.ndarray:
    """The per-round keys of one permutation key."""
    return np.array([mix64(key + (r + 1) * GOLDEN) for r in range(ROUNDS)], dtype=np.uint64)


def feistel_params(n: int, key: int) -> tuple[int, int, np.ndarray]:
    """(a, b, round keys) of the permutation of range(n) under key; a*b >= n."""
    a = max(1, math.isqrt(max(n - 1, 0)) + 1)
    b = max(1, -(-n // a))
    return a, b, round_keys(key)


def _check_n(n) -> int:
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"n must be an int, got {n!r}")
    n = int(n)
    if not 0 <= n <= MAX_N:
        raise ValueError(f"n={n} is out of range: a Permutation covers 0 <= n <= 2**62; split larger domains")
    return n


class Permutation:
    """The permutation of range(n) selected by ``key``; evaluated lazily.

    ``perm[i]`` is one value, ``perm.take(idx)`` many, ``perm.range(a, b)`` the
    values at positions a..b-1, ``perm.index(v)`` the position of value v.
    Nothing of size n is ever stored.
    """

    __slots__ = ("n", "key", "_a", "_b", "_rkeys")

    def __init__(self, n: int, key: int):
        self.n = _check_n(n)
        if isinstance(key, (bool, np.bool_)) or not isinstance(key, (int, np.integer)):
            raise TypeError(f"key must be an int (see shardfeed.shuffling.epoch_key), got {key!r}")
        self.key = int(key) & MASK64
        self._a, self._b, self._rkeys = feistel_params(self.n, self.key)

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"Permutation(n={self.n}, key={self.key:#x})"

    def __getitem__(self, i) -> int:
        if isinstance(i, slice):
            start, stop, step = i.indices(self.n)
            if step == 1:
                return self.range(start, max(start, stop))
            return self.take(np.arange(start, stop, step, dtype=np.int64))
        i = int(i)
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(f"position {i} out of range for a Permutation of n={self.n} (valid: 0..{self.n - 1})")
        out = np.empty(1, dtype=np.int64)
        _take(np.array([i], dtype=np.int64), self.n, self._a, self._b, self._rkeys, out)
        return int(out[0])

    def __iter__(self):
        step = 1 << 16
        for a in range(0, self.n, step):
            yield from self.range(a, min(self.n, a + step)).tolist()

    def take(self, idx) -> np.ndarray:
        """perm[idx] for an int array of positions (any shape), as int64."""
        idx = np.asarray(idx)
        if idx.dtype.kind not in "iu":
            raise TypeError(f"positions must be integers, got dtype {idx.dtype}")
        flat = np.ascontiguousarray(idx, dtype=np.int64).reshape(-1)
        if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= self.n):
            bad = int(flat.min()) if int(flat.min()) < 0 else int(flat.max())
            raise IndexError(f"position {bad} out of range for a Permutation of n={self.n} (valid: 0..{self.n - 1})")
        out = np.empty(flat.shape[0], dtype=np.int64)
        _take(flat, self.n, self._a, self._b, self._rkeys, out)
        return out.reshape(idx.shape)

    def range(self, start: int, stop: int) -> np.ndarray:
        """The values at positions start..stop-1 (a slice of the permutation)."""
        start, stop = int(start), int(stop)
        if not 0 <= start <= stop <= self.n:
            raise IndexError(f"range({start}, {stop}) is not within 0 <= start <= stop <= n={self.n}")
        out = np.empty(stop - start, dtype=np.int64)
        _range(start, stop, self.n, self._a, self._b, self._rkeys, out)
        return out

    def index(self, values) -> np.ndarray:
        """Positions of the given values: the inverse permutation, vectorized."""
        vals = np.ascontiguousarray(values, dtype=np.int64).reshape(-1)
        if vals.size and (int(vals.min()) < 0 or int(vals.max()) >= self.n):
            raise IndexError(f"values must lie in 0..{self.n - 1} for a Permutation of n={self.n}")
        out = np.empty(vals.shape[0], dtype=np.int64)
        _inverse(vals, self.n, self._a, self._b, self._rkeys, out)
        return out.reshape(np.shape(values))
