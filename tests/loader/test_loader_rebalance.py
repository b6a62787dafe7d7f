"""Loader.rebalance: per-rank batch sizes changed at a step boundary keep coverage, equal
steps and exact resume (ranks simulated in one process, one loader per rank, in lock step)."""

from __future__ import annotations

import json

import pytest

from shardfeed.loader import BatchSchedule, Loader, ShardDataset, Stage

N = 157  # samples: no batch size below divides it, so every epoch ends short or padded


def loaders(root, world, sizes, workers=0, seed=3, **ds):
    return [Loader(ShardDataset(root, rank=r, world_size=world, seed=seed, **ds), list(sizes), num_workers=workers)
            for r in range(world)]


def lockstep(lds, changes=None, stop=None):
    """One epoch of every rank's loader in lock step (as DDP steps them): after the k-th batch of
    this run, every rank calls rebalance(changes[k]) (k=0: before the first). Returns per-rank keys
    per step, and each rank's state after ``stop`` batches (then the run ends there)."""
    changes = dict(changes or {})
    if 0 in changes:
        for ld in lds:
            ld.rebalance(changes[0])
    its = [iter(ld) for ld in lds]
    out = [[] for _ in lds]
    k = 0
    while True:
        got = [next(it, None) for it in its]
        if all(g is None for g in got):
            return out, None
        assert all(g is not None for g in got), f"ranks ended at different steps (after {k} steps)"
        for r, b in enumerate(got):
            out[r].append(list(b["__key__"]))
        k += 1
        if k in changes:
            for ld in lds:
                ld.rebalance(changes[k])
        if stop is not None and k == stop:
            return out, [ld.state_dict() for ld in lds]


def check_epoch(steps, sizes_after, n=N):
    """Every sample at least once; only padding repeats, less than one global step of the last job."""
    keys = [k for rank in steps for b in rank for k in b]
    assert len({len(rank) for rank in steps}) == 1, "ranks took different numbers of steps"
    assert set(keys) == {f"{i:08d}" for i in range(n)}
    assert len(keys) - n < sum(sizes_after)


def close(lds):
    for ld in lds:
        ld.close()


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("where", ["start", "mid", "last"])
def test_rebalance_keeps_coverage_and_equal_steps(make_dataset, world, workers, where):
    root = make_dataset(N, shard_samples=20)
    start = [8] * world
    new = [12, 4, 7][:world]
    lds = loaders(root, world, start, workers)
    steps = len(lds[0])
    at = {"start": 0, "mid": 4, "last": steps}[where]
    got, _ = lockstep(lds, {at: new})
    check_epoch(got, new)
    # batch sizes on each side of the change are the ones asked for
    for r in range(world):
        sizes = [len(b) for b in got[r]]
        assert all(s == start[r] for s in sizes[:min(at, steps - 1)])  # the epoch's last batch may be short
        assert all(s == new[r] for s in sizes[at:-1])
    # the next epoch is dealt with the new sizes from its start
    nxt, _ = lockstep(lds)
    check_epoch(nxt, new)
    assert [len(b) for b in nxt[0][:-1]] == [new[0]] * (len(nxt[0]) - 1)
    assert len(nxt[0]) == len(lds[0]) == -(-N // sum(new))
    close(lds)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_two_rebalances_in_one_epoch_and_the_global_batch_changing(make_dataset, world, workers):
    root = make_dataset(N, shard_samples=20)
    lds = loaders(root, world, [8] * world, workers)
    first, second = [5, 11, 9][:world], [3, 2, 6][:world]
    got, _ = lockstep(lds, {2: first, 5: second})
    check_epoch(got, second)
    assert [len(b) for b in got[0][:7]] == [8, 8, first[0], first[0], first[0], second[0], second[0]]
    close(lds)


def reference(root, world, start, changes, workers=0, epochs=2):
    lds = loaders(root, world, start, workers)
    out = [lockstep(lds, changes)[0]] + [lockstep(lds)[0] for _ in range(epochs - 1)]
    close(lds)
    return out


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("changes", [{3: [12, 4, 6]}, {2: [12, 4, 6], 6: [3, 9, 5]}], ids=["one", "two"])
def test_exact_resume_after_rebalances(make_dataset, world, workers, changes):
    """Saved after one or two rebalances, restored by loaders made with the original sizes:
    the rest of the epoch and the next one are exactly the uninterrupted run's."""
    root = make_dataset(N, shard_samples=20)
    changes = {k: v[:world] for k, v in changes.items()}
    ref = reference(root, world, [8] * world, changes, workers)
    stop = max(changes) + 2
    lds = loaders(root, world, [8] * world, workers)
    before, states = lockstep(lds, changes, stop=stop)
    close(lds)
    states = [json.loads(json.dumps(s)) for s in states]  # a checkpoint is plain data
    assert [r[:stop] for r in ref[0]] == before
    new = loaders(root, world, [8] * world, workers)
    for ld, st in zip(new, states):
        ld.load_state_dict(st)
    assert new[0].stats()["balance"][-1]["batch_sizes"] == changes[max(changes)]
    rest, _ = lockstep(new)
    assert rest == [r[stop:] for r in ref[0]]
    assert lockstep(new)[0] == ref[1]
    close(new)


def test_resume_between_two_rebalances_then_the_second(make_dataset):
    """A job restored between the two rebalances, given the second at the same step, runs as the
    uninterrupted one: the rebalance is a function of the position, not of the process's past."""
    root = make_dataset(N, shard_samples=20)
    ref = reference(root, 2, [8, 8], {2: [12, 4], 6: [3, 9]}, epochs=1)
    lds = loaders(root, 2, [8, 8])
    _, states = lockstep(lds, {2: [12, 4]}, stop=4)
    close(lds)
    new = loaders(root, 2, [8, 8])
    for ld, st in zip(new, states):
        ld.load_state_dict(st)
    rest, _ = lockstep(new, {2: [3, 9]})
    assert rest == [r[4:] for r in ref[0]]
    close(new)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("old,new", [(2, 3), (3, 2), (2, 1)])
def test_elastic_resume_to_another_world_size_after_a_rebalance(make_dataset, workers, old, new):
    """Any rank's state after a rebalance, loaded by a job of another world size (with its own
    sizes), delivers exactly the samples not yet consumed; the next epoch is whole again."""
    root = make_dataset(N, shard_samples=20)
    lds = loaders(root, old, [8] * old, workers)
    done, states = lockstep(lds, {2: [12, 4, 6][:old]}, stop=5)
    close(lds)
    consumed = {k for rank in done for b in rank for k in b}
    assert len(consumed) == 2 * 8 * old + 3 * sum([12, 4, 6][:old])
    sizes = [5, 9, 4][:new]
    more = loaders(root, new, sizes, workers)
    for ld in more:
        ld.load_state_dict(states[-1])
    rest, _ = lockstep(more)
    left = [k for rank in rest for b in rank for k in b]
    assert set(left) == {f"{i:08d}" for i in range(N)} - consumed
    assert len(left) - len(set(left)) < sum(sizes)
    assert [len(b) for b in rest[0][:-1]] == [sizes[0]] * (len(rest[0]) - 1)
    check_epoch(lockstep(more)[0], sizes)
    close(more)


def test_rebalance_between_epochs_and_back_to_the_schedule(make_dataset):
    root = make_dataset(N, shard_samples=20)
    lds = loaders(root, 2, [8, 8])
    lockstep(lds)
    for ld in lds:
        ld.rebalance([10, 6])  # outside the loop: the next epoch starts with them
    got, _ = lockstep(lds, {3: None})  # None: the schedule's sizes again, from step 3
    check_epoch(got, [8, 8])
    assert [len(b) for b in got[1][:5]] == [6, 6, 6, 8, 8]
    assert "balanced" not in lds[0].state_dict()["feed"]
    close(lds)


def test_rebalanced_sizes_hold_for_their_stage_only(make_dataset):
    """A stage change goes back to that stage's own sizes (the balancer measures anew there); the
    rebalanced sizes hold again where the cycle comes back to their stage."""
    root = make_dataset(N, shard_samples=20)
    sched = BatchSchedule([Stage([8, 8], image_size=8), Stage([4, 4], image_size=16)], cycle=True)
    lds = [Loader(ShardDataset(root, rank=r, world_size=2, seed=3), sched) for r in range(2)]
    got, _ = lockstep(lds, {2: [12, 4]})
    check_epoch(got, [12, 4])
    stage1, _ = lockstep(lds)
    assert {len(b) for b in stage1[0][:-1]} == {4}
    again, _ = lockstep(lds)
    assert {len(b) for b in again[0][:-1]} == {12}
    close(lds)


def test_rebalance_refuses_bad_sizes_and_feeds_it_cannot_deal(make_dataset):
    root = make_dataset(40, shard_samples=20)
    ld = Loader(ShardDataset(root, rank=0, world_size=2), [8, 8])
    with pytest.raises(ValueError, match="3 batch sizes for world_size=2"):
        ld.rebalance([4, 4, 4])
    with pytest.raises(ValueError, match="batch_sizes"):
        ld.rebalance([4, 0])
    with pytest.raises(TypeError, match="one batch size per rank"):
        ld.rebalance(8)
    assert "balanced" not in ld.state_dict()["feed"] and ld.stats().get("balance") is None
    from shardfeed.loader import Mixture

    mixed = Loader(Mixture([ShardDataset(root), ShardDataset(root)]), 4)
    with pytest.raises(TypeError, match="cannot change its per-rank batch sizes"):
        mixed.rebalance([4])
    ld.close()
    mixed.close()


def test_a_damaged_saved_rebalance_is_refused(make_dataset):
    root = make_dataset(40, shard_samples=20)
    ld = Loader(ShardDataset(root, rank=0, world_size=2), [8, 8])
    ld.rebalance([12, 4])
    state = ld.state_dict()
    for bad in ([5, [12, 4]], [0, [12, 0]], [0], "x"):
        broken = json.loads(json.dumps(state))
        broken["feed"]["balanced"] = bad
        with pytest.raises(ValueError, match="balanced"):
            Loader(ShardDataset(root, rank=0, world_size=2), [8, 8]).load_state_dict(broken)
    ld.close()


def test_the_audit_of_a_rebalanced_epoch_passes(make_dataset, tmp_path, capsys):
    """``shardfeed audit`` judges an epoch rebalanced twice by the whole epoch (not the rest the last
    plan holds) and the padding of every job it had."""
    from shardfeed.loader import audit
    from shardfeed.tools.cli import main as cli

    root = make_dataset(N, shard_samples=20)
    lds = [Loader(ShardDataset(root, rank=r, world_size=2, seed=3), [8, 8], audit=True) for r in range(2)]
    lockstep(lds, {2: [12, 4], 5: [3, 9]})
    paths = [audit.save(ld.audit_state(), tmp_path / f"r{r}.json") for r, ld in enumerate(lds)]
    assert cli(["audit", *paths]) == 0, capsys.readouterr().out
    assert audit.load(paths[0])["epochs"]["0"]["expect"]["unique"] == [N]
    close(lds)


def test_the_state_keeps_the_last_rebalances_and_why_the_newest_was_made(make_dataset):
    root = make_dataset(N, shard_samples=20)
    ld = Loader(ShardDataset(root), 8)
    it = iter(ld)
    next(it)
    ld.rebalance([6], why={"n": 1})
    next(it)
    ld.rebalance([10], why={"n": 2})
    log = ld.state_dict()["balance"]
    assert [(e["step"], e["from"], e["batch_sizes"]) for e in log] == [(1, [8], [6]), (2, [6], [10])]
    assert log[0]["why"] is None and log[1]["why"] == {"n": 2}  # measurements of the newest only
    assert [e["why"] for e in ld.stats()["balance"]] == [{"n": 1}, {"n": 2}]
    for _ in range(20):
        ld.rebalance([8 + len(ld.stats()["balance"]) % 3])
    assert len(ld.state_dict()["balance"]) == 16
    again = Loader(ShardDataset(root), 8)
    again.load_state_dict(json.loads(json.dumps(ld.state_dict())))
    assert again.stats()["balance"] == ld.state_dict()["balance"] and again.batch_sizes() == ld.batch_sizes()
    ld.close()
    again.close()
