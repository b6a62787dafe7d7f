"""Faults: corrupt and missing shards under both policies, dead workers,
worker exceptions, and an explicit lifecycle (no orphans, no hangs)."""

from __future__ import annotations

import logging
import os
import signal
import time

import psutil
import pytest

from loader_helpers import keys_of
from shardfeed.formats import ShardError, open_index
from shardfeed.loader import Loader, ShardDataset, WorkerError


def _damage_payload(root, shard=1, sample=3):
    """Flip a byte inside one sample's payload (not a header): only the checksum can tell."""
    from shardfeed.formats import read_sidecar

    idx = open_index(root)
    path = idx.path(shard)
    table, _ = read_sidecar(path + ".idx", path)
    j = int(table.member_start[sample + 1]) - 1  # the sample's last member
    off = int(table.offset[j])
    with open(path, "r+b") as f:
        f.seek(off)
        c = f.read(1)
        f.seek(off)
        f.write(bytes([c[0] ^ 0xFF]))
    return path, table.keys[sample]


def _live_children():
    return {p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


_BEFORE: set = set()


@pytest.fixture(autouse=True)
def _baseline_children():
    # Other tests in the session may leave long-lived helpers of their own
    # (multiprocessing's resource tracker after a spawn pool): only processes
    # born during this test count as the loader's orphans.
    global _BEFORE
    _BEFORE = _live_children()
    yield


def _children():
    return sorted((p for p in _live_children() - _BEFORE), key=lambda p: p.pid)


@pytest.mark.parametrize("workers", [0, 2])
def test_damaged_payload_raises_shard_error_naming_the_shard(make_dataset, workers):
    root = make_dataset(80, shard_samples=20)
    path, key = _damage_payload(root)
    with Loader(ShardDataset(root), 8, num_workers=workers) as loader:
        with pytest.raises(ShardError) as e:
            list(loader)
    assert e.value.shard == path and key in e.value.reason and "checksum" in e.value.reason
    assert _children() == []


@pytest.mark.parametrize("workers", [0, 2])
def test_damaged_payload_is_skipped_counted_and_logged_once(make_dataset, workers, caplog):
    root = make_dataset(80, shard_samples=20)
    path, key = _damage_payload(root, sample=3)
    _damage_payload(root, sample=7)
    with caplog.at_level(logging.WARNING, logger="shardfeed.loader"):
        with Loader(ShardDataset(root, on_error="skip"), 8, num_workers=workers) as loader:
            keys = keys_of(loader)
            st = loader.stats()
    assert key not in keys and len(keys) == 78 and len(set(keys)) == 78
    assert st["errors_skipped"] == 2
    assert sum(path in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("workers", [0, 1])
def test_missing_and_truncated_shards_under_both_policies(make_dataset, workers):
    root = make_dataset(80, shard_samples=20)
    idx = open_index(root)
    os.remove(idx.path(0))
    with open(idx.path(2), "r+b") as f:
        f.truncate(1000)
    with Loader(ShardDataset(root), 8, num_workers=workers) as loader:
        with pytest.raises(ShardError) as e:
            list(loader)
    assert e.value.shard in (idx.path(0), idx.path(2))
    with Loader(ShardDataset(root, on_error="skip"), 8, num_workers=workers) as loader:
        keys = keys_of(loader)
        st = loader.stats()
        steps = len(loader)
    assert sorted(keys) == [f"{i:08d}" for i in list(range(20, 40)) + list(range(60, 80))]
    assert st["errors_skipped"] == 40 and st["batches"] == steps  # steps stay equal: DDP never hangs


def test_a_killed_worker_raises_within_seconds_and_leaves_no_orphans(make_dataset):
    root = make_dataset(400, shard_samples=50)
    loader = Loader(ShardDataset(root), 4, num_workers=2, prefetch=1)
    it = iter(loader)
    next(it)
    pids = loader.worker_pids()
    assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
    os.kill(pids[1], signal.SIGKILL)
    t = time.monotonic()
    with pytest.raises(WorkerError, match=r"killed by signal 9"):
        for _ in it:
            pass
    assert time.monotonic() - t < 5
    deadline = time.monotonic() + 5
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
        assert time.monotonic() < deadline, "worker processes outlived the error"
        time.sleep(0.05)
    assert _children() == []
    loader.close()
    loader.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        iter(loader)


def test_a_worker_exception_travels_with_its_traceback(make_dataset):
    root = make_dataset(40, shard_samples=20)

    def transform(sample):
        if sample["__key__"] == "00000013":
            raise KeyError("boom in user code")
        return sample

    with Loader(ShardDataset(root, transform=transform, shuffle="none"), 4, num_workers=2) as loader:
        with pytest.raises(WorkerError, match="boom in user code") as e:
            list(loader)
    assert "transform" in str(e.value) and "worker traceback" in str(e.value)
    assert _children() == []


def test_abandoned_iteration_then_new_one_and_close_frees_shared_memory(make_dataset):
    root = make_dataset(100, shard_samples=25)
    loader = Loader(ShardDataset(root), 8, num_workers=2)
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    prefix = loader._pool.prefix
    again = keys_of(loader)  # a new iteration resumes after the 3 consumed batches
    assert len(again) == 100 - 24 and not set(again) & set(keys_of(first))
    loader.close()
    assert [f for f in os.listdir("/dev/shm") if f.startswith(prefix)] == []
    assert _children() == []
