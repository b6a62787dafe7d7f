"""Deterministic benchmark samples and the content check every pass runs.

Sample ``i`` is ``{"__key__": "%010d" % i, "bin": payload(i), "cls": cls(i)}``.
A pass is checked by an order-independent digest, so shuffled passes are
checked exactly like ordered ones:

    digest = sum over delivered samples of xxh3_64(bin, seed=key * 1000 + cls)  (mod 2**64)

Seeding the payload's hash with its key and class ties the three fields of a
sample together: a missing, repeated or damaged sample, a payload delivered
under another key, or a wrong class all change the digest (or the count).
The check runs in C per sample (``map`` over ``xxh3_64_intdigest``), about
0.3 us per sample, so it costs every library alike and little next to
reading.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import xxhash

# Bump when the generator changes, so cached bench data is rewritten.
GENERATOR_VERSION = 1
NUM_CLASSES = 1000
_MASK = (1 << 64) - 1
_POOL_BYTES = 1 << 20


class SampleSpec:
    """The samples of one benchmark dataset: ``count`` samples of ``size`` payload bytes."""

    def __init__(self, count: int, size: int):
        if count < 1:
            raise ValueError(f"sample count must be >= 1, got {count}")
        if size < 16:
            raise ValueError(f"payload size must be >= 16 bytes, got {size}")
        self.count = int(count)
        self.size = int(size)
        # A random pool that payloads are cut from: incompressible like real
        # media, and cheap to produce for hundreds of MB of samples.
        self._pool = np.random.default_rng(0).bytes(_POOL_BYTES + self.size)

    def key(self, i: int) -> str:
        return f"{i:010d}"

    def cls(self, i: int) -> int:
        return (i * 7919) % NUM_CLASSES

    def payload(self, i: int) -> bytes:
        # The first 8 bytes carry the index, so no two payloads are equal.
        start = (i * 2654435761) % _POOL_BYTES
        return i.to_bytes(8, "little") + self._pool[start:start + self.size - 8]

    def sample(self, i: int) -> dict[str, Any]:
        return {"__key__": self.key(i), "bin": self.payload(i), "cls": self.cls(i)}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self.sample(i) for i in range(self.count))

    def expected(self) -> dict[str, int]:
        """What a correct pass over all samples adds up to."""
        digest = 0
        for i in range(self.count):
            digest += xxhash.xxh3_64_intdigest(self.payload(i), i * NUM_CLASSES + self.cls(i))
        return {"count": self.count, "bytes": self.count * self.size, "digest": digest & _MASK}

    @property
    def payload_bytes(self) -> int:
        return self.count * self.size


def _as_int_array(values) -> np.ndarray:
    """Keys or classes as int64, whatever container a library hands back."""
    if hasattr(values, "numpy"):  # torch tensor
        return values.numpy().astype(np.int64, copy=False).reshape(-1)
    if isinstance(values, np.ndarray):
        return values.astype(np.int64, copy=False).reshape(-1)
    values = list(values)
    if values and isinstance(values[0], (bytes, bytearray, memoryview)):
        values = [bytes(v) for v in values]  # b"123" from undecoded fields
    return np.fromiter(map(int, values), dtype=np.int64, count=len(values))


def _as_payloads(values) -> list:
    """Payloads as buffers: a list of bytes, or rows of a 2-D uint8 array/tensor."""
    if hasattr(values, "numpy"):
        values = values.numpy()
    if isinstance(values, np.ndarray):
        if values.ndim != 2 or values.dtype != np.uint8:
            raise ValueError(f"payload array must be 2-D uint8 (batch, bytes), got {values.dtype} "
                             f"of shape {values.shape}")
        return list(np.ascontiguousarray(values))
    return values if isinstance(values, list) else list(values)


class ContentCheck:
    """Accumulates count, payload bytes and digest over the batches of one pass."""

    def __init__(self):
        self.count = 0
        self.bytes = 0
        self.digest = 0

    def add(self, keys, payloads, classes) -> int:
        keys = _as_int_array(keys)
        classes = _as_int_array(classes)
        payloads = _as_payloads(payloads)
        if not len(keys) == len(payloads) == len(classes):
            raise ValueError(f"batch fields disagree in length: {len(keys)} keys, "
                             f"{len(payloads)} payloads, {len(classes)} classes")
        seeds = (keys * NUM_CLASSES + classes).tolist()
        self.digest = (self.digest + sum(map(xxhash.xxh3_64_intdigest, payloads, seeds))) & _MASK
        self.count += len(keys)
        self.bytes += sum(map(len, payloads))  # rows of a uint8 array: len == bytes
        return len(keys)

    def result(self) -> dict[str, int]:
        return {"count": self.count, "bytes": self.bytes, "digest": self.digest}

    def mismatch(self, expected: dict[str, int]) -> str | None:
        """None when the pass delivered exactly the expected samples, else what differs."""
        got = self.result()
        diffs = [f"{k} {got[k]} != expected {expected[k]}" for k in ("count", "bytes", "digest")
                 if got[k] != expected[k]]
        return "; ".join(diffs) or None
