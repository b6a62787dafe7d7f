"""Resume: exact mid-epoch resume for any num_workers, elastic resume onto
another world size, schedules, and state dicts that stay small."""

from __future__ import annotations

import json

import pytest

from loader_helpers import check_save_restore, rank_loaders, step_together
from shardfeed.loader import BatchSchedule, Loader, ShardDataset, Stage


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_exact_resume_at_several_points(make_dataset, workers):
    root = make_dataset(100, shard_samples=30)
    # 100 samples, batch 16: 7 steps, the last one holds 4 samples
    points = [0, 1, 3, 6, 7]  # 6: only the last (short) batch is left; 7: the epoch is over
    check_save_restore(lambda: Loader(ShardDataset(root, seed=5), 16, num_workers=workers), points)


@pytest.mark.parametrize("shuffle", ["none", "shard", "block"])
def test_exact_resume_for_every_order(make_dataset, shuffle):
    root = make_dataset(90, shard_samples=20)
    check_save_restore(lambda: Loader(ShardDataset(root, shuffle=shuffle, seed=2), 8), [2, 11])


def test_exact_resume_across_a_stage_change(make_dataset):
    root = make_dataset(60, shard_samples=20)
    schedule = BatchSchedule([Stage(16, image_size=8), Stage(7, image_size=16)], cycle=True)
    check_save_restore(lambda: Loader(ShardDataset(root), schedule, num_workers=1), [1, 3], epochs=3)


def test_exact_resume_on_every_rank_of_a_job(make_dataset):
    root = make_dataset(101, shard_samples=25)
    for r in range(3):
        check_save_restore(lambda r=r: Loader(ShardDataset(root, rank=r, world_size=3), 6), [2, 5])


def test_state_is_small_plain_and_versioned(make_dataset):
    root = make_dataset(200, shard_samples=50)
    with Loader(ShardDataset(root), 10, num_workers=1) as loader:
        it = iter(loader)
        next(it), next(it)
        state = loader.state_dict()
    # version 2: the feed's state under one key (version 1 was flat; still read, see below)
    assert state["version"] == 2 and state["step"] == 2 and state["epoch"] == 0
    assert state["feed"]["kind"] == "epoch" and state["feed"]["step"] == 2
    assert len(json.dumps(state)) < 400  # positions and counters, no sample lists
    assert json.loads(json.dumps(state)) == state


def test_set_epoch_keeps_a_resumed_position_and_jumps_otherwise(make_dataset):
    root = make_dataset(40, shard_samples=20)
    a = Loader(ShardDataset(root), 10)
    it = iter(a)
    next(it)
    st = a.state_dict()
    b = Loader(ShardDataset(root), 10)
    b.load_state_dict(st)
    b.set_epoch(0)  # a training loop calling set_epoch(epoch) every epoch
    assert len(list(b)) == 3
    b.set_epoch(5)
    assert len(list(b)) == 4 and b.epoch == 6


def test_state_of_another_dataset_is_refused(make_dataset):
    a = Loader(ShardDataset(make_dataset(40, shard_samples=20)), 10)
    b = Loader(ShardDataset(make_dataset(41, shard_samples=20)), 10)
    with pytest.raises(ValueError, match="samples: saved 40, now 41"):
        b.load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="version"):
        b.load_state_dict({"version": 99})


def _elastic(root, old_w, new_w, steps, old_bs, new_bs, n, **kw):
    old = rank_loaders(root, old_w, old_bs, **kw)
    consumed, taken = step_together(old, steps)
    assert taken == [steps] * old_w
    states = [L.state_dict() for L in old]
    assert all(s == states[0] for s in states)  # any rank's state describes the job
    for L in old:
        L.close()
    new = rank_loaders(root, new_w, new_bs, **kw)
    for L in new:
        L.load_state_dict(states[-1])
    rest, taken2 = step_together(new)
    assert len(set(taken2)) == 1  # every new rank takes the same number of steps
    done = {k for ks in consumed for k in ks}
    left = [k for ks in rest for k in ks]
    everything = {f"{i:08d}" for i in range(n)}
    assert set(left) == everything - done  # exactly what was not consumed
    assert len(left) - len(set(left)) < sum(new_bs) if isinstance(new_bs, list) else new_w
    # and the next epoch is a full one on the new world size
    nxt, _ = step_together(new)
    assert {k for ks in nxt for k in ks} == everything
    for L in new:
        L.close()


@pytest.mark.parametrize("shuffle", ["global", "block", "none"])
def test_elastic_resume_2_to_3_and_3_to_2(make_dataset, shuffle):
    root = make_dataset(157, shard_samples=20)
    _elastic(root, 2, 3, 4, 8, 8, 157, shuffle=shuffle, seed=4)
    _elastic(root, 3, 2, 3, 8, 5, 157, shuffle=shuffle, seed=4)


def test_elastic_resume_twice_in_one_epoch(make_dataset):
    """2 -> 3 ranks, then 3 -> 2 inside the same epoch: the state carries the history."""
    root = make_dataset(150, shard_samples=25)
    old = rank_loaders(root, 2, 8)
    first, _ = step_together(old, 3)
    mid = rank_loaders(root, 3, 8)
    for L in mid:
        L.load_state_dict(old[0].state_dict())
    second, _ = step_together(mid, 2)
    new = rank_loaders(root, 2, 8)
    for L in new:
        L.load_state_dict(mid[1].state_dict())
    rest, _ = step_together(new)
    done = {k for part in (first, second) for ks in part for k in ks}
    assert len(done) == 3 * 16 + 2 * 24
    assert set(k for ks in rest for k in ks) == {f"{i:08d}" for i in range(150)} - done


def test_elastic_resume_with_per_rank_batch_sizes(make_dataset):
    root = make_dataset(120, shard_samples=30)
    _elastic(root, 2, 3, 3, [8, 4], [4, 4, 8], 120)


def test_version_1_state_of_shardfeed_0_1_still_resumes(make_dataset):
    """Checkpoints written before the feed existed (flat version-1 states) resume exactly."""
    root = make_dataset(100, shard_samples=30)
    with Loader(ShardDataset(root, seed=5), 16) as ref:
        expected = [list(b["__key__"]) for b in ref]
    fp = {"samples": 100, "shards": 4, "order": "global", "seed": 5, "drop_last": False}
    old = {"version": 1, "epoch": 0, "step": 3, "world_size": 1, "batch_sizes": [16], "history": [], "dataset": fp}
    with Loader(ShardDataset(root, seed=5), 16) as b:
        b.load_state_dict(old)
        assert [list(x["__key__"]) for x in b] == expected[3:]
