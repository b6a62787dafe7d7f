"""`shardfeed train --ranks N`: the ranks (and their loader workers) end with the launcher.

Regression: killing the launcher's pid (SIGKILL, or SIGTERM, as a job
scheduler does) left both ranks training as orphans.
"""

from __future__ import annotations

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
from shardfeed.tools.train.synth import image_samples

EXE = str(Path(sys.executable).with_name("shardfeed"))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("launcher") / "train"
    with ShardWriter(str(root), max_shard_samples=500) as w:
        for s in image_samples(2000, 4, 16, seed=0):
            w.write(s)
    return str(root)


def _start_training(data):
    """A long 2-rank run, once rank 0 logged its first step: (launcher, every process under it, output)."""
    proc = subprocess.Popen([EXE, "train", data, "--ranks", "2", "--epochs", "50", "--batch-size", "8",
                             "--log-every", "1", "--plot", "none"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: list[str] = []
    err: list[str] = []
    for stream, lines in ((proc.stdout, out), (proc.stderr, err)):
        threading.Thread(target=lambda s=stream, ls=lines: ls.extend(s), daemon=True).start()
    deadline = time.time() + 180
    while not any(line.startswith("step ") for line in out):
        assert proc.poll() is None, f"train ended early: {''.join(err)[-2000:]}"
        assert time.time() < deadline, "train never logged a step"
        time.sleep(0.2)
    tree = psutil.Process(proc.pid).children(recursive=True)
    ranks = [p for p in tree if p.ppid() == proc.pid and "spawn" in " ".join(p.cmdline())]
    assert len(ranks) == 2, [p.cmdline() for p in tree]
    assert len(tree) >= 4, "expected 2 ranks with a loader worker each"  # --workers 1
    return proc, tree, err


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _assert_all_end(tree, within_s: float) -> None:
    deadline = time.time() + within_s
    while time.time() < deadline and any(_alive(p) for p in tree):
        time.sleep(0.2)
    left = [(p.pid, " ".join(p.cmdline())[:80]) for p in tree if _alive(p)]
    for p in tree:  # never leave them behind, even when the test fails
        if _alive(p):
            p.kill()
    assert not left, f"still running {within_s}s after the launcher was stopped: {left}"


@pytest.mark.slow
@pytest.mark.distributed
def test_sigkill_of_the_launcher_ends_its_ranks(data):
    proc, tree, _ = _start_training(data)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    _assert_all_end(tree, within_s=10)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_sigint_to_the_launcher_stops_ranks_and_waits_for_them(data, sig):
    proc, tree, err = _start_training(data)
    os.kill(proc.pid, sig)
    rc = proc.wait(timeout=60)
    # the launcher waited: no rank (nor loader worker of a rank) outlives it
    _assert_all_end(tree, within_s=3)
    assert rc == 128 + sig, "".join(err)
    time.sleep(0.3)  # the reader thread takes the last lines
    text = "".join(err)
    assert f"shardfeed train: stopped by {signal.Signals(sig).name}" in text, text
    assert "Traceback" not in text, text
