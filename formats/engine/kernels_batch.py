"""The jitted set-up of a steady-state batch read, fused into one call.

Why: a batch whose shards are all open tar shards used to be laid out by a
dozen small numpy calls (searchsorted, a subtraction, fancy indexing, min,
unique, two cumsums, two fills, ...) around ``kernels.tar_sizes``: each
costs 1-6 us of call overhead on a 256-sample batch, together about a third
of the main process's time per batch at 2 KiB. ``tar_layout`` walks the ids
once and does all of it; ``kernels.tar_gather`` then reads the batch as
before.
"""

from __future__ import annotations

import numpy as np

from shardfeed.formats.compiler.jit import njit
from shardfeed.formats.compiler.native import load_i64
from shardfeed.formats.engine.kernels import FD, FID, KOFF, MSTART, NMEM, NSAMP, SIZE

# rows of tar_layout's int64 work array (n + 1 columns each)
SHARD, LOCAL, SLOT, DST_POS, KPOS, NROWS = range(6)

# tar_layout's status
OK, OUT_OF_RANGE, NOT_OPEN, BAD_SIDECAR = range(4)


@njit(nogil=True)
def tar_layout(offsets, slot_of, table, ids, work, fpos, present, uniq):
    """Lay out a batch of global sample ids whose shards are all open tar shards.

    Fills the rows of ``work`` (SHARD..KPOS): each id's shard and index in
    it (as ``DatasetIndex.locate``: the last shard whose offset is <= the id,
    so empty shards are passed over), its slot in the open-shard table, and
    the start of each sample in the batch buffer and of each key (+ NUL) in
    the key buffer (``n + 1`` cumulative entries: the last is the total).
    Sets ``fpos`` (2, fields, n) to -1 (absent: tar_gather fills the members
    it copies), marks in ``present`` the field ids some sample has, and
    writes the batch's distinct shards, ascending, to ``uniq``.

    Returns (OK, number of distinct shards) or (status, sample): OUT_OF_RANGE
    (an id outside 0..num_samples-1), NOT_OPEN (a shard that is not an open
    tar shard read from a file: the caller takes its general path),
    BAD_SIDECAR (a sample outside its shard's table or members out of range).
    Any status but OK sends the batch to the general path, which raises or
    skips as it says, so which of several failures is reported does not matter.
    """
    n = ids.shape[0]
    nshards = offsets.shape[0] - 1
    total = offsets[nshards]
    nf = fpos.shape[1]
    for f in range(nf):
        present[f] = 0
        for k in range(n):
            fpos[0, f, k] = -1
            fpos[1, f, k] = -1
    seen = np.zeros(table.shape[0], np.bool_)
    m = 0
    s = 0
    # Two passes: the first locates every id (branchy: a bisect where the shard
    # changes), the second reads the sidecars, whose loads are then independent
    # of those branches and overlap: 25% faster in `global` order, where each
    # sample's sidecar entries miss the cache.
    for k in range(n):
        x = ids[k]
        if x < 0 or x >= total:
            return OUT_OF_RANGE, k
        if not (offsets[s] <= x < offsets[s + 1]):  # stored order stays in one shard for a while
            lo, hi = 0, nshards
            while hi - lo > 1:
                mid = (lo + hi) >> 1
                if offsets[mid] <= x:
                    lo = mid
                else:
                    hi = mid
            s = lo
        work[SHARD, k] = s
        work[LOCAL, k] = x - offsets[s]
        if s >= slot_of.shape[0]:
            return NOT_OPEN, k
        t = slot_of[s]
        if t < 0 or t >= table.shape[0] or table[t, FD] < 0:
            return NOT_OPEN, k
        work[SLOT, k] = t
        if not seen[t]:
            seen[t] = True
            uniq[m] = s
            m += 1
    p = 0
    q = 0
    for k in range(n):
        i = work[LOCAL, k]
        t = work[SLOT, k]
        if i >= table[t, NSAMP]:
            return BAD_SIDECAR, k
        a = load_i64(table[t, MSTART], i)
        b = load_i64(table[t, MSTART], i + 1)
        if a < 0 or b > table[t, NMEM] or a > b:
            return BAD_SIDECAR, k
        work[DST_POS, k] = p
        for j in range(a, b):
            z = load_i64(table[t, SIZE], j)
            if z < 0:
                return BAD_SIDECAR, k
            p += z
            f = load_i64(table[t, FID], j)
            if 0 <= f < nf:
                present[f] = 1
        work[KPOS, k] = q
        q += load_i64(table[t, KOFF], i + 1) - load_i64(table[t, KOFF], i) + 1
    work[DST_POS, n] = p
    work[KPOS, n] = q
    uniq[:m].sort()
    return OK, m

