"""A script's end and a Ctrl-C print nothing of the loader's own.

Regressions: a script that ended with a live 2-worker iterator printed
"Exception ignored in: <generator object Loader._iterate ...> ...
ModuleNotFoundError: import of sys halted" (the generator's cleanup imported
sys while the interpreter was finalizing); on Ctrl-C every loader worker
printed its own KeyboardInterrupt traceback beside the script's (torch's
DataLoader workers stay quiet).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

ENDS_WITH_A_LIVE_ITERATOR = """
from shardfeed.loader import Loader, ShardDataset
loader = Loader(ShardDataset({root!r}), 8, num_workers={workers})
it = iter(loader)
next(it)
print("done", flush=True)
"""


@pytest.mark.parametrize("workers", [2, 0])
def test_a_script_ending_with_a_live_iterator_prints_nothing_else(make_dataset, workers):
    root = make_dataset(200, shard_samples=25)
    out = subprocess.run([sys.executable, "-c", ENDS_WITH_A_LIVE_ITERATOR.format(root=root, workers=workers)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout == "done\n"
    assert out.stderr == ""


INTERRUPTED = """
import time
from shardfeed.loader import Loader, ShardDataset
with Loader(ShardDataset({root!r}), 4, num_workers=2) as loader:
    for i, batch in enumerate(loader):
        if i == 1:
            print("ready", flush=True)
        time.sleep(0.2)
"""


def test_ctrl_c_prints_the_script_traceback_only(make_dataset):
    """Ctrl-C reaches the whole process group: the workers too."""
    root = make_dataset(400, shard_samples=25)
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED.format(root=root)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline() == "ready\n", proc.stderr.read()[-2000:]
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0 and err.rstrip().endswith("KeyboardInterrupt"), err
    assert err.count("Traceback") == 1 and "shardfeed-loader" not in err, err
