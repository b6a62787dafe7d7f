"""Global sample ids: shard k's samples are offsets[k] .. offsets[k+1]-1."""

from __future__ import annotations

import numpy as np


def check_counts(counts) -> np.ndarray:
    """counts as a 1-d int64 array of samples per shard, validated."""
    arr = np.asarray(counts)
    if arr.ndim != 1:
        raise ValueError(f"counts must be a 1-d array of samples per shard, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"counts must be integers (samples per shard), got dtype {arr.dtype}")
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    if arr.size and int(arr.min()) < 0:
        k = int(np.argmin(arr))
        raise ValueError(f"counts[{k}] = {int(arr[k])} is negative; a shard holds 0 or more samples")
    return arr


def offsets_of(counts) -> np.ndarray:
    """[0, c0, c0+c1, ...]: len(counts)+1 cumulative sample offsets."""
    counts = check_counts(counts)
    out = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def shard_of(ids, counts=None, *, offsets=None) -> tuple[np.ndarray, np.ndarray]:
    """(shard, index inside the shard) of each global sample id.

    Pass ``offsets`` (from :func:`offsets_of`) instead of ``counts`` when
    calling this often, to skip the cumulative sum. Empty shards are never
    returned: an id always lands in the shard that holds it.
    """
    if offsets is None:
        if counts is None:
            raise TypeError("shard_of needs counts (samples per shard) or offsets")
        offsets = offsets_of(counts)
    ids = np.asarray(ids, dtype=np.int64)
    total = int(offsets[-1])
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= total):
        bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
        raise IndexError(f"sample id {bad} out of range: the dataset has ids 0..{total - 1}")
    shard = np.searchsorted(offsets, ids, side="right") - 1
    return shard, ids - offsets[shard]
