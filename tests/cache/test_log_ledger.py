"""A mirrored commit log's charge is a running total (cache/budget.py's ledger): mirroring an
entry does not list the log's folder, so a long uncompacted log opens in time linear in its
entries; the total stays what the folder holds with two processes mirroring the same log into
one cache folder at once, and a mirror opening counts the folder afresh; a dataset with no log
holds no ledger."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest
from test_log_open import _long_log

from cache_servers import RangeServer
from shardfeed.cache import ShardCache
from shardfeed.cache.remote.remote_index import LOG_FETCHES, mirror_folder
from shardfeed.cache.storage.disk_blocks import temp_bytes
from shardfeed.cache.storage.ledger import LEDGER
from shardfeed.formats.commit_log import LOG_DIR
from shardfeed.loader import ShardDataset

LIMIT = 64 << 20


def _listed(folder: str) -> int:
    """What the budget charges the files of ``folder``, counted from a listing."""
    total = 0
    for e in os.scandir(folder):
        st = e.stat(follow_symlinks=False)
        total += temp_bytes(e.name, st.st_size, st.st_blocks, 4096)
    return total


def _ledger(folder: str) -> int:
    with open(folder + LEDGER) as f:
        return int(f.read().split()[0])


def _open(url: str, cache_dir: str, follow: bool) -> int:
    kw = dict(follow=True, poll_s=0.02, idle_timeout_s=0.5) if follow else {}
    return len(ShardDataset(url, cache_dir=cache_dir, cache_limit_bytes=LIMIT, seed=0, **kw).index)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("follow", [False, True])
def test_mirroring_a_log_entry_lists_no_log_folder(tmp_path, monkeypatch, follow):
    commits = 150
    _long_log(str(tmp_path / "ds"), commits)
    listed = []
    scandir = os.scandir

    def counting(path="."):
        if str(path).rstrip("/").endswith(LOG_DIR):
            listed.append(str(path))
        return scandir(path)

    with RangeServer(str(tmp_path)) as srv:
        monkeypatch.setattr(os, "scandir", counting)
        assert _open(f"{srv.url}/ds", str(tmp_path / "c"), follow) == commits
        monkeypatch.setattr(os, "scandir", scandir)
        log = os.path.join(mirror_folder(f"{srv.url}/ds", ShardCache(str(tmp_path / "c"), LIMIT)), LOG_DIR)
    # listing the log's folder at each entry's budget scan (twice) made an open O(entries^2); now only
    # the scans before its first entry (LOG_FETCHES fetched at once) and the mirror's own look list it
    assert len(listed) < 3 * LOG_FETCHES < commits, len(listed)
    assert len(os.listdir(log)) == commits and _ledger(log) == _listed(log) >= commits * 4096


def _mirror(url, cache_dir, follow, barrier, out):
    barrier.wait()
    out.put(_open(url, cache_dir, follow))


@pytest.mark.timeout(60)
def test_two_processes_mirroring_one_log_keep_its_total(tmp_path):
    commits = 120
    _long_log(str(tmp_path / "ds"), commits)
    cache_dir = str(tmp_path / "c")
    with RangeServer(str(tmp_path)) as srv:
        srv.latency_s = 0.002  # their entries' fetches and renames interleave
        ctx = mp.get_context("fork")
        barrier, out = ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_mirror, args=(f"{srv.url}/ds", cache_dir, follow, barrier, out))
                 for follow in (False, True)]
        for p in procs:
            p.start()
        got = [out.get(timeout=50) for _ in procs]
        for p in procs:
            p.join(timeout=10)
        assert got == [commits, commits]
        cache = ShardCache(cache_dir, LIMIT)
        log = os.path.join(mirror_folder(f"{srv.url}/ds", cache), LOG_DIR)
        assert _ledger(log) == _listed(log)
        # a ledger that went wrong (a file changed without the budget) is counted afresh at the next open
        with open(log + LEDGER, "w") as f:
            f.write("7 7\n")  # the figure twice, as the ledger writes it (two figures apart: being written)
        before = cache.budget.fixed_bytes(plans=False)
        assert _open(f"{srv.url}/ds", cache_dir, False) == commits
        assert _ledger(log) == _listed(log) and cache.budget.fixed_bytes(plans=False) > before


def test_a_dataset_without_a_log_holds_no_ledger(tmp_path):
    from conftest import labelled_sample
    from shardfeed.formats import ShardWriter

    with ShardWriter(str(tmp_path / "ds"), max_shard_samples=4) as w:
        for i in range(8):
            w.write(labelled_sample(i))
    with RangeServer(str(tmp_path)) as srv:
        assert _open(f"{srv.url}/ds", str(tmp_path / "c"), False) == 2
        log = os.path.join(mirror_folder(f"{srv.url}/ds", ShardCache(str(tmp_path / "c"), LIMIT)), LOG_DIR)
    assert os.listdir(log) == [] and not os.path.exists(log + LEDGER)  # a block the budget would charge
