"""State identity (DESIGN, Guarantees): a saved state names the data it belongs
to (the index's content digest, a stream's identity) as well as the shuffle; a
state of other data, or a position outside the data, is refused with a clear
error, never applied.

Regressions for issue 20: a state of another dataset with the same sample and
shard counts was accepted and delivered already-seen samples; a follow state
of another stream was accepted and skipped samples; states past the end (step
33 of 32, step 10**15, batch size 10**18) delivered nothing without an error."""

from __future__ import annotations

import copy
import json

import pytest

from shardfeed.formats import ShardWriter
from shardfeed.loader import Loader, Mixture, ShardDataset


def _write(root, prefix, n, per, append=False, end=False):
    with ShardWriter(root, max_shard_samples=per, append=append, prefix="s") as w:
        for i in range(n):
            w.write({"__key__": f"{prefix}-{i:05d}", "cls": i})
        if end:
            w.end_stream()
    return str(root)


def _keys(loader, steps=None):
    out = []
    for b in loader:
        out.append(list(b["__key__"]))
        if steps is not None and len(out) == steps:
            break
    return out


def _edit(state, **feed):
    s = copy.deepcopy(state)
    s["feed"].update(feed)
    return s


# -- epochs of a fixed dataset -------------------------------------------------
@pytest.fixture
def twins(tmp_path):
    """Two datasets with the same sample and shard counts and other content."""
    return _write(tmp_path / "a", "a", 64, 8), _write(tmp_path / "b", "b", 64, 8)


def test_epoch_state_of_another_dataset_with_the_same_counts_is_refused(twins):
    a, b = twins
    with Loader(ShardDataset(a, seed=1), 2) as L:
        _keys(L, 5)
        state = L.state_dict()
    assert state["feed"]["data"]["digest"]
    with Loader(ShardDataset(b, seed=1), 2) as L:
        with pytest.raises(ValueError, match="belongs to other data than this dataset.*digest: saved"):
            L.load_state_dict(state)
    with Loader(ShardDataset(a, seed=1), 2) as L:  # its own dataset resumes (a copy of its state too)
        L.load_state_dict(json.loads(json.dumps(state)))
        assert len(_keys(L)) == 27


@pytest.mark.parametrize("edit,match", [
    ({"step": 33}, r"state\['step'\]=33 is outside epoch 0 .*32 steps\): valid 0\.\.32"),
    ({"step": 10**15}, r"state\['step'\]=1000000000000000 is outside .*valid 0\.\.32"),
    ({"step": -1}, r"state\['step'\]=-1 must be an int in \[0"),
    ({"batch_sizes": [10**18]}, r"batch_sizes'\]=\[1000000000000000000\] must list one batch size in \[1, 2147483647\]"),
    ({"world_size": 2, "batch_sizes": [2, 2], "step": 17}, r"valid 0\.\.16"),
    ({"history": [[2, [2, 2], [30, 99]]]}, r"history\[0\] consumed\[1\]'\]=99 is outside .*valid 0\.\.32"),
])
def test_epoch_position_outside_the_data_is_refused(twins, edit, match):
    a, _ = twins
    with Loader(ShardDataset(a), 2) as L:
        _keys(L, 3)
        state = L.state_dict()
        assert len(L) == 32
        with pytest.raises(ValueError, match=match):
            L.load_state_dict(_edit(state, **edit))
        L.load_state_dict(_edit(state, step=32))  # the end of the epoch itself is a position
        assert L.state_dict()["feed"]["step"] == 32


def test_absurd_batch_size_is_refused_when_the_loader_is_made(twins):
    with pytest.raises(ValueError, match=r"batch_sizes\[0\]=1000000000000000000 must be an int in \[1, 2147483647\]"):
        Loader(ShardDataset(twins[0]), 10**18)


def test_version_1_feed_state_without_the_digest_still_resumes(twins):
    a, b = twins
    with Loader(ShardDataset(a, seed=2), 4) as L:
        full = _keys(L)
    with Loader(ShardDataset(a, seed=2), 4) as L:
        _keys(L, 6)
        old = L.state_dict()
    old["feed"]["version"] = 1
    del old["feed"]["data"]
    with Loader(ShardDataset(a, seed=2), 4) as L:
        L.load_state_dict(old)
        assert _keys(L) == full[6:]


# -- a followed stream -----------------------------------------------------------
@pytest.fixture
def streams(tmp_path):
    """Two ended streams with the same counts and other content."""
    return (_write(tmp_path / "a", "a", 50, 5, append=True, end=True),
            _write(tmp_path / "b", "b", 50, 5, append=True, end=True))


def _follow(root, bs=4, **kw):
    return Loader(ShardDataset(root, follow=True, poll_s=0.02, idle_timeout_s=5, **kw), bs)


def test_follow_state_of_another_stream_is_refused(streams, tmp_path):
    a, b = streams
    with _follow(a) as L:
        _keys(L, 3)
        state = L.state_dict()
    assert state["feed"]["data"]["stream"]
    with _follow(b) as L:
        with pytest.raises(ValueError, match="belongs to stream .* but .*/b is stream .*another growing dataset"):
            L.load_state_dict(state)
    with _follow(tmp_path / "not-yet") as L:  # a folder with nothing published cannot hold what was consumed
        with pytest.raises(ValueError, match="12 samples consumed.*has published nothing"):
            L.load_state_dict(state)
    with _follow(a) as L:
        L.load_state_dict(state)
        assert sum(len(k) for k in _keys(L)) == 50 - 12


@pytest.mark.parametrize("edit,match", [
    ({"step": 14}, r"state\['step'\]=14 is outside the ended stream .*valid 0\.\.13"),
    ({"step": 10**15}, r"state\['step'\]=1000000000000000 is outside .*valid 0\.\.13"),
    ({"batch_sizes": [10**18]}, r"must list one batch size in \[1, 2147483647\]"),
    ({"base": 51}, r"state\['base'\]=51 is outside .*valid 0\.\.50"),
    ({"step": 5}, r"watermark'\]\['samples'\]=12 does not match its step 5"),
])
def test_follow_position_outside_the_stream_is_refused(streams, edit, match):
    a, _ = streams
    with _follow(a) as L:
        _keys(L, 3)
        state = L.state_dict()
        with pytest.raises(ValueError, match=match):
            L.load_state_dict(_edit(state, **edit))


def test_version_1_follow_state_still_resumes(streams):
    a, _ = streams
    with _follow(a) as L:
        full = _keys(L)
    with _follow(a) as L:
        _keys(L, 4)
        old = L.state_dict()
    old["feed"]["version"] = 1
    del old["feed"]["data"]
    with _follow(a) as L:
        L.load_state_dict(old)
        assert _keys(L) == full[4:]


# -- mixtures ------------------------------------------------------------------------
def test_mixture_state_of_other_sources_with_the_same_counts_is_refused(twins, tmp_path):
    a, b = twins
    c = _write(tmp_path / "c", "c", 30, 10)
    with Loader(Mixture([a, c], weights=[1, 1], epoch_samples=40), 4) as L:
        _keys(L, 2)
        state = L.state_dict()
        with pytest.raises(ValueError, match=r"state\['step'\]=11 is outside epoch 0 .*valid 0\.\.10"):
            L.load_state_dict(_edit(state, step=11))
        with pytest.raises(ValueError, match=r"outside .*valid 0\.\.10"):
            L.load_state_dict(_edit(state, step=10**15))
        with pytest.raises(ValueError, match=r"batch size in \[1, 2147483647\]"):
            L.load_state_dict(_edit(state, batch_sizes=[10**18]))
        with pytest.raises(ValueError, match=r"state\['base'\]=41 is outside"):
            L.load_state_dict(_edit(state, base=41))
    with Loader(Mixture([b, c], weights=[1, 1], epoch_samples=40), 4) as L:
        with pytest.raises(ValueError, match="belongs to other data than this Mixture's sources.*digests"):
            L.load_state_dict(state)


def test_stream_mixture_state_of_another_stream_or_past_its_end_is_refused(streams, tmp_path):
    a, b = streams
    c = _write(tmp_path / "c", "c", 30, 10)

    def mix(root):
        return Loader(Mixture([c, ShardDataset(root, follow=True, poll_s=0.02, idle_timeout_s=5)], weights=[1, 1]), 4)

    with mix(a) as L:
        steps = len(_keys(L))
    with mix(a) as L:
        _keys(L, 3)
        state = L.state_dict()
        with pytest.raises(ValueError, match=rf"state\['step'\]={steps + 1} is outside the ended stream .*"
                                             rf"valid 0\.\.{steps}"):
            L.load_state_dict(_edit(state, step=steps + 1))
        with pytest.raises(ValueError, match=r"is outside the ended stream"):
            L.load_state_dict(_edit(state, step=10**15))
        with pytest.raises(ValueError, match=r"fixed_at'\]=\[7, 0\] does not match"):
            L.load_state_dict(_edit(state, fixed_at=[7, 0]))
    with mix(b) as L:
        with pytest.raises(ValueError, match="belongs to stream .*another growing dataset"):
            L.load_state_dict(state)
