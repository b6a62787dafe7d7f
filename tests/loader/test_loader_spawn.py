"""Workers start with spawn as well as fork: the maker factory is a plain
picklable object, not a closure over the dataset."""

from __future__ import annotations

import pickle

import pytest

from loader_helpers import keys_of
from shardfeed.loader import Loader, ShardDataset
from shardfeed.loader.collate import materialize
from shardfeed.loader.workers import MakerFactory


def test_maker_factory_pickles_and_builds_a_maker(make_dataset):
    root = make_dataset(20, shard_samples=10)
    f = pickle.loads(pickle.dumps(MakerFactory(ShardDataset(root, shuffle="none"), None)))
    maker = f()
    try:
        cols, _ = maker.make([3, 4])
        assert materialize(cols)["__key__"] == ["00000003", "00000004"]
    finally:
        maker.close()


@pytest.mark.timeout(120)
def test_spawned_workers_deliver_the_same_batches_as_forked(make_dataset):
    root = make_dataset(60, shard_samples=15)
    expected = keys_of(Loader(ShardDataset(root, seed=1), 8, num_workers=0))
    with Loader(ShardDataset(root, seed=1), 8, num_workers=2, multiprocessing_context="spawn") as loader:
        got = keys_of(loader)
        pids = loader.worker_pids()
    assert got == expected and len(pids) == 2
