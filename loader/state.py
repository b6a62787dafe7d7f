"""The Loader's state dict: positions and counters, never sample lists.

    {"version": 1,
     "epoch": 3,                  # epoch in progress
     "step": 120,                 # steps every rank has taken in it (since the last resize)
     "world_size": 2,
     "batch_sizes": [64, 32],     # per rank, this epoch's stage
     "history": [[4, null, [800, 800, 800, 800]]],  # earlier world sizes this epoch:
                                  # [world_size, weights or null, consumed per old rank]
     "dataset": {"samples": N, "shards": S, "order": "global", "seed": 0, "drop_last": false}}

All ranks step together, so one rank's state describes the whole job: any
rank's state loaded by every rank of a job with another world size replans
the rest of the epoch (shardfeed.shuffling.replan) from these numbers.
"""

from __future__ import annotations

VERSION = 1


def make(dataset, epoch: int, step: int, batch_sizes: list[int], history) -> dict:
    return {
        "version": VERSION,
        "epoch": int(epoch),
        "step": int(step),
        "world_size": int(dataset.world_size),
        "batch_sizes": [int(b) for b in batch_sizes],
        "history": [[int(w), list(wt) if wt else None, [int(c) for c in consumed]]
                    for (w, wt), consumed in history],
        "dataset": fingerprint(dataset),
    }


def fingerprint(dataset) -> dict:
    return {"samples": int(dataset.index.num_samples), "shards": len(dataset.index),
            "order": dataset.order.value, "seed": int(dataset.seed), "drop_last": bool(dataset.drop_last)}


def _int(state, key, lo=0):
    v = state.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"state[{key!r}]={v!r} must be an int >= {lo} (not a shardfeed Loader state?)")
    return v


def check(state: dict, dataset) -> dict:
    """Validate a state against this dataset; raises ValueError naming the mismatch and the fix."""
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict from Loader.state_dict(), got {type(state).__name__}")
    if state.get("version") != VERSION:
        raise ValueError(f"state version {state.get('version')!r} is not {VERSION}; it was written by another "
                         "shardfeed release (or is not a Loader state)")
    for key in ("epoch", "step"):
        _int(state, key)
    _int(state, "world_size", 1)
    sizes = state.get("batch_sizes")
    if (not isinstance(sizes, list) or len(sizes) != state["world_size"]
            or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in sizes)):
        raise ValueError(f"state['batch_sizes']={sizes!r} must list one batch size >= 1 per rank "
                         f"(world_size={state['world_size']})")
    hist = state.get("history")
    if not isinstance(hist, list) or not all(isinstance(h, list) and len(h) == 3 for h in hist):
        raise ValueError(f"state['history']={hist!r} must be a list of [world_size, weights, consumed]")
    mine = fingerprint(dataset)
    theirs = state.get("dataset")
    if theirs != mine:
        diff = {k: (theirs.get(k) if isinstance(theirs, dict) else None, mine[k]) for k in mine
                if not isinstance(theirs, dict) or theirs.get(k) != mine[k]}
        raise ValueError(f"state was saved for another dataset or shuffle ({', '.join(f'{k}: saved {a!r}, now {b!r}' for k, (a, b) in diff.items())}); "
                         "open the same dataset with the same shuffle, seed and drop_last to resume")
    return state
