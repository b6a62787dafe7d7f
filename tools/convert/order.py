"""Which source sample goes to each output position: in order, or shuffled at write time.

The shuffled order is the project's keyed permutation (shardfeed.shuffling.
Permutation): output position j holds source sample ``perm[j]``, computed a
range at a time, so the order of a billion samples costs no memory of size n
(a materialised permutation would be 8 GB).

Sources that cannot read a sample by id cheaply (compressed tars are read
front to back: a random id means decompressing its whole shard) are
shuffled in two passes with bounded memory and the same resulting order:

1. scatter: read the source front to back once; sample i goes to bucket
   ``perm.index(i) // bucket_samples``, a file in the stage, with its output
   position;
2. gather: a bucket is read into memory (at most ``bucket_samples``
   samples), put in position order and written out; the next bucket follows.

Both give byte-identical datasets for one seed: the bucket size is only a
memory knob. The seed's key is derived under a purpose of its own, so the
write-time order never repeats a read-time one.
"""

from __future__ import annotations

import os
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterator

import numpy as np

from shardfeed.formats import ShardError, encode_field
from shardfeed.shuffling import Permutation, derive_key

_PURPOSE = 0x434F4E56  # "CONV": the write-time shuffle's own key stream
BUCKET_BYTES = 256 << 20  # memory one gathered bucket may take, about
MAX_OPEN = 256  # bucket files held open at once while scattering
_REC = struct.Struct("<QI")  # position in the bucket, number of fields
_FIELD = struct.Struct("<HQ")  # name length, payload length
_DONE = "scattered"


def shuffle_key(seed: int) -> int:
    return derive_key(int(seed), _PURPOSE)


class OutputOrder:
    """Source ids at output positions: ``ids(a, b)``; identity without a seed."""

    def __init__(self, n: int, seed: int | None):
        self.n = n
        self.seed = seed
        self.perm = Permutation(n, shuffle_key(seed)) if seed is not None and n > 0 else None

    def ids(self, a: int, b: int) -> np.ndarray:
        if self.perm is None:
            return np.arange(a, b, dtype=np.int64)
        return self.perm.range(a, b)

    def positions(self, ids: np.ndarray) -> np.ndarray:
        if self.perm is None:
            return np.asarray(ids, np.int64)
        return self.perm.index(ids)


def _encode(sample: dict) -> list[tuple[str, bytes]]:
    out = []
    for ext, value in sample.items():
        if ext in ("__key__", "__src__"):
            out.append((ext, str(value).encode("utf-8")))
        else:
            out.append((ext, encode_field(ext, value)))
    return out


def _decode(buf: memoryview, pos: int) -> tuple[int, dict, int]:
    where, nfields = _REC.unpack_from(buf, pos)
    pos += _REC.size
    sample = {}
    for _ in range(nfields):
        nlen, plen = _FIELD.unpack_from(buf, pos)
        pos += _FIELD.size
        name = bytes(buf[pos:pos + nlen]).decode("utf-8")
        pos += nlen
        data = bytes(buf[pos:pos + plen])
        pos += plen
        sample[name] = data.decode("utf-8") if name in ("__key__", "__src__") else data
    return where, sample, pos


class BucketShuffle:
    """The two-pass shuffle over one stage folder (see the module docstring).

    Picklable (a folder and three ints), so parts in other processes gather
    their own buckets.
    """

    def __init__(self, folder: str, n: int, seed: int, bucket_samples: int):
        if bucket_samples <= 0:
            raise ValueError(f"bucket_samples {bucket_samples} must be a positive number of samples")
        self.folder = folder
        self.n = n
        self.seed = seed
        self.bucket_samples = int(bucket_samples)

    @property
    def buckets(self) -> int:
        return -(-self.n // self.bucket_samples)

    def _path(self, b: int) -> str:
        return os.path.join(self.folder, f"bucket-{b:06d}.bin")

    def scattered(self) -> bool:
        return os.path.exists(os.path.join(self.folder, _DONE))

    def scatter(self, load_many: Callable[[np.ndarray], list], batch: int,
                progress: Callable[[int], None] = lambda n: None) -> None:
        """Pass 1: the source front to back into bucket files. Redone from the
        start if it was cut short (a bucket file is not resumable mid-way)."""
        if self.scattered():
            return
        os.makedirs(self.folder, exist_ok=True)
        for name in os.listdir(self.folder):
            os.unlink(os.path.join(self.folder, name))
        order = OutputOrder(self.n, self.seed)
        files: OrderedDict = OrderedDict()
        try:
            for start in range(0, self.n, batch):
                ids = np.arange(start, min(self.n, start + batch), dtype=np.int64)
                pos = order.positions(ids)
                for sample, p in zip(load_many(ids), pos.tolist()):
                    b, where = divmod(p, self.bucket_samples)
                    f = files.pop(b, None) or open(self._path(b), "ab")
                    files[b] = f
                    while len(files) > MAX_OPEN:
                        files.popitem(last=False)[1].close()
                    fields = _encode(sample)
                    parts = [_REC.pack(where, len(fields))]
                    for name, data in fields:
                        raw = name.encode("utf-8")
                        parts += [_FIELD.pack(len(raw), len(data)), raw, data]
                    f.write(b"".join(parts))
                progress(len(ids))
        finally:
            for f in files.values():
                f.close()
        with open(os.path.join(self.folder, _DONE), "w") as f:
            f.write(f"{self.n} {self.bucket_samples}\n")

    def gather(self, a: int, b: int) -> Iterator[list[dict]]:
        """Pass 2: the samples at output positions a..b-1, one bucket's worth at a time."""
        S = self.bucket_samples
        for bucket in range(a // S, -(-b // S)):
            lo = bucket * S
            size = min(S, self.n - lo)
            slots: list = [None] * size
            path = self._path(bucket)
            with open(path, "rb") as f:
                buf = memoryview(f.read())
            pos = 0
            while pos < len(buf):
                where, sample, pos = _decode(buf, pos)
                slots[where] = sample
            if any(s is None for s in slots):
                raise ShardError(path, f"bucket holds {size - slots.count(None)} of its {size} samples "
                                       "(damaged stage); delete the stage folder and convert again")
            yield slots[max(a, lo) - lo:min(b, lo + size) - lo]


def bucket_samples_for(first_batch: list[dict], n: int, budget: int = BUCKET_BYTES) -> int:
    """Samples per bucket so that one bucket takes about ``budget`` bytes."""
    if not first_batch:
        return max(1, n)
    size = sum(len(v) if isinstance(v, (bytes, str)) else 64 for s in first_batch for v in s.values())
    per = max(1, size // len(first_batch))
    return int(max(1024, min(n, budget // per)))
