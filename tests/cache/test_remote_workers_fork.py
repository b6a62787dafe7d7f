"""A script that reads a local path with workers keeps working on an http:// URL.

Regression: URL sources switched the workers to spawn, so a script without
``if __name__ == "__main__":`` (fine with a local path) failed at
num_workers>0 with "WorkerError: loader worker 0 ... exited with code 1".
Workers now fork for remote sources too; each makes its own fsspec
filesystem after the fork. Where spawn is asked for, the error names the fix.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from cache_servers import RangeServer
from conftest import labelled_sample
from shardfeed.formats import ShardWriter

SCRIPT = textwrap.dedent("""\
    import json, sys
    from shardfeed.loader import Loader, ShardDataset

    ds = ShardDataset(sys.argv[1], shuffle="global", seed=1, cache_dir=sys.argv[2])
    loader = Loader(ds, 16, num_workers=2, **json.loads(sys.argv[3]))
    keys = [k for batch in loader for k in batch["__key__"]]
    print(json.dumps({"keys": keys, "workers": len(loader.worker_pids())}))
    """)


@pytest.fixture
def served(tmp_path):
    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=25) as w:
        for i in range(200):
            w.write(labelled_sample(i))
    script = tmp_path / "read_remote.py"  # no __main__ guard, as many first scripts are
    script.write_text(SCRIPT)
    with RangeServer(root) as srv:
        yield srv, script, tmp_path


def _run(script, url, cache_dir, **loader_kwargs):
    return subprocess.run([sys.executable, str(script), url, str(cache_dir), json.dumps(loader_kwargs)],
                          capture_output=True, text=True, timeout=180)


def test_script_without_main_guard_reads_an_http_dataset_with_two_workers(served):
    srv, script, tmp = served
    out = _run(script, srv.url, tmp / "cache")
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout)
    assert got["workers"] == 2
    assert sorted(got["keys"]) == [f"{i:08d}" for i in range(200)]


def test_spawn_without_main_guard_names_the_fix(served):
    srv, script, tmp = served
    out = _run(script, srv.url, tmp / "cache", multiprocessing_context="spawn")
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "WorkerError" in last and 'if __name__ == "__main__":' in last and str(script) in last, last
