"""A script that reads a remote dataset through a Loader and exits without closing it
leaves no traceback on stderr: the prefetch thread meets a thread pool already shut
down by the interpreter's exit (it used to print ``Exception in thread
shardfeed-clairvoyant-plan ... cannot schedule new futures after shutdown``), and a
Loader generator closed that late needs no import."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cache_servers import RangeServer
from conftest import labelled_sample
from shardfeed.formats import ShardWriter, open_index

SCRIPT = """
import sys
from shardfeed.loader import Loader, ShardDataset
url, cache, limit, shuffle, workers = sys.argv[1:6]
ds = ShardDataset(url, shuffle=shuffle, seed=1, cache_dir=cache, cache_limit_bytes=int(limit))
it = iter(Loader(ds, 10, num_workers=int(workers)))
for _ in range(3):
    next(it)
print("read", flush=True)
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("exit") / "ds")
    with ShardWriter(root, max_shard_samples=20) as w:
        for i in range(400):
            w.write(labelled_sample(i, 8192))
    return root


@pytest.mark.slow  # a fresh interpreter each (4-9 s on a loaded machine): the exit is what is tested
@pytest.mark.timeout(120)
@pytest.mark.parametrize("shuffle,workers", [("global", 0), ("none", 0), ("global", 2)])
def test_exit_after_an_http_read_prints_no_traceback(tmp_path, folder, shuffle, workers):
    limit = open_index(folder).num_bytes // 2
    with RangeServer(folder) as srv:
        got = subprocess.run([sys.executable, "-c", SCRIPT, srv.url, str(tmp_path / "c"), str(limit), shuffle,
                              str(workers)], capture_output=True, text=True, timeout=100,
                             env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert got.returncode == 0 and got.stdout.strip() == "read", got.stderr
    assert "Traceback" not in got.stderr and "Exception" not in got.stderr, got.stderr
