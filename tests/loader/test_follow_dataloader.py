"""A followed ShardDataset iterated directly, as the IterableDataset DESIGN says it is.

Regression: ``ShardDataset(follow=True)`` is a torch IterableDataset, but
iterating it (alone or in a plain torch DataLoader) raised TypeError ("a
followed dataset has no fixed plan"). Streaming holds for it too: every
published sample once across DataLoader workers and ranks, until the end commit.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from shardfeed.formats import ShardWriter
from shardfeed.loader import ShardDataset

KEYS = [f"k{i:03d}" for i in range(30)]


def _keys(batch):
    return [s["__key__"] for s in batch]


@pytest.fixture
def ended(tmp_path):
    root = str(tmp_path / "s")
    w = ShardWriter(root, append=True, max_shard_samples=7)
    for k in KEYS:
        w.write({"__key__": k, "cls": 1})
    w.end_stream()
    return root


@pytest.mark.parametrize("workers", [0, 2])
def test_a_plain_dataloader_delivers_every_published_sample_once(ended, workers):
    ds = ShardDataset(ended, follow=True, idle_timeout_s=30)
    dl = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=workers, collate_fn=_keys)
    got = [k for b in dl for k in b]
    assert sorted(got) == KEYS


def test_two_ranks_share_the_stream_without_overlap(ended):
    shares = [[s["__key__"] for s in ShardDataset(ended, follow=True, rank=r, world_size=2, idle_timeout_s=30)]
              for r in (0, 1)]
    assert sorted(shares[0] + shares[1]) == KEYS and shares[0] and shares[1]


def test_iteration_waits_for_commits_until_the_end(tmp_path):
    root = str(tmp_path / "s")
    w = ShardWriter(root, append=True, max_shard_samples=5)

    def write():
        for k in KEYS:
            w.write({"__key__": k, "cls": 1})
            time.sleep(0.01)
        w.end_stream()

    w.write({"__key__": "first", "cls": 1})
    t = threading.Thread(target=write)
    t.start()
    got = [s["__key__"] for s in ShardDataset(root, follow=True, idle_timeout_s=30, poll_s=0.02)]
    t.join()
    assert sorted(got) == sorted(["first", *KEYS])
