"""Checks every feed's ``reset(state)`` runs before trusting a saved state.

A state comes from a checkpoint, which may be from another release, another
feed or another dataset; each check raises naming the bad entry and the fix.

Version 2 states also name the data they belong to (``"data"``: the content
digest of each index, the identity of a followed stream) beside the shuffle
(``"dataset"``); version 1 states (without ``"data"``) are still accepted,
checked by the shuffle fingerprint and the positions only.
"""

from __future__ import annotations

from shardfeed.shuffling.spec import MAX_BATCH_SIZE

VERSION = 2
READS = (1, 2)  # feed state versions reset() accepts
MAX_POSITION = 1 << 62  # no saved counter is ever this large; a bigger one is damage, not data


def check_header(state, kind: str, fix: str) -> dict:
    """A dict of this feed's kind and a state version it reads."""
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict from get_state()/Loader.state_dict(), got {type(state).__name__}")
    got = state.get("kind", "epoch")
    if got != kind:
        saved = _WHAT.get(got, f"a Loader of kind {got!r}") if isinstance(got, str) else "something else"
        raise ValueError(f"this state was saved by {saved}, and this is {_WHAT.get(kind, kind)}: a state "
                         f"resumes only the kind of Loader that saved it; {fix}")
    if state.get("version") not in READS:
        raise ValueError(f"this state's version {state.get('version')!r} is not one this release reads "
                         f"({' or '.join(map(str, READS))}): it was saved by another release; {fix}")
    return state


# what saved a state of each kind, in the public API's words
_WHAT = {"epoch": "a Loader over a ShardDataset (epochs of a fixed dataset)",
         "follow": "a Loader over a ShardDataset(follow=True) (a growing stream)",
         "mixture": "a Loader over a Mixture", "mixture-stream": "a Loader over a Mixture of followed streams"}


def check_ints(state: dict, minimums: dict[str, int]) -> None:
    for key, lo in minimums.items():
        v = state.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v < MAX_POSITION:
            raise ValueError(f"state[{key!r}]={v!r} must be an int in [{lo}, 2**62) (not a shardfeed feed state?)")


def check_batch_sizes(state: dict) -> None:
    sizes = state.get("batch_sizes")
    if (not isinstance(sizes, list) or len(sizes) != state["world_size"]
            or not all(isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= MAX_BATCH_SIZE for b in sizes)):
        raise ValueError(f"state['batch_sizes']={sizes!r} must list one batch size in [1, {MAX_BATCH_SIZE}] per "
                         f"rank (world_size={state['world_size']})")


def check_balanced(state: dict):
    """A saved rebalance (``[since epoch, per-rank sizes]``, or absent): an epoch no later than the
    state's and sizes in range; None when the state has none."""
    got = state.get("balanced")
    if got is None:
        return None
    if (not isinstance(got, list) or len(got) != 2 or isinstance(got[0], bool) or not isinstance(got[0], int)
            or not 0 <= got[0] <= state.get("epoch", 0) or not isinstance(got[1], list) or not got[1]
            or not all(isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= MAX_BATCH_SIZE for b in got[1])):
        raise ValueError(f"state['balanced']={got!r} must be [epoch the sizes were set in (at most the state's "
                         f"epoch), one batch size in [1, {MAX_BATCH_SIZE}] per rank] (not a shardfeed feed state?)")
    return got


def check_stream_position(state: dict) -> None:
    """The watermark and end flag of a followed stream."""
    wm = state.get("watermark")
    if (not isinstance(wm, dict) or isinstance(wm.get("samples"), bool) or not isinstance(wm.get("samples"), int)
            or not 0 <= wm["samples"] < MAX_POSITION):
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


def check_same_content(state: dict, identity: dict, where: str, fix: str) -> None:
    """A version 2 state names the content it belongs to (index digests, a stream's
    identity); it must be this content. Entries this feed cannot know yet (None:
    a stream with nothing published) are left to the feed's own check."""
    if state["version"] < 2:
        return  # version 1 predates the content digest: checked by fingerprint and positions only
    theirs = state.get("data")
    if not isinstance(theirs, dict):
        raise ValueError(f"state['data']={theirs!r} must name the data the state belongs to (not a shardfeed "
                         "feed state?)")
    diff = [f"{k}: saved {theirs.get(k)!r}, now {v!r}" for k, v in identity.items()
            if v is not None and theirs.get(k) != v]
    if diff or set(theirs) != set(identity):
        raise ValueError(f"state belongs to other data than {where} ({', '.join(diff) or theirs!r}): the same "
                         f"sample and shard counts with other content, or another stream; {fix}")


def out_of_range(key: str, value: int, lo: int, hi: int, what: str) -> ValueError:
    """The error for a saved position outside the data (never applied)."""
    return ValueError(f"state[{key!r}]={value} is outside {what}: valid {lo}..{hi}; the state belongs to other "
                      "data or was edited, so it is refused rather than applied")
