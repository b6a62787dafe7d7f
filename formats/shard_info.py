"""``ShardInfo``: one row of the index (the name, format, sample count, byte size and hash of a shard).

Its own module so that reading a dataset does not define it: only writers, the commit log and
``DatasetIndex.shard`` make ShardInfo values, and a dataclass compiles its generated methods when
its module is imported (about 1.8 ms, issue #24). ``shardfeed.formats.index.ShardInfo`` and
``shardfeed.formats.ShardInfo`` name it on first use (index.py's module ``__getattr__``). It stays a
dataclass: callers build it by keyword (``ShardInfo(**record)``) and read ``__dict__`` to write
commit records.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ShardInfo:
    name: str  # path relative to the dataset root, POSIX separators
    format: str
    samples: int
    bytes: int
    hash: str  # hex digest, HASH_ALGO
