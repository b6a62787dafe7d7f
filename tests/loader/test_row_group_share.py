"""A loader's workers decode each Parquet row group once between them
(formats/engine/row_group_share.py) and deliver exactly the batches of one
process, across a resume; a lock holder that goes away, a damaged or stale
file and a dead parent's folder cost a decode, never a wrong batch or a hang."""

from __future__ import annotations

import glob
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import pyarrow as pa
import pytest

from conftest import labelled_sample
from shardfeed.formats import ShardWriter, open_index
from shardfeed.formats.engine import row_group_share
from shardfeed.formats.writer import _ColumnarShard
from shardfeed.loader import Loader, ShardDataset

ROWS = 12  # rows per group: 240 samples in 20 groups over 3 files


def _parquet(root, n=240):
    old = _ColumnarShard.ROWS_PER_GROUP
    _ColumnarShard.ROWS_PER_GROUP = ROWS
    try:
        with ShardWriter(root, format="parquet", max_shard_samples=96) as w:
            for i in range(n):
                w.write(labelled_sample(i))
    finally:
        _ColumnarShard.ROWS_PER_GROUP = old
    return root


def _collate_with_counts(samples):
    share = row_group_share.active()
    counts = (os.getpid(), share.published, share.mapped) if share is not None else (os.getpid(), -1, -1)
    return {"__key__": [s["__key__"] for s in samples], "bin": [s["bin"] for s in samples],
            "cls": [int(s["cls"]) for s in samples], "counts": [counts]}


def _batches(loader, stop=None):
    out = []
    for b in loader:
        out.append((list(b["__key__"]), list(b["bin"]), [int(c) for c in b["cls"]]))
        if stop is not None and len(out) == stop:
            break
    return out


def _folder():
    return os.path.join(row_group_share.ROOT, f"{row_group_share.PREFIX}{os.getpid()}")


_HOLD = """
import fcntl, os, sys, time
fds = [os.open(p, os.O_RDWR | os.O_CREAT, 0o600) for p in sys.argv[1:]]
for fd in fds:
    fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(1.0)
"""

needs_shm = pytest.mark.skipif(not os.path.isdir(row_group_share.ROOT), reason="no /dev/shm on this system")


@needs_shm
def test_two_workers_decode_each_group_once_and_deliver_one_process_batches(tmp_path):
    root = _parquet(str(tmp_path / "pq"))
    groups = sum(-(-c // ROWS) for c in open_index(root).counts.tolist())
    with Loader(ShardDataset(root, shuffle="global", seed=4), 16) as one:
        want = [_batches(one), _batches(one)]  # two epochs
    counts = {}
    with Loader(ShardDataset(root, shuffle="global", seed=4), 16, num_workers=2,
                collate_fn=_collate_with_counts) as two:
        got = []
        for _ in range(2):
            epoch = []
            for b in two:
                epoch.append((b["__key__"], b["bin"], b["cls"]))
                pid, published, mapped = b["counts"][0]
                counts[pid] = (published, mapped)
            got.append(epoch)
            if not glob.glob(os.path.join(_folder(), "*.arrow")):
                raise AssertionError("no group was shared through the folder")
    assert got == want
    assert len(counts) == 2 and all(p >= 0 for p, _ in counts.values()), counts
    assert sum(p for p, _ in counts.values()) == groups  # each group decoded by one worker only
    assert all(m > 0 for _, m in counts.values())  # and each worker read some its sibling decoded
    assert not glob.glob(os.path.join(_folder(), "*.arrow"))  # the workers unlinked theirs as they left


@needs_shm
def test_resume_at_two_workers_gives_the_rest_of_one_process_pass(tmp_path):
    root = _parquet(str(tmp_path / "pq"))
    with Loader(ShardDataset(root, shuffle="global", seed=9), 16) as one:
        want = _batches(one)
    with Loader(ShardDataset(root, shuffle="global", seed=9), 16, num_workers=2) as two:
        head = _batches(two, stop=5)
        state = two.state_dict()
    with Loader(ShardDataset(root, shuffle="global", seed=9), 16, num_workers=2) as again:
        again.load_state_dict(state)
        tail = _batches(again)
    assert head + tail == want


@needs_shm
def test_a_lock_let_go_without_a_file_costs_a_decode_not_a_wrong_batch(tmp_path):
    """What a worker killed while decoding leaves: its lock released, nothing published."""
    root = _parquet(str(tmp_path / "pq"))
    with Loader(ShardDataset(root, shuffle="global", seed=2), 16) as one:
        want = _batches(one)
    os.makedirs(_folder(), mode=0o700, exist_ok=True)
    idx = open_index(root)
    locks = [os.path.join(_folder(), row_group_share.GroupShare.name(idx.path(s), g) + ".lock")
             for s in range(len(idx)) for g in range(2)]
    # another process holds them (a lock of ours would travel into the forked workers) and exits
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, *locks], stdout=subprocess.PIPE)
    assert holder.stdout.readline() == b"held\n"
    t0 = time.monotonic()
    with Loader(ShardDataset(root, shuffle="global", seed=2), 16, num_workers=2) as two:
        got = _batches(two)
    assert holder.wait(timeout=30) == 0
    assert got == want
    assert time.monotonic() - t0 < 60


@needs_shm
def test_a_damaged_or_foreign_file_is_decoded_again():
    folder = pathlib.Path(tempfile.mkdtemp(dir=row_group_share.ROOT))  # a tmpfs: publishing checks its free space
    try:
        _damaged_or_foreign(folder)
    finally:
        shutil.rmtree(folder)


def _damaged_or_foreign(folder):
    share = row_group_share.GroupShare(str(folder))
    table = pa.table({"__key__": ["a", "b"], "bin": pa.array([b"x", b"yy"], pa.large_binary())})
    decoded = []

    def decode():
        decoded.append(1)
        return table

    (folder / "g.arrow").write_bytes(b"ARROW1\0\0 not an arrow file")
    got = share.load("g.arrow", decode, wait=True)
    assert decoded == [1] and got.equals(table) and share.published == 1
    again = row_group_share.GroupShare(str(folder)).load("g.arrow", decode, wait=True)
    assert decoded == [1] and again.equals(table)  # the published file, mapped
    os.symlink(str(folder / "g.arrow"), str(folder / "link.arrow"))
    assert row_group_share.GroupShare._map(str(folder / "link.arrow")) is None  # links are not followed
    del got, again
    import gc

    gc.collect()
    assert not (folder / "g.arrow").exists()  # unlinked once its publisher let it go


def test_the_folder_of_a_dead_parent_is_removed(tmp_path):
    root = tmp_path / "shm"
    root.mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    pid = gone.pid
    dead = root / f"{row_group_share.PREFIX}{pid}"
    dead.mkdir()
    (dead / "x.arrow").write_bytes(b"x" * 10)
    alive = root / f"{row_group_share.PREFIX}{os.getpid()}"
    alive.mkdir()
    share = row_group_share.GroupShare.for_workers(str(root))
    assert share is not None and share.folder == str(root / f"{row_group_share.PREFIX}{os.getppid()}")
    assert not dead.exists() and alive.exists() and os.path.isdir(share.folder)


_PUBLISH = """
import fcntl, os, sys, time
import pyarrow as pa
path = sys.argv[1]
fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(1.0)  # the other process finds no file and waits for the lock
table = pa.table({"__key__": ["p", "q"], "bin": pa.array([b"1", b"22"], pa.large_binary())})
with pa.OSFile(path + ".tmp", "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
    w.write_table(table)
os.replace(path + ".tmp", path)
"""


@needs_shm
def test_a_group_published_while_waiting_for_its_lock_is_mapped_not_decoded_again():
    folder = tempfile.mkdtemp(dir=row_group_share.ROOT)
    try:
        path = os.path.join(folder, "g.arrow")
        holder = subprocess.Popen([sys.executable, "-c", _PUBLISH, path], stdout=subprocess.PIPE)
        assert holder.stdout.readline() == b"held\n"
        decoded = []
        got = row_group_share.GroupShare(folder).load("g.arrow", lambda: decoded.append(1), wait=True)
        assert holder.wait(timeout=30) == 0
        assert not decoded and got.column("__key__").to_pylist() == ["p", "q"]
        assert row_group_share.GroupShare(folder).load("g.arrow", lambda: decoded.append(1), wait=False) is not None
    finally:
        shutil.rmtree(folder)
