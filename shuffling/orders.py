"""The shuffle orders a user picks by name."""

from __future__ import annotations

from enum import Enum


class Order(str, Enum):
    """Which samples sit next to each other in an epoch.

    NONE: shards in order, each rank a contiguous run of them.
    SHARD: shard order shuffled, samples through a bounded shuffle buffer
    per rank (WebDataset's method).
    BLOCK: shuffled shards grouped in windows of ``block_shards``; samples
    shuffled inside a window; each rank reads its own run of windows, so at
    most one window of shards is resident per rank.
    GLOBAL: one permutation of all samples, dealt round-robin to ranks.

    ``Order(True)`` is GLOBAL and ``Order(False)`` NONE: ``shuffle=True`` is what
    a torch DataLoader user types.
    """

    NONE = "none"
    SHARD = "shard"
    BLOCK = "block"
    GLOBAL = "global"

    @classmethod
    def _missing_(cls, value):
        if isinstance(value, bool):  # what a torch DataLoader user types: shuffle=True / False
            return cls.GLOBAL if value else cls.NONE
        if isinstance(value, str):
            for member in cls:
                if member.value == value.strip().lower():
                    return member
        valid = ", ".join(repr(m.value) for m in cls)
        raise ValueError(f"unknown shuffle order {value!r}; choose one of {valid}")
