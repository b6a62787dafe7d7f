"""Keys for the keyed shuffles: one 64-bit key per (seed, epoch, purpose).

Every random choice in shuffling/ comes from a key derived here, so an
epoch's order is a pure function of its inputs and two purposes (the shard
order and the sample order, say) never share a stream by accident.
"""

from __future__ import annotations

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix64(z: int) -> int:
    """SplitMix64's finalizer on a Python int (the jitted twin is in permutation.py)."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def derive_key(*parts: int) -> int:
    """A 64-bit key from any number of ints, order-sensitive.

    Each part is folded in through the mixer, so (1, 2) and (2, 1) differ and
    negative or huge ints are fine (they are taken modulo 2**64).
    """
    key = 0x5EED5EED5EED5EED
    for part in parts:
        if not isinstance(part, int) or isinstance(part, bool):
            raise TypeError(f"key parts must be ints, got {part!r} ({type(part).__name__})")
        key = mix64(key + GOLDEN + (part & MASK64))
    return key


# Purposes: keep these numbers stable, they are part of every epoch's order.
STREAM_GLOBAL = 1
STREAM_SHARDS = 2
STREAM_WINDOWS = 3
STREAM_BUFFER = 4


def epoch_key(seed: int, epoch: int, stream: int = STREAM_GLOBAL) -> int:
    """The key of one purpose's stream in one epoch of one seed."""
    return derive_key(seed, epoch, stream)
