"""The Loader's state dict: the feed's position, never sample lists.

    {"version": 2,
     "epoch": 3, "step": 120,     # where the job stands (readable copies of the feed's)
     "feed": {"version": 2, "kind": "epoch",
              "epoch": 3,         # epoch in progress
              "step": 120,        # steps every rank has taken in it (since the last resize)
              "world_size": 2,
              "batch_sizes": [64, 32],                # per rank, this epoch's stage
              "history": [[4, [32, 32, 32, 32], [800, 800, 800, 800]]],
                                  # earlier jobs this epoch: [world_size, batch sizes, consumed per rank]
              "dataset": {"samples": N, "shards": S, "order": "global", "seed": 0, "drop_last": false},
                                  # the shuffle and the data's shape
              "data": {"digest": "9f0c..."},
                                  # the content: xxh3 of the index's shard names, counts, sizes and hashes
              "balanced": [2, [48, 16]]},  # only after Loader.rebalance: the epoch the sizes were set in
                                           # and the sizes (they hold while the schedule stays at that stage)
     "balance": [{"epoch": 2, "step": 40, "from": [32, 32], "batch_sizes": [48, 16], "why": {...}}]}
                                  # only after rebalances: the last 16, the measurements behind the newest

A follow state names its stream instead (``"data": {"stream": ...}``: a digest
of the first shard ever published, None before one is), a mixture each
source's digest. A state of other content, or a position outside the data,
is refused with ValueError (feed state version 2; version 1 feed states,
without ``"data"``, are checked by the fingerprint and the positions only).

All ranks step together, so one rank's state describes the whole job: any
rank's state loaded by every rank of a job with another world size replans
the rest of the epoch from these numbers (loader.feeds.epoch.EpochFeed).
Version 1 states (the flat layout of shardfeed 0.1) are still read.
"""

from __future__ import annotations

import numpy as np
import xxhash

from shardfeed.shuffling import Order
from shardfeed.shuffling.plan import DEFAULT_BLOCK_SHARDS, DEFAULT_BUFFER_SIZE

VERSION = 2


def make(feed_state: dict) -> dict:
    return {"version": VERSION, "epoch": feed_state["epoch"], "step": feed_state["step"], "feed": dict(feed_state)}


def fingerprint(dataset) -> dict:
    out = {"samples": int(dataset.index.num_samples), "shards": len(dataset.index),
           "order": dataset.order.value, "seed": int(dataset.seed), "drop_last": bool(dataset.drop_last)}
    # the window and the buffer change the order; named only when not the default (states saved before match)
    if dataset.order is Order.BLOCK and dataset.block_shards != DEFAULT_BLOCK_SHARDS:
        out["block_shards"] = int(dataset.block_shards)
    if dataset.order is Order.SHARD and dataset.shuffle_buffer != DEFAULT_BUFFER_SIZE:
        out["shuffle_buffer"] = int(dataset.shuffle_buffer)
    return out


def index_digest(index) -> str:
    """The content digest of a dataset's index: xxh3-64 over its shards' names, sample
    counts, byte sizes and content hashes, in order (the same for a local folder, its
    mirror in a node cache, a glob or a list of the same shards; unchanged by compaction)."""
    h = xxhash.xxh3_64()
    h.update(np.asarray(index.counts, np.int64).tobytes())
    h.update(np.asarray(index.sizes, np.int64).tobytes())
    h.update("\0".join(index.names).encode())
    h.update(b"\1")
    h.update("\0".join(index.hashes).encode())
    return h.hexdigest()


def stream_identity(name: str, content_hash: str) -> str:
    """A growing dataset's identity: a digest of its first published shard (its name
    carries the writer's time and pid, its hash the bytes), which never changes."""
    return xxhash.xxh3_64_hexdigest(f"{name}\0{content_hash}".encode())


def feed_state(state: dict) -> dict:
    """The feed's state inside a Loader state (of this version or version 1)."""
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict from Loader.state_dict(), got {type(state).__name__}")
    version = state.get("version")
    if version == VERSION:
        inner = state.get("feed")
        if not isinstance(inner, dict):
            raise ValueError(f"state['feed']={inner!r} must be the feed's state dict (not a shardfeed Loader state?)")
        return inner
    if version == 1 and isinstance(state.get("history"), list):
        # shardfeed 0.1 kept the epoch position flat, and weights (None when equal) in the history
        hist = [[h[0], list(h[1]) if h[1] else [1] * h[0], h[2]] if isinstance(h, list) and len(h) == 3 else h
                for h in state["history"]]
        return {**state, "kind": "epoch", "history": hist}
    raise ValueError(f"state version {version!r} is not {VERSION} (nor the older 1); it was written by another "
                     "shardfeed release (or is not a Loader state)")
