"""`shardfeed train` leaves nothing in /dev/shm, however it ends, and says where to resume.

Regression: after SIGINT, SIGTERM or a rank's error the trainer's ranks left
their loader's batch slots in /dev/shm (4 x 1 MiB a run: batches larger than a
slot's first segment), and the stop message said "resume from the last
--checkpoint" without naming it or its step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from shardfeed.formats import ShardWriter
from shardfeed.loader import shm
from shardfeed.tools.train.synth import image_samples

EXE = str(Path(sys.executable).with_name("shardfeed"))
pytestmark = [pytest.mark.slow, pytest.mark.distributed,
              pytest.mark.skipif(shm.shm_dir() != "/dev/shm", reason="no /dev/shm on this system")]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """64 px images: a batch of 48 (576 KiB decoded plus its encoded bytes) outgrows a slot's first 1 MiB segment."""
    root = tmp_path_factory.mktemp("shm") / "train"
    with ShardWriter(str(root), max_shard_samples=100) as w:
        for s in image_samples(400, 4, 64, seed=0):
            w.write(s)
    return str(root)


def _segments_of(pids) -> list[str]:
    return [f for f in os.listdir("/dev/shm") if any(f.startswith(f"shardfeed-{p}-") for p in pids)]


def _run(data, tmp_path, *extra, stop=None):
    """Train until rank 0 logged step 4, then ``stop(proc)``; (return code, stderr, pids of every process)."""
    ck = str(tmp_path / "ck.pt")
    proc = subprocess.Popen([EXE, "train", data, "--ranks", "2", "--epochs", "50", "--batch-size", "48",
                             "--workers", "1", "--log-every", "1", "--plot", "none", "--checkpoint", ck,
                             "--checkpoint-every", "2", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    out: list[str] = []
    err: list[str] = []
    for stream, lines in ((proc.stdout, out), (proc.stderr, err)):
        threading.Thread(target=lambda s=stream, ls=lines: ls.extend(s), daemon=True).start()
    pids = {proc.pid}
    deadline = time.time() + 180
    try:
        while proc.poll() is None and time.time() < deadline:
            try:
                pids |= {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
            except psutil.NoSuchProcess:
                pass
            if stop is not None and any(line.startswith("step 4 ") for line in out):
                stop(proc)
                break
            time.sleep(0.1)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    time.sleep(1.5)  # the last lines; a worker notices its rank is gone within a second
    return rc, "".join(err), pids, ck


@pytest.mark.parametrize("how", ["SIGINT to the group (Ctrl-C)", "SIGTERM to the launcher"])
def test_a_stopped_run_leaves_no_segment_and_names_its_checkpoint(data, tmp_path, how):
    sig = signal.SIGINT if how.startswith("SIGINT") else signal.SIGTERM
    stop = (lambda p: os.killpg(p.pid, sig)) if sig == signal.SIGINT else (lambda p: os.kill(p.pid, sig))
    rc, err, pids, ck = _run(data, tmp_path, stop=stop)
    assert rc == 128 + sig, err
    assert _segments_of(pids) == []
    with open(ck + ".json") as f:
        step = json.load(f)["step"]
    assert f"The last checkpoint is {ck} (step {step}, epoch 0)" in err, err
    assert f"--resume --checkpoint {ck}" in err and "Traceback" not in err, err


def test_a_rank_error_leaves_no_segment(data, tmp_path):
    rc, err, pids, _ = _run(data, tmp_path, "--classes", "2")  # label 3 is out of bounds: the ranks raise
    assert rc == 1, err
    assert "rank 0 raised the exception above" in err or "rank 1 raised the exception above" in err, err
    assert "Terminating process" not in err, err  # torch's own line per stopped rank: the one above says it
    assert _segments_of(pids) == []
