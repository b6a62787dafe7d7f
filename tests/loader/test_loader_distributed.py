"""Ranks as real processes joined by gloo (forked, on this machine): coverage,
equal step counts under a DDP-style collective per step, determinism across
worker counts, and elastic resume between jobs of different sizes."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from distributed_utils import run_ranks
from shardfeed.loader import Loader, ShardDataset

pytestmark = pytest.mark.distributed


def _epoch(rank, world, root, batch, workers, state=None, steps=None):
    # rank and world size come from torch.distributed (no arguments)
    ds = ShardDataset(root, seed=11)
    assert (ds.rank, ds.world_size) == (rank, world)
    with Loader(ds, batch, num_workers=workers) as loader:
        if state is not None:
            loader.load_state_dict(state)
        keys, taken = [], 0
        for b in loader:
            # what DDP does every step: a collective all ranks must join
            t = torch.ones(1)
            dist.all_reduce(t)
            assert t.item() == world
            keys += b["__key__"]
            taken += 1
            if steps is not None and taken == steps:
                return keys, taken, loader.state_dict(), len(loader)
        return keys, taken, loader.state_dict(), len(loader)


@pytest.mark.parametrize("world,workers", [(1, 2), (2, 0), (2, 2), (3, 1)])
def test_ranks_cover_the_epoch_in_equal_steps(make_dataset, world, workers):
    n = 211
    root = make_dataset(n, shard_samples=40)
    results = run_ranks(_epoch, world, root, 16, workers, timeout=90)
    steps = {r[1] for r in results}
    assert len(steps) == 1 and steps == {results[0][3]}
    keys = [k for r in results for k in r[0]]
    assert set(keys) == {f"{i:08d}" for i in range(n)}
    assert len(keys) - n <= world - 1  # padding repeats at most world_size - 1 samples
    single = [ShardDataset(root, seed=11, rank=r, world_size=world) for r in range(world)]
    for r, ds in enumerate(single):  # same order as a 0-worker loader built for that rank
        with Loader(ds, 16) as ref:
            assert [k for b in ref for k in b["__key__"]] == results[r][0]


def test_hang_2_ranks_2001_samples(make_dataset):
    """WebDataset gives 2 ranks 21 vs 20 batches of 2,001 samples (PEERS.md): the
    rank with one batch more blocks forever in DDP's all_reduce. Here both
    take 11 steps of 100 (one sample repeated)."""
    root = make_dataset(2001, shard_samples=500)
    results = run_ranks(_epoch, 2, root, 100, 0, timeout=90)
    assert [r[1] for r in results] == [11, 11]
    keys = results[0][0] + results[1][0]
    assert len(keys) == 2002 and len(set(keys)) == 2001


@pytest.mark.parametrize("old,new", [(2, 3), (3, 2)])
def test_elastic_resume_between_jobs(make_dataset, old, new):
    n = 190
    root = make_dataset(n, shard_samples=30)
    first = run_ranks(_epoch, old, root, 8, 1, None, 4, timeout=90)
    state = first[old - 1][2]
    second = run_ranks(_epoch, new, root, 8, 0, state, timeout=90)
    done = {k for r in first for k in r[0]}
    assert len(done) == old * 4 * 8
    rest = [k for r in second for k in r[0]]
    assert set(rest) == {f"{i:08d}" for i in range(n)} - done
    assert len({r[1] for r in second}) == 1
