"""ShardCache under real faults: separate processes racing for one shard,
churn through a small budget, kill -9 mid-download, a full local disk.

Every child is a fresh interpreter (``python -c``) sharing nothing with the
test but the cache folder and the loopback server, as ranks on a node do.
Retries that run out (a clear ShardError naming the URL) are covered by
test_cache_sources.py::test_persistent_failure_names_url_and_reason.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import xxhash

from cache_servers import Fault, RangeServer
from shardfeed.cache import ShardCache

START_S = 120  # a child imports numpy/pyarrow: slow on a loaded 2-core machine

CHILD = r"""
import json, os, random, sys, time
import xxhash
from shardfeed.cache import FetchOptions, ShardCache
from shardfeed.formats import ShardError

a = json.loads(sys.argv[1])
cache = ShardCache(a["cache_dir"], a["limit"], fetch=FetchOptions(**a["fetch"]), wait_timeout_s=60)
out = {}
if a.get("lookahead"):
    cache.set_lookahead([(u, 0, h) for u, h, _ in a["items"]])  # a plan the dead process leaves behind
if a.get("fsize"):
    import resource
    resource.setrlimit(resource.RLIMIT_FSIZE, (a["fsize"], a["fsize"]))  # after imports: pyc/numba files are written
open(a["ready"], "w").close()
while a.get("go") and not os.path.exists(a["go"]):
    time.sleep(0.002)
rng = random.Random(a.get("seed", 0))
for _ in range(a.get("rounds", 1)):
    items = list(a["items"])
    if a.get("seed") is not None:
        rng.shuffle(items)
    for url, h, size in items:
        try:
            with cache.hold(url, h, size) as path:
                with open(path, "rb") as f:
                    got = xxhash.xxh3_128_hexdigest(f.read())
                out.setdefault("paths", []).append(path)
                if got != h:
                    out.setdefault("wrong", []).append(url)
        except ShardError as e:
            out.setdefault("errors", []).append({"url": e.shard, "reason": e.reason})
out["stats"] = cache.stats()
print(json.dumps(out))
"""

FAST = dict(range_bytes=64 << 10, threads=2, attempts=3, backoff_s=0.01, stall_s=30.0)


def _blob(folder, name: str, size: int, seed: int) -> tuple[str, str, int]:
    data = random.Random(seed).randbytes(size)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)
    return name, xxhash.xxh3_128_hexdigest(data), size


def _child(tmp_path, tag: str, cache_dir: str, limit: int, items, **kw) -> tuple[subprocess.Popen, str]:
    ready = str(tmp_path / f"ready-{tag}")
    args = dict(cache_dir=cache_dir, limit=limit, items=items, fetch=kw.pop("fetch", FAST), ready=ready, **kw)
    proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return proc, ready


def _wait_ready(procs, readies) -> None:
    deadline = time.monotonic() + START_S
    while not all(os.path.exists(r) for r in readies):
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"child exited early ({p.returncode}): {p.stderr.read()}")
        if time.monotonic() > deadline:
            raise TimeoutError("children did not start")
        time.sleep(0.01)


def _result(proc) -> dict:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _run(tmp_path, tag, cache_dir, limit, items, **kw) -> dict:
    return _result(_child(tmp_path, tag, cache_dir, limit, items, **kw)[0])


def test_four_processes_get_one_shard_it_is_downloaded_once(tmp_path):
    """WebDataset's cache has no lock: two workers download the same shard twice."""
    root = tmp_path / "srv"
    root.mkdir()
    name, h, size = _blob(str(root), "big.bin", 1 << 20, seed=1)
    go, cdir = str(tmp_path / "go"), str(tmp_path / "c")
    with RangeServer(str(root)) as srv:
        # the first GET waits a second before its body, so the others ask while it is in flight
        srv.faults.append(Fault("big.bin", "stall", times=1, stall_s=1.0))
        items = [[f"{srv.url}/{name}", h, size]]
        one = dict(FAST, range_bytes=4 << 20)  # one ranged GET per download: requests count downloads
        kids = [_child(tmp_path, str(k), cdir, 4 << 20, items, go=go, fetch=one) for k in range(4)]
        _wait_ready([p for p, _ in kids], [r for _, r in kids])
        open(go, "w").close()
        results = [_result(p) for p, _ in kids]
        assert srv.gets("big.bin") == 1
    assert all("wrong" not in r and "errors" not in r for r in results)
    assert len({r["paths"][0] for r in results}) == 1
    assert sorted(r["stats"]["misses"] for r in results) == [0, 0, 0, 1]
    assert sum(r["stats"]["bytes_fetched"] for r in results) == size
    assert os.listdir(os.path.join(cdir, "data")) == [ShardCache.key_for("", h)]


def test_limit_holds_under_churn_from_two_processes(tmp_path):
    """Many shards through a cache of a few, from two processes in different
    orders: a watcher sampling the disk usage of the whole cache folder
    (every file it holds, each inode once, as du counts) every millisecond
    never sees more than the limit, and every read is the right bytes."""
    src = tmp_path / "src"
    src.mkdir()
    items = [[str(src / n), h, s] for n, h, s in (_blob(str(src), f"s{i}.bin", 20_000 + 997 * i, seed=i)
                                                  for i in range(24))]
    limit = 5 * 45_000
    cdir = str(tmp_path / "c")
    watcher_cache = ShardCache(cdir, limit)
    seen, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            seen.append(_disk_usage(cdir))
            time.sleep(0.001)

    t = threading.Thread(target=watch, daemon=True)
    kids = [_child(tmp_path, str(k), cdir, limit, items, seed=k, rounds=3) for k in range(2)]
    t.start()
    try:
        results = [_result(p) for p, _ in kids]
    finally:
        stop.set()
        t.join()
    assert all("wrong" not in r and "errors" not in r for r in results)
    assert sum(len(r["paths"]) for r in results) == 2 * 3 * 24
    assert sum(r["stats"]["evictions"] for r in results) > 24  # it churned
    assert len(seen) > 10 and max(seen) <= limit
    assert watcher_cache.used_bytes() <= limit
    assert not [n for n in os.listdir(watcher_cache.data_dir) if ".tmp-" in n]


def _disk_usage(folder: str) -> int:
    """Bytes of the files under ``folder`` now, independent of the cache's own accounting."""
    inodes = {}
    for dirpath, _, files in os.walk(folder):
        for n in files:
            try:
                st = os.lstat(os.path.join(dirpath, n))
            except FileNotFoundError:
                continue
            inodes[st.st_ino] = st.st_size
    return sum(inodes.values())


def test_kill_9_mid_download_then_a_new_run_finds_the_cache_consistent(tmp_path):
    """LitData's stale lock files (682), WebDataset's leaked temporaries (84),
    Streaming's stale names after a crash: a fetcher killed with SIGKILL while
    the body is arriving leaves a partial temporary, its lock files and its
    published plan. The next run trusts none of it: no entry is served, it
    does not wait on the dead process's lock, fetches the shard again
    correctly and reclaims the temporary."""
    root = tmp_path / "srv"
    root.mkdir()
    name, h, size = _blob(str(root), "big.bin", 1 << 20, seed=7)
    cdir = str(tmp_path / "c")
    data_dir = os.path.join(cdir, "data")
    with RangeServer(str(root)) as srv:
        url = f"{srv.url}/{name}"
        srv.faults.append(Fault("big.bin", "stall", times=1, stall_s=20.0))  # one range never arrives in time
        proc, ready = _child(tmp_path, "victim", cdir, 4 << 20, [[url, h, size]], lookahead=True)
        _wait_ready([proc], [ready])
        deadline = time.monotonic() + 60
        while srv.gets("big.bin") < 6:  # the stalled range plus several written ones: mid-body
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        proc.stdout.close()
        proc.stderr.close()
        left = os.listdir(data_dir)
        assert len(left) == 1 and ".tmp-" in left[0]  # the dead fetcher's partial temporary
        assert os.listdir(os.path.join(cdir, "lookahead"))  # and its plan
        cache = ShardCache(cdir, 4 << 20)
        assert not cache.contains(url, h)

        r = _run(tmp_path, "next", cdir, 4 << 20, [[url, h, size]])
    assert "wrong" not in r and "errors" not in r
    assert r["stats"]["misses"] == 1 and r["stats"]["wait_s"] == 0.0  # the dead lock is not waited on
    assert os.listdir(data_dir) == [ShardCache.key_for(url, h)]  # the temporary was reclaimed
    assert cache.lookahead.merged() == {}  # the dead owner's plan no longer counts
    assert os.listdir(os.path.join(cdir, "lookahead")) == []
    assert cache.used_bytes() == size + cache.budget.fixed_bytes()  # the budget counts plans too: none is left


def test_full_disk_is_a_clear_error_and_leaves_no_half_written_entry(tmp_path):
    """A file-size limit (ulimit -f) stands in for a full cache disk: the
    shard that does not fit fails at once with a ShardError naming the URL
    and the fix, nothing half-written stays, and a shard that fits still works."""
    src = tmp_path / "src"
    src.mkdir()
    big = _blob(str(src), "big.bin", 512 << 10, seed=3)
    small = _blob(str(src), "small.bin", 16 << 10, seed=4)
    items = [[str(src / n), h, s] for n, h, s in (big, small)]
    cdir = str(tmp_path / "c")
    r = _run(tmp_path, "full", cdir, 8 << 20, items, fsize=128 << 10)
    assert len(r["errors"]) == 1 and "wrong" not in r
    err = r["errors"][0]
    assert err["url"] == str(src / "big.bin")
    assert "cannot reserve 524288 bytes" in err["reason"] and cdir in err["reason"]
    assert "free space there, lower cache_limit_bytes or point cache_dir at a larger disk" in err["reason"]
    assert os.listdir(os.path.join(cdir, "data")) == [ShardCache.key_for("", small[1])]
    assert r["stats"]["bytes_fetched"] == small[2]
