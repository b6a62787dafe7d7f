"""Balancer: per-rank batch sizes from measured speed, agreed mid-run (ranks as threads of one
process, their gather a barrier; the Loader's own guarantees hold through every change)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from shardfeed.loader import Loader, ShardDataset
from shardfeed.loader.balancer import Balancer

N = 600


class ThreadGather:
    """all_gather_object for ranks that are threads: each posts its object, all wait, all read."""

    def __init__(self, world: int):
        self.slots = [None] * world
        self.barrier = threading.Barrier(world, timeout=30)

    def of(self, rank: int):
        def gather(obj):
            self.slots[rank] = obj
            self.barrier.wait()
            out = list(self.slots)
            self.barrier.wait()  # nobody posts the next round before all have read this one
            return out
        return gather


def run_ranks(root, world, work, epochs=2, every=4, sizes=None, workers=0, **balancer):
    """Each rank a thread: ``epochs`` epochs of its loader, ``work(rank, batch, balancer)`` per step.
    Returns per rank (keys per epoch, loader state, loader stats, balancer)."""
    gather = ThreadGather(world)
    out = [None] * world
    errors = []

    def rank_main(r):
        try:
            ld = Loader(ShardDataset(root, rank=r, world_size=world, seed=1), sizes or [16] * world,
                        num_workers=workers)
            bal = Balancer(ld, every=every, gather=gather.of(r), **balancer)
            keys = []
            for _ in range(epochs):
                keys.append([])
                for b in ld:
                    keys[-1] += b["__key__"]
                    work(r, b, bal)
            out[r] = (keys, ld.state_dict(), ld.stats(), bal)
            ld.close()
        except BaseException as e:  # noqa: BLE001 - reported by the test's thread
            errors.append(e)
            gather.barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return out


def test_balancer_finds_the_speed_ratio_from_given_compute_times(make_dataset):
    """Rank 1 three times slower per sample: the sizes move to 24 / 8 of the global 32, every
    sample still comes once per epoch, and the measurements behind the change are in stats and state."""
    root = make_dataset(N, shard_samples=50)
    cost = [0.001, 0.003]
    out = run_ranks(root, 2, lambda r, b, bal: bal.step(compute_s=cost[r] * len(b["__key__"]) + 0.002))
    for r in range(2):
        _, state, stats, bal = out[r]
        assert bal.loader.batch_sizes() == (24, 8)
        assert stats["balance"][0]["from"] == [16, 16] and stats["balance"][-1]["batch_sizes"] == [24, 8]
        why = json.loads(json.dumps(state["balance"][-1]["why"]))
        assert why["proposal"]["batch_sizes"] == [24, 8]
        assert [m[0][0] for m in why["measured"]] == [16, 16]  # per rank: [batch size, median s, steps]
    for ep in range(2):
        keys = out[0][0][ep] + out[1][0][ep]
        assert set(keys) == {f"{i:08d}" for i in range(N)} and len(keys) - N < 32
    # one change only: hysteresis keeps a split that is right
    assert len(out[0][2]["balance"]) == 1


@pytest.mark.parametrize("workers", [0, 2])
def test_balancer_measures_compute_time_itself(make_dataset, workers):
    """No times passed: each rank sleeps per sample (rank 1 three times as long) and the balancer
    measures the time between steps less the loader's data wait."""
    root = make_dataset(N, shard_samples=50)
    per_sample = [0.0005, 0.0015]

    def work(r, b, bal):
        time.sleep(per_sample[r] * len(b["__key__"]))
        bal.step()
    out = run_ranks(root, 2, work, epochs=1, every=5, workers=workers)
    sizes = out[0][3].loader.batch_sizes()
    assert sizes == out[1][3].loader.batch_sizes()
    assert 20 <= sizes[0] <= 28, out[0][2]["balance"]  # 24: a 3x ratio (sleeps overshoot on a busy machine)
    keys = out[0][0][0] + out[1][0][0]
    assert set(keys) == {f"{i:08d}" for i in range(N)}


def test_three_ranks_with_limits_and_a_rounding_rule(make_dataset):
    root = make_dataset(N, shard_samples=50)
    cost = [0.001, 0.002, 0.004]
    out = run_ranks(root, 3, lambda r, b, bal: bal.step(compute_s=cost[r] * len(b["__key__"])),
                    sizes=[16, 16, 16], multiple=4, max_batch=[24, 48, 48])
    sizes = out[0][3].loader.batch_sizes()
    assert sum(sizes) == 48 and all(b % 4 == 0 for b in sizes) and sizes[0] <= 24
    assert sizes == (24, 16, 8)
    for ep in range(2):
        assert set(k for r in range(3) for k in out[r][0][ep]) == {f"{i:08d}" for i in range(N)}


def test_ranks_at_different_steps_are_refused(make_dataset):
    root = make_dataset(N, shard_samples=50)

    def work(r, b, bal):
        if r == 1 and bal.steps == 0:
            bal.step(compute_s=0.01)  # rank 1 counts one step twice
        bal.step(compute_s=0.01)
    with pytest.raises(RuntimeError, match="different positions"):
        run_ranks(root, 2, work, epochs=1)


def test_default_gather_alone_and_without_a_process_group(make_dataset):
    root = make_dataset(60, shard_samples=20)
    with Loader(ShardDataset(root), 8) as ld:
        bal = Balancer(ld, every=2)
        for _ in ld:
            bal.step(compute_s=0.01)
        assert bal.agreements == 4 and ld.batch_sizes() == (8,)
    with pytest.raises(ValueError, match="needs torch.distributed initialised or a gather"):
        Balancer(Loader(ShardDataset(root, rank=0, world_size=2), 8))
    with pytest.raises(ValueError, match="every=1"):
        Balancer(Loader(ShardDataset(root), 8), every=1)


def _slow_read(sample):
    time.sleep(0.0004)
    return sample


def test_time_waiting_for_data_is_not_taken_for_compute(make_dataset):
    """Rank 0's data is slow to make (its consumer waits inside next()), both ranks compute alike:
    the balancer sees equal speed and keeps the split (a slow input pipeline is not fixed by a
    smaller batch on that rank's accelerator)."""
    root = make_dataset(N, shard_samples=50)
    gather = ThreadGather(2)
    sizes = []

    def rank_main(r):
        ds = ShardDataset(root, rank=r, world_size=2, seed=1, transform=_slow_read if r == 0 else None)
        with Loader(ds, [16, 16]) as ld:
            bal = Balancer(ld, every=5, gather=gather.of(r))
            for _ in ld:
                time.sleep(0.008)
                bal.step()
            sizes.append(ld.batch_sizes())
    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sizes == [(16, 16), (16, 16)]


def test_a_stage_change_starts_the_measurements_anew_within_its_own_global_batch(make_dataset):
    """Cyclic progressive training: the balancer splits each stage's global batch; a new stage
    starts from its own sizes and is measured anew (also when the cycle comes back)."""
    from shardfeed.loader import BatchSchedule, Stage

    root = make_dataset(N, shard_samples=50)
    sched = BatchSchedule([Stage([16, 16], image_size=8), Stage([8, 8], image_size=16)], cycle=True)
    gather = ThreadGather(2)
    seen = [[], []]

    def rank_main(r):
        with Loader(ShardDataset(root, rank=r, world_size=2, seed=1), sched) as ld:
            bal = Balancer(ld, every=4, gather=gather.of(r))
            for epoch in range(3):
                ld.set_epoch(epoch)
                first = ld.batch_sizes()
                for b in ld:
                    bal.step(compute_s=(0.001, 0.003)[r] * len(b["__key__"]))
                seen[r].append((first, ld.feed.job(epoch).batch_sizes))
    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert seen[0] == seen[1]
    assert seen[0] == [((16, 16), (24, 8)), ((8, 8), (12, 4)), ((16, 16), (24, 8))], seen[0]
