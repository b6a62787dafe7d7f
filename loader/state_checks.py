"""Checks every feed's ``reset(state)`` runs before trusting a saved state.

A state comes from a checkpoint, which may be from another release, another
feed or another dataset; each check raises naming the bad entry and the fix.
"""

from __future__ import annotations

VERSION = 1


def check_header(state, kind: str, fix: str) -> dict:
    """A dict of this feed's kind and state version."""
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict from get_state()/Loader.state_dict(), got {type(state).__name__}")
    if state.get("version") != VERSION or state.get("kind", "epoch") != kind:
        raise ValueError(f"feed state version {state.get('version')!r} / kind {state.get('kind')!r} is not "
                         f"{VERSION} / {kind!r}: it was saved by another feed or release; {fix}")
    return state


def check_ints(state: dict, minimums: dict[str, int]) -> None:
    for key, lo in minimums.items():
        v = state.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"state[{key!r}]={v!r} must be an int >= {lo} (not a shardfeed feed state?)")


def check_batch_sizes(state: dict) -> None:
    sizes = state.get("batch_sizes")
    if (not isinstance(sizes, list) or len(sizes) != state["world_size"]
            or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in sizes)):
        raise ValueError(f"state['batch_sizes']={sizes!r} must list one batch size >= 1 per rank "
                         f"(world_size={state['world_size']})")


def check_stream_position(state: dict) -> None:
    """The watermark and end flag of a followed stream."""
    wm = state.get("watermark")
    if not isinstance(wm, dict) or not isinstance(wm.get("samples"), int) or wm["samples"] < 0:
        raise ValueError(f"state['watermark']={wm!r} must be {{'samples': int >= 0, 'seq': int}}")
    if not isinstance(state.get("done"), bool):
        raise ValueError(f"state['done']={state.get('done')!r} must be a bool")


def check_same_data(state: dict, fingerprint: dict, fix: str) -> None:
    """The state was saved for this data and shuffle; the message lists what differs."""
    theirs = state.get("dataset")
    if theirs == fingerprint:
        return
    diff = [f"{k}: saved {theirs.get(k) if isinstance(theirs, dict) else None!r}, now {v!r}"
            for k, v in fingerprint.items() if not isinstance(theirs, dict) or theirs.get(k) != v]
    raise ValueError(f"state was saved for another dataset or shuffle ({', '.join(diff) or theirs!r}); {fix}")
