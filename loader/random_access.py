"""Random access: sample ``i`` of a dataset, or the sample with a given key.

``SampleLookup(index)[i]`` reads sample ``i`` of the whole dataset in stored
order (shard after shard) through the index's cumulative counts and the
shard's sidecar: one binary search over shards, one sample read, no scan.
Reads go through the shard readers, so every tar sample is checked against
its sidecar checksum (Parquet/Arrow: page checksums, full validation) and
damaged bytes raise ShardError, never reach the caller as data.

``get(key)`` finds a key without a dict of every key. Why not a dict: at a
billion samples a Python dict of str keys costs ~100 GB and minutes to build
in every process. Instead the first ``get`` reads every shard's keys once
(sidecars and key columns only, no payloads) and keeps two strings per shard,
its first and last key, plus whether the dataset is sorted by key in stored
order. That is how ShardWriter datasets and most WebDataset shards are
written (keys like ``000123``), and then a lookup is a binary search over the
shards' last keys and one inside the shard's key list (which the open shard
reader already holds): O(log shards + log samples per shard) comparisons, no
file read beyond the shard's own, memory O(shards).

A dataset whose keys are not in stored order (hashes, uuids) falls back to a
compact table built by a second pass: the xxh3-64 of every key, sorted, with
the sample index of each (16 bytes per sample in numpy; ~1.6 GB per 100M
samples) and a binary search in it; a hash match is confirmed against the
shard's key, so a collision never returns the wrong sample. Writing such
datasets in key order (or recording per-shard key ranges in the index) keeps
them on the fast path.

Duplicate keys (legal in WebDataset) resolve to the first in stored order.
The key scan is built once per object and travels with it when pickled (to
torch DataLoader workers: call ``prepare_keys()`` before they start so they
do not each rescan); open shard readers do not travel. Not thread-safe: one
per thread or worker.
"""

from __future__ import annotations

import bisect
import operator
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import xxhash

from shardfeed.formats import ShardError, decode_field, open_shard
from shardfeed.formats.errors import ReadError
from shardfeed.formats.readers import TarShardReader, shard_keys
from shardfeed.loader.error_policy import ErrorPolicy

MAX_OPEN_SHARDS = 32  # each open tar shard is a mapping (a compressed one: its inflated bytes)


class SampleLookup:
    """Map-style access to a dataset: ``lookup[i]`` and ``lookup.get(key)``.

    index: a DatasetIndex (``open_index(root)``). decode: decode fields by
    extension as ShardDataset does (False keeps bytes). transform: a function
    of one sample dict. unsafe: extensions allowed to unpickle. on_error:
    ``raise`` (default) raises ShardError for a damaged sample or shard;
    ``skip`` returns None instead and counts it in ``skipped`` (for a
    collate_fn that drops None). image_size: decode images at this size.
    """

    def __init__(self, index, decode: bool = True, transform: Callable | None = None,
                 unsafe: Iterable[str] = (), on_error: str = "raise", image_size: int | None = None,
                 max_open: int = MAX_OPEN_SHARDS):
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable, got {transform!r}")
        if isinstance(max_open, bool) or not isinstance(max_open, int) or max_open < 1:
            raise ValueError(f"max_open={max_open!r} must be an int >= 1 (shards kept open at once)")
        self.index = index
        self.decode = bool(decode)
        self.transform = transform
        self.unsafe = tuple(unsafe)
        self.on_error = on_error
        self.policy = ErrorPolicy(on_error)
        self.image_size = image_size
        self.max_open = max_open
        self.skipped = 0
        self._readers: OrderedDict[int, Any] = OrderedDict()
        self._key_lists: OrderedDict[int, list[str]] = OrderedDict()
        self._router: _KeyRouter | None = None
        # shard start positions as a list: bisect on it is ~10x faster per
        # sample than numpy's searchsorted on a one-element array
        self._starts: list[int] = index.offsets.tolist()

    def __len__(self) -> int:
        return self.index.num_samples

    def __getitem__(self, i) -> dict[str, Any] | None:
        """Sample ``i`` of the dataset in stored order; negative ``i`` counts from the end."""
        return self._sample(self._position(i))

    def get(self, key: str) -> dict[str, Any] | None:
        """The sample whose ``__key__`` is ``key``; KeyError naming it if none is."""
        return self._sample(self.index_of(key))

    def index_of(self, key: str) -> int:
        """The global sample index of ``key`` (the first, if the key repeats)."""
        if not isinstance(key, str):
            raise TypeError(f"a sample key is a str, got {type(key).__name__} {key!r}")
        pos = self.prepare_keys().find(key, self._keys_of)
        if pos is None:
            raise KeyError(f"no sample has key {key!r} in dataset {self.index.root}")
        return pos

    def __contains__(self, key) -> bool:
        try:
            self.index_of(key)
        except (KeyError, TypeError):
            return False
        return True

    def prepare_keys(self) -> _KeyRouter:
        """Build the key routing now (it is built on the first ``get`` otherwise)."""
        if self._router is None:
            self._router = _KeyRouter.build(self.index, self._scan_keys)
        return self._router

    # -- reading ----------------------------------------------------------
    def _position(self, i) -> int:
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"sample index must be an int, got {type(i).__name__} {i!r}; "
                            "use .get(key) to look a sample up by its key")
        n = len(self)
        pos = int(i) + n if i < 0 else int(i)
        if not 0 <= pos < n:
            raise IndexError(f"sample index {int(i)} is out of range for dataset {self.index.root} "
                             f"of {n} samples (valid: {-n}..{n - 1})")
        return pos

    def _sample(self, pos: int) -> dict[str, Any] | None:
        s = bisect.bisect_right(self._starts, pos) - 1
        r = pos - self._starts[s]
        try:
            sample = self._decoded(self._reader(s).read(r), s)
        except ShardError as e:
            if not self.policy.skip:
                raise
            self.policy.report([ReadError.of(e, 1)])
            self.skipped += 1
            return None
        return sample if self.transform is None else self.transform(sample)

    def _decoded(self, raw: dict[str, Any], shard: int) -> dict[str, Any]:
        if not self.decode:
            return raw
        key = raw.get("__key__")
        out: dict[str, Any] = {}
        for name, value in raw.items():
            if name == "__key__":
                out[name] = value
                continue
            try:
                out[name] = decode_field(name, value, self.unsafe, self.image_size)
            except Exception as e:  # any codec failing on untrusted bytes: attributed to its sample
                raise ShardError(self.index.path(shard), f"sample {key!r}: field {name!r} does not decode: "
                                                         f"{type(e).__name__}: {e}") from e
        return out

    def _reader(self, s: int):
        r = self._readers.get(s)
        if r is not None:
            self._readers.move_to_end(s)
            return r
        while len(self._readers) >= self.max_open:
            self._readers.popitem(last=False)[1].close()
        r = open_shard(self.index, s)
        self._readers[s] = r
        return r

    def _keys_of(self, s: int) -> list[str]:
        """Shard ``s``'s keys: a tar reader holds them (and the read comes next)."""
        if self.index.formats[s] not in ("parquet", "arrow"):
            reader = self._reader(s)
            if isinstance(reader, TarShardReader):
                return reader.table.keys
        keys = self._key_lists.get(s)
        if keys is None:
            keys = shard_keys(self.index, s)
            self._key_lists[s] = keys
            if len(self._key_lists) > self.max_open:  # as many as open shards: smaller than them
                self._key_lists.popitem(last=False)
        else:
            self._key_lists.move_to_end(s)
        return keys

    def _scan_keys(self, s: int) -> list[str]:
        # the scan touches every shard once: do not fill the reader LRU with them
        return self._key_lists.get(s) or shard_keys(self.index, s)

    # -- lifecycle --------------------------------------------------------
    def close(self) -> None:
        """Close the open shards; safe to call twice, and a later read reopens."""
        while self._readers:
            self._readers.popitem()[1].close()
        self._key_lists.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __getstate__(self):
        # Open mappings do not pickle (and a worker opens its own); the key
        # routing does, so workers need not rescan.
        state = dict(self.__dict__)
        state["_readers"] = OrderedDict()
        state["_key_lists"] = OrderedDict()
        return state

    def __repr__(self) -> str:
        return (f"SampleLookup({self.index.root!r}, samples={len(self)}, decode={self.decode}, "
                f"on_error={self.on_error!r})")


class _KeyRouter:
    """Key -> global sample index, from one pass over every shard's keys.

    ``shards``/``first``/``last``: the non-empty shards and their first and
    last keys. ``ordered``: keys never decrease in stored order, so a binary
    search finds the shard. Otherwise ``hashes``/``positions``: xxh3-64 of
    every key sorted, with its sample index (stable, so duplicates keep
    stored order).
    """

    def __init__(self, offsets: np.ndarray, shards: list[int], first: list[str], last: list[str],
                 ordered: bool, hashes: np.ndarray | None = None, positions: np.ndarray | None = None):
        self.offsets = offsets
        self.shards = shards
        self.first = first
        self.last = last
        self.ordered = ordered
        self.hashes = hashes
        self.positions = positions

    @classmethod
    def build(cls, index, keys_of: Callable[[int], list[str]]) -> _KeyRouter:
        shards, first, last = [], [], []
        ordered = True
        for s in range(len(index)):
            if index.counts[s] == 0:
                continue
            keys = keys_of(s)
            if ordered and (last and last[-1] > keys[0] or not all(map(operator.le, keys, keys[1:]))):
                ordered = False
            shards.append(s)
            first.append(keys[0])
            last.append(keys[-1])
        router = cls(index.offsets, shards, first, last, ordered)
        if not ordered:
            router._hash_all(index, keys_of)
        return router

    def _hash_all(self, index, keys_of) -> None:
        hashes = np.empty(index.num_samples, np.uint64)
        h = xxhash.xxh3_64_intdigest
        for s in self.shards:
            a = int(self.offsets[s])
            keys = keys_of(s)
            hashes[a:a + len(keys)] = np.fromiter((h(k.encode("utf-8", "surrogateescape")) for k in keys),
                                                  np.uint64, len(keys))
        order = np.argsort(hashes, kind="stable")
        self.hashes = hashes[order]
        self.positions = order.astype(np.int32 if len(order) < 2**31 else np.int64)

    def find(self, key: str, keys_of: Callable[[int], list[str]]) -> int | None:
        if self.ordered:
            return self._find_ordered(key, keys_of)
        return self._find_hashed(key, keys_of)

    def _find_ordered(self, key: str, keys_of) -> int | None:
        k = bisect.bisect_left(self.last, key)  # the first shard that can hold key
        if k == len(self.last) or self.first[k] > key:
            return None
        s = self.shards[k]
        keys = keys_of(s)
        row = bisect.bisect_left(keys, key)
        if row == len(keys) or keys[row] != key:
            return None
        return int(self.offsets[s]) + row

    def _find_hashed(self, key: str, keys_of) -> int | None:
        h = np.uint64(xxhash.xxh3_64_intdigest(key.encode("utf-8", "surrogateescape")))
        j = int(np.searchsorted(self.hashes, h, side="left"))
        while j < len(self.hashes) and self.hashes[j] == h:
            pos = int(self.positions[j])
            s = int(np.searchsorted(self.offsets, pos, side="right") - 1)
            if keys_of(s)[pos - int(self.offsets[s])] == key:  # a 64-bit collision is not a match
                return pos
            j += 1
        return None
