"""`shardfeed train --ranks N`: ranks die with a launcher killed while they are still starting.

Regression: a rank asked for PR_SET_PDEATHSIG in its own code, after its imports (torch: seconds);
a launcher SIGKILLed about 7 s after start left its ranks running 5-15 s more. The signal is now
asked for at exec, by the bootstrap the ranks are spawned through (tools/train/launch.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from shardfeed.formats import ShardWriter
from shardfeed.tools.train.synth import image_samples

EXE = str(Path(sys.executable).with_name("shardfeed"))


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.distributed
def test_ranks_die_at_once_with_a_launcher_killed_during_their_start(tmp_path):
    root = str(tmp_path / "train")
    with ShardWriter(root, max_shard_samples=50) as w:
        for s in image_samples(100, 4, 16, seed=0):
            w.write(s)
    proc = subprocess.Popen([EXE, "train", root, "--ranks", "2", "--epochs", "1", "--plot", "none"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ranks: list[psutil.Process] = []
    boots: set[str] = set()
    try:
        deadline = time.time() + 120
        launcher = psutil.Process(proc.pid)
        while len(ranks) < 2:  # spawned: their command line is spawn's; their imports have not finished
            assert proc.poll() is None and time.time() < deadline, "the launcher never started its ranks"
            ranks = [p for p in launcher.children() if "spawn_main" in " ".join(p.cmdline())]
            time.sleep(0.02)
        boots = {os.path.dirname(a) for p in ranks for a in p.cmdline() if "shardfeed-train-" in a}
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.time()
        proc.wait(timeout=10)
        while any(_alive(p) for p in ranks) and time.time() < killed + 2:
            time.sleep(0.05)
        left = [p.pid for p in ranks if _alive(p)]
        assert not left, f"ranks {left} outlived their launcher by 2 s"
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in ranks:
            if _alive(p):
                p.kill()
        for folder in boots:  # the launcher, killed, could not remove its bootstrap
            shutil.rmtree(folder, ignore_errors=True)
