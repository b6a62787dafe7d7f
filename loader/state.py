"""The Loader's state dict: the feed's position, never sample lists.

    {"version": 2,
     "epoch": 3, "step": 120,     # where the job stands (readable copies of the feed's)
     "feed": {"version": 1, "kind": "epoch",
              "epoch": 3,         # epoch in progress
              "step": 120,        # steps every rank has taken in it (since the last resize)
              "world_size": 2,
              "batch_sizes": [64, 32],                # per rank, this epoch's stage
              "history": [[4, [32, 32, 32, 32], [800, 800, 800, 800]]],
                                  # earlier jobs this epoch: [world_size, batch sizes, consumed per rank]
              "dataset": {"samples": N, "shards": S, "order": "global", "seed": 0, "drop_last": false}}}

All ranks step together, so one rank's state describes the whole job: any
rank's state loaded by every rank of a job with another world size replans
the rest of the epoch from these numbers (loader.feed.EpochFeed.reset).
Version 1 states (the flat layout of shardfeed 0.1) are still read.
"""

from __future__ import annotations

VERSION = 2


def make(feed_state: dict) -> dict:
    return {"version": VERSION, "epoch": feed_state["epoch"], "step": feed_state["step"], "feed": dict(feed_state)}


def fingerprint(dataset) -> dict:
    return {"samples": int(dataset.index.num_samples), "shards": len(dataset.index),
            "order": dataset.order.value, "seed": int(dataset.seed), "drop_last": bool(dataset.drop_last)}


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
