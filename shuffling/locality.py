"""Locality-aware dealing of a global permutation (Yang & Cong, HiPC 2019).

Each node owns a fixed subset of the shards for its cache: shard k belongs
to node k mod num_nodes (stable across epochs, so a cache of about
1/num_nodes of the dataset keeps its shards). A global batch (one step of
all ranks: ``batch_rounds`` rounds of the strided deal) keeps exactly the
samples the global permutation puts in it; only *who* reads each sample
changes:

1. in batch order, each sample goes to its owner node while that node has
   room (a node's room is the sum of its ranks' shares of the batch);
2. the overflow, in batch order, fills the nodes that still have room;
3. inside a node, its samples, in batch order, fill its ranks' shares in
   rank order.

So every rank still takes exactly its share, and only the overflow reads a
shard its node does not own. Its expected size is E[max(0, D - C)] over
nodes for a node's demand D ~ Binomial(batch, 1/num_nodes) against room C:
a few percent of samples at per-rank batches of 32-128, against
(num_nodes-1)/num_nodes with plain dealing.
"""

from __future__ import annotations

import numpy as np

from shardfeed.formats.compiler.jit import njit


def owner_node(shard: np.ndarray, num_nodes: int) -> np.ndarray:
    """The node that owns (caches) each shard."""
    return np.asarray(shard, dtype=np.int64) % num_nodes


@njit
def assign(owner, sizes, rounds, weights, rank_node, num_nodes):
    """Rank of every sample of consecutive batches.

    owner: owner node per sample (batches concatenated); sizes: samples per
    batch; rounds: rounds per batch (a batch has rounds*sum(weights)
    samples, except that the last one may be cut short by drop_last or
    padding, never here: the caller passes whole rounds).
    """
    out = np.empty(owner.shape[0], np.int64)
    world = weights.shape[0]
    node_room = np.empty(num_nodes, np.int64)
    node_fill = np.empty(num_nodes, np.int64)
    node_of = np.empty(owner.shape[0], np.int64)
    rank_fill = np.empty(world, np.int64)
    first_rank = np.full(num_nodes, world, np.int64)
    for r in range(world):
        if r < first_rank[rank_node[r]]:
            first_rank[rank_node[r]] = r
    base = 0
    for bi in range(sizes.shape[0]):
        size = sizes[bi]
        node_room[:] = 0
        node_fill[:] = 0
        for r in range(world):
            node_room[rank_node[r]] += rounds[bi] * weights[r]
        for i in range(base, base + size):
            nd = owner[i]
            if node_fill[nd] < node_room[nd]:
                node_of[i] = nd
                node_fill[nd] += 1
            else:
                node_of[i] = -1
        spare = 0
        for i in range(base, base + size):
            if node_of[i] < 0:
                while node_fill[spare] >= node_room[spare]:
                    spare += 1
                node_of[i] = spare
                node_fill[spare] += 1
        # Ranks of a node fill their shares in rank order.
        rank_fill[:] = 0
        cur = first_rank.copy()
        for i in range(base, base + size):
            nd = node_of[i]
            r = cur[nd]
            while rank_node[r] != nd or rank_fill[r] >= rounds[bi] * weights[r]:
                r += 1
            cur[nd] = r
            out[i] = r
            rank_fill[r] += 1
        base += size
    return out
