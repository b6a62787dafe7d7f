"""Memory held for compressed shards read in stored order does not grow with the number of shards.

A .tar.gz shard is held decompressed while it is read (formats/engine/decoded_budget.py). Read in
stored order, each one used to stay resident until the process-wide budget (2 GiB) was reached:
sixteen 32 MiB shards grew anonymous memory by 743 MiB. A shard is now closed once neither the
read nor the next one needs it, and a plain iteration holds one compressed shard per read, so the
budget bounds memory even when it is smaller than what a block of samples crosses.
Measured two ways: the budget's own accounting (in each reading process, through a transform),
and the unique memory of the process reading at num_workers=0.
"""

from __future__ import annotations

import gzip
import io
import tarfile

import psutil
import pytest
import torch

from shardfeed.formats.engine import decoded_budget
from shardfeed.loader import Loader, ShardDataset

SHARDS, SAMPLES, SAMPLE_BYTES = 16, 64, 64 << 10  # 16 foreign .tar.gz shards of 4 MiB of zeros
SHARD_BYTES = SAMPLES * SAMPLE_BYTES


def _write(root, samples: int) -> str:
    payload = bytes(SAMPLE_BYTES)
    for s in range(SHARDS):
        with gzip.open(root / f"part-{s:03d}.tar.gz", "wb", compresslevel=1) as g, \
                tarfile.open(fileobj=g, mode="w") as t:
            for k in range(samples):
                info = tarfile.TarInfo(f"s{s:03d}_{k:03d}.bin")
                info.size = len(payload)
                t.addfile(info, io.BytesIO(payload))
    return str(root)


@pytest.fixture(scope="module")
def gz_root(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("gz"), SAMPLES)


def _held(sample):
    """The decompressed bytes this process holds as it reads the sample (a transform)."""
    return {"__key__": sample["__key__"], "held": decoded_budget.used()}


def test_plain_iteration_in_stored_order_holds_a_few_shards(gz_root):
    proc = psutil.Process()
    held = grown = n = 0
    for _ in ShardDataset(gz_root, shuffle="none"):
        n += 1
        held = max(held, decoded_budget.used())
        if n == SAMPLES:  # the first shard read: code loaded, buffers made
            base = proc.memory_full_info().uss
        elif n % 32 == 0 and n > SAMPLES:
            grown = max(grown, proc.memory_full_info().uss - base)
    assert n == SHARDS * SAMPLES
    # this read, the next and the two decompressed ahead; all 16 (64 MiB) before the fix
    assert grown < 6 * SHARD_BYTES, f"unique memory grew by {grown >> 20} MiB after the first shard"
    assert held <= 4 * SHARD_BYTES, f"{held / SHARD_BYTES:.1f} shards held decompressed"
    assert decoded_budget.used() == 0


@pytest.mark.parametrize("workers", [0, 2])
def test_torch_dataloader_workers_hold_a_few_shards(gz_root, workers):
    ds = ShardDataset(gz_root, shuffle="none", transform=_held)
    held = [s["held"] for s in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)]
    assert len(held) == SHARDS * SAMPLES
    assert max(held) <= 4 * SHARD_BYTES, f"{max(held) / SHARD_BYTES:.1f} shards held decompressed"


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_workers_hold_a_few_shards(gz_root, workers):
    ds = ShardDataset(gz_root, shuffle="none", transform=_held)
    keys, held = [], []
    with Loader(ds, batch_size=16, num_workers=workers) as ld:
        for b in ld:
            keys += b["__key__"]
            held += b["held"].tolist()
    assert sorted(keys) == [f"s{s:03d}_{k:03d}" for s in range(SHARDS) for k in range(SAMPLES)]
    assert max(held) <= 4 * SHARD_BYTES, f"{max(held) / SHARD_BYTES:.1f} shards held decompressed"


def test_budget_below_a_block_bounds_a_plain_iteration(tmp_path, monkeypatch):
    # 8 samples a shard: one block of a plain iteration (64 samples) crosses 8 shards; with a budget
    # of 2.5 shards it raised "shards in use cannot be closed" (the block's shards were read at once)
    root = _write(tmp_path, 8)
    small = 8 * SAMPLE_BYTES
    monkeypatch.setattr(decoded_budget, "LIMIT", decoded_budget.used() + 2 * small + (small >> 1))
    n = held = 0
    for _ in ShardDataset(root, shuffle="none"):
        n += 1
        held = max(held, decoded_budget.used())
    assert n == SHARDS * 8
    assert held <= decoded_budget.LIMIT
