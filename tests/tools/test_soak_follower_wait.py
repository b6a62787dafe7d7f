"""`bench soak --http-faults`: the end of a run waits for the remote follower while it delivers.

A follower behind a 30-minute writer drains its backlog after the job has: the
soak must wait for it as long as new keys arrive, and give up (saying how far
it got) only when none arrive for ``idle_s``. Real processes write the keys
file the way the soak's reader does.
"""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest

from shardfeed.tools.bench.soak_http import HttpFaults
from shardfeed.tools.bench.soak_procs import DATA_FS_BYTES, SAMPLE_DISK_BYTES, data_fs_bytes


def _deliver(keys: str, n: int, every_s: float, then_sleep_s: float) -> None:
    for i in range(n):
        with open(keys, "a") as f:
            f.write(f"k{i:05d}\n")
        time.sleep(every_s)
    time.sleep(then_sleep_s)


def _faults(tmp_path, n: int, every_s: float, then_sleep_s: float) -> HttpFaults:
    run = tmp_path / "run"
    run.mkdir()
    faults = HttpFaults(str(tmp_path), str(run))
    faults.reader = mp.get_context("spawn").Process(target=_deliver, args=(faults.keys, n, every_s, then_sleep_s))
    faults.reader.start()
    return faults


def _stop(faults: HttpFaults) -> None:
    if faults.reader.exitcode is None:
        faults.reader.kill()
    faults.reader.join(10)
    faults.server.__exit__(None, None, None)


def test_a_follower_still_delivering_past_the_timeout_is_waited_for(tmp_path):
    # 4 s of steady delivery against a 0.5 s timeout: the old join-and-judge failed here
    faults = _faults(tmp_path, n=20, every_s=0.2, then_sleep_s=0.0)
    try:
        faults.finish(timeout_s=0.5, idle_s=1.5)
        assert faults.reader.exitcode == 0
        assert faults._delivered() == 20
    finally:
        _stop(faults)


def test_a_follower_that_stops_delivering_is_given_up_with_its_count(tmp_path):
    faults = _faults(tmp_path, n=3, every_s=0.05, then_sleep_s=60.0)
    try:
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match=r"3 keys delivered, none new in 1\.5 s"):
            faults.finish(timeout_s=0.5, idle_s=1.5)
        assert time.monotonic() - t0 < 30  # given up after the idle window, not after the reader's sleep
        assert faults.reader.exitcode is None
    finally:
        _stop(faults)


def test_the_data_tmpfs_holds_the_run_twice_over():
    assert data_fs_bytes(1, 10) == DATA_FS_BYTES  # a short run keeps the floor
    thirty_at_100 = data_fs_bytes(30, 100)
    assert thirty_at_100 >= 2 * 30 * 60 * 100 * SAMPLE_DISK_BYTES
    assert thirty_at_100 > 256 * 2**20  # the 30-minute run at 100/s outgrew 256 MiB


def test_server_faults_are_never_stacked_on_one_kind_of_file(tmp_path):
    import urllib.error
    import urllib.request

    (tmp_path / "run").mkdir()
    (tmp_path / "entry.json").write_text("{}")
    faults = HttpFaults(str(tmp_path), str(tmp_path / "run"))
    try:
        assert [faults.inject(k) for k in ("http503", "http500", "reset")] == [".json", ".tar", ".idx"]
        # a reader that has requested nothing yet: every kind of file holds a fault it has not met
        assert faults.inject("stall") is None
        statuses = []
        for _ in range(4):
            try:
                with urllib.request.urlopen(f"{faults.server.url}/entry.json", timeout=10) as r:
                    statuses.append(r.status)
            except urllib.error.HTTPError as e:
                statuses.append(e.code)
        assert statuses == [503, 503, 503, 200]  # the fault as named: 3 answers, then the object
        assert faults.inject("stall") == ".json"  # met: the next fault goes where there is room
    finally:
        faults.server.__exit__(None, None, None)
