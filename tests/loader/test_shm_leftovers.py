"""No loader segment outlives its loader in /dev/shm, however the process ends.

Regression: the reference trainer left its ranks' batch slots in /dev/shm
(4 x 1 MiB a run) after SIGINT, SIGTERM or a rank's error. A batch larger than
a slot's first 1 MiB segment grew it before the main process ever saw the
first one, whose name nobody unlinked; and a process that exited without
closing its loader had its workers terminated by multiprocessing (SIGTERM)
with their segments in flight. Segments a SIGKILL leaves are removed by the
next loader.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from shardfeed.loader import shm

pytestmark = pytest.mark.skipif(shm.shm_dir() != "/dev/shm", reason="no /dev/shm on this system")


def _segments(prefix: str) -> list[str]:
    return sorted(f for f in os.listdir(shm.shm_dir()) if f.startswith(prefix))


def test_a_slot_outgrown_before_the_main_process_saw_it_is_unlinked():
    prefix = shm.new_prefix()
    writer = shm.SlotWriter(prefix, 0, 1)
    try:
        writer.alloc(0)(100)  # the slot's first segment, 1 MiB
        header = writer.pack(0, {"images": np.ones((2, 1024, 1024), np.uint8)})  # 2 MiB of columns more: grows
        assert _segments(prefix) == [header["seg"]], "the outgrown first segment is still in /dev/shm"
    finally:
        writer.close()
    assert _segments(prefix) == []


WAIT_WITH_BATCHES_IN_FLIGHT = """
import time
from shardfeed.loader import Loader, ShardDataset
loader = Loader(ShardDataset({root!r}, shuffle="none"), 4, num_workers=2)
it = iter(loader)
next(it)
time.sleep(0.5)  # the workers make the next batches into fresh segments the main process has not mapped
print(loader._pool.prefix, flush=True)
time.sleep(60)
"""


def test_sigterm_to_the_process_group_leaves_no_segment(make_dataset):
    """A job scheduler stops a job with SIGTERM to all its processes: the workers too."""
    root = make_dataset(200, shard_samples=25)
    proc = subprocess.Popen([sys.executable, "-c", WAIT_WITH_BATCHES_IN_FLIGHT.format(root=root)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        prefix = proc.stdout.readline().strip()
        assert prefix.startswith("shardfeed-"), proc.stderr.read()[-2000:]
        assert _segments(prefix), "the workers made no segment yet: the test checks nothing"
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        deadline = time.time() + 5  # a worker unlinks on its way out
        while _segments(prefix) and time.time() < deadline:
            time.sleep(0.1)
        assert _segments(prefix) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_segments_of_a_killed_loader_are_removed_by_the_next_one(make_dataset):
    from shardfeed.loader import Loader, ShardDataset

    data = make_dataset(8, shard_samples=4)
    root = shm.shm_dir()
    dead, live = f"shardfeed-{_dead_pid()}-0badc0de", f"shardfeed-{os.getppid()}-0badc0de"
    fresh = f"shardfeed-{_dead_pid()}-0fedcba9"
    paths = [os.path.join(root, f"{p}-w0-s0-g1") for p in (dead, live, fresh)]
    try:
        for path in paths:
            with open(path, "wb") as f:
                f.write(b"x")
        old = time.time() - 2 * shm.STALE_S
        for path in paths[:2]:
            os.utime(path, (old, old))
        with Loader(ShardDataset(data), 4, num_workers=1) as loader:
            assert len(list(loader)) == 2
        assert not os.path.exists(paths[0]), "a dead loader's old segment was kept"
        assert os.path.exists(paths[1]), "a live process's segment was removed"
        assert os.path.exists(paths[2]), "a segment younger than STALE_S was removed (its loader may map it yet)"
    finally:
        for path in paths:
            if os.path.exists(path):
                os.unlink(path)
