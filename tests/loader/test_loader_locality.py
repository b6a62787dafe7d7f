"""Locality-aware dealing through ShardDataset(locality=True): ranks read
mostly the shards their node owns, and each global batch (the union over
ranks of one step) holds exactly the samples plain dealing puts there."""

from __future__ import annotations

import numpy as np
import pytest

from loader_helpers import check_save_restore, keys_of
from shardfeed.formats import open_index
from shardfeed.loader import Loader, ShardDataset


def _steps(root, world, batch, **kw):
    """keys[rank][step] for one epoch of every rank."""
    out = []
    for r in range(world):
        with Loader(ShardDataset(root, rank=r, world_size=world, **kw), batch) as loader:
            out.append([keys_of([b]) for b in loader])
    return out


def _remote_fraction(root, steps, ranks_per_node):
    idx = open_index(root)
    nodes = -(-len(steps) // ranks_per_node)
    remote = total = 0
    for r, batches in enumerate(steps):
        ids = np.array([int(k) for b in batches for k in b])
        shard, _ = idx.locate(ids)
        remote += int((shard % nodes != r // ranks_per_node).sum())
        total += ids.size
    return remote / total


def test_two_ranks_per_node_on_two_nodes_read_fewer_remote_shards_same_global_batches(make_dataset, monkeypatch):
    root = make_dataset(640, shard_samples=20)  # 32 shards, 16 owned by each node
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    plain = _steps(root, 4, 8, shuffle="global", seed=3)
    local = _steps(root, 4, 8, shuffle="global", seed=3, locality=True)
    assert [len(s) for s in local] == [len(s) for s in plain]  # equal steps on every rank
    for step in range(len(plain[0])):
        assert sorted(k for r in range(4) for k in local[r][step]) == \
            sorted(k for r in range(4) for k in plain[r][step])
    f_plain, f_local = _remote_fraction(root, plain, 2), _remote_fraction(root, local, 2)
    assert 0.35 < f_plain < 0.65  # dealing blind to nodes: about half the reads are remote
    assert f_local < f_plain / 2


def test_locality_resumes_exactly(make_dataset, monkeypatch):
    root = make_dataset(200, shard_samples=20)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    check_save_restore(lambda: Loader(ShardDataset(root, rank=3, world_size=4, locality=True), 4), [1, 6])


def test_locality_needs_global_order(make_dataset):
    root = make_dataset(20, shard_samples=10)
    with pytest.raises(ValueError, match="shuffle='global'"):
        ShardDataset(root, shuffle="block", locality=True)
