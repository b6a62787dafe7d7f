"""A transform's random draws are seeded per batch from (seed, epoch, step, rank).

Regression: forked workers inherited one RNG state, so a transform drawing
torch.rand got the same draws in every worker (batch 0 and batch 1 equal
with 2 workers), and the draws changed with num_workers and on resume.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from shardfeed.loader import Loader, ShardDataset


def draw(sample):
    sample["t"] = float(torch.rand(()))
    sample["n"] = float(np.random.rand())
    sample["r"] = random.random()
    return sample


def draw_rng(sample, rng):
    sample["g"] = float(rng.random())
    sample["t"] = float(torch.rand(()))
    return sample


FIELDS = ("t", "n", "r")


def batches(root, num_workers, epochs=1, transform=draw, fields=FIELDS, **kw):
    ds = ShardDataset(root, transform=transform, seed=kw.pop("seed", 5), **kw)
    out = []
    with Loader(ds, 8, num_workers=num_workers) as loader:
        for _ in range(epochs):
            out.append([(list(b["__key__"]), [b[f].tolist() for f in fields]) for b in loader])
    return out


@pytest.fixture
def root(make_dataset):
    return make_dataset(64, shard_samples=16)


def draws_of(epoch):
    return [v for _, fields in epoch for f in fields for v in f]


def test_same_draws_for_any_num_workers(root):
    ref = batches(root, 0, epochs=2)
    assert batches(root, 2, epochs=2) == ref
    assert batches(root, 3, epochs=2) == ref


def test_draws_differ_across_batches_epochs_and_ranks(root):
    for w in (0, 2):
        e0, e1 = batches(root, w, epochs=2)
        per_batch = [tuple(fields[0]) for _, fields in e0]
        assert len(set(per_batch)) == len(per_batch), f"num_workers={w}: two batches drew the same"
        assert len(set(draws_of(e0))) == len(draws_of(e0))
        assert not set(draws_of(e0)) & set(draws_of(e1)), f"num_workers={w}: epoch 1 repeats epoch 0's draws"
    r0 = batches(root, 2, rank=0, world_size=2)[0]
    r1 = batches(root, 2, rank=1, world_size=2)[0]
    assert not set(draws_of(r0)) & set(draws_of(r1))
    assert batches(root, 0, seed=6)[0] != batches(root, 0, seed=5)[0]


def test_draws_survive_a_resume(root):
    ref = batches(root, 0)[0]
    for w in (0, 2):
        ds = ShardDataset(root, transform=draw, seed=5)
        with Loader(ds, 8, num_workers=w) as a:
            it = iter(a)
            for _ in range(3):
                next(it)
            state = a.state_dict()
        with Loader(ShardDataset(root, transform=draw, seed=5), 8, num_workers=w) as b:
            b.load_state_dict(state)
            rest = [(list(x["__key__"]), [x[f].tolist() for f in FIELDS]) for x in b]
        assert rest == ref[3:], f"num_workers={w}: resumed draws differ"


def test_rng_keyword_gets_a_seeded_generator(root):
    ref = batches(root, 0, transform=draw_rng, fields=("g", "t"))
    assert batches(root, 2, transform=draw_rng, fields=("g", "t")) == ref
    g = [v for _, fields in ref[0] for v in fields[0]]
    assert len(set(g)) == len(g)
    # the generator is not the global numpy RNG: its draws differ from np.random's for the batch
    assert set(g).isdisjoint(draws_of(batches(root, 0)[0]))


def test_main_process_randomness_untouched_at_0_workers(root):
    def loop_draws(with_loader):
        torch.manual_seed(123)
        np.random.seed(123)
        random.seed(123)
        got = []
        it = iter(Loader(ShardDataset(root, transform=draw, seed=5), 8)) if with_loader else iter(range(8))
        for _ in it:
            got.append((float(torch.rand(())), float(np.random.rand()), random.random()))
        return got

    assert loop_draws(True) == loop_draws(False)
