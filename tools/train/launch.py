"""`shardfeed train --ranks N`: start the ranks, and make them end with the launcher.

Ranks are spawned processes (torch.multiprocessing). A rank must never
outlive its launcher: a launcher killed by SIGKILL (an OOM killer, a job
scheduler's hard stop) cannot tell anyone, so each rank asks the kernel to
SIGKILL it when its parent dies (Linux ``PR_SET_PDEATHSIG``) and, for other
systems and for the race before that call, watches ``os.getppid()`` from a
thread. A rank's loader workers watch the rank the same way (loader/workers.py).
The signal is asked for at exec, before the rank imports anything: a rank
is started through a few-line bootstrap (``BOOT``, the spawn executable while
ranks start) that sets it and then execs Python as spawn meant; set only in
the rank's own code, a launcher killed while its ranks still imported torch
(seconds) left them running 5-15 s.

SIGTERM or SIGINT (Ctrl-C) to the launcher is forwarded as SIGTERM to every
rank; the launcher waits for them (SIGKILL to any still alive after
``GRACE_S``, or at a second signal) and exits with 128 + the signal number.
Ranks ignore SIGINT themselves: a Ctrl-C reaches the whole process group,
and the launcher alone decides, so each rank does not print a traceback.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from contextlib import contextmanager

GRACE_S = 10.0  # a stopped job's ranks get this long to exit after SIGTERM before SIGKILL
_WATCH_S = 0.5
_PR_SET_PDEATHSIG = 1


# Run as the spawn executable: ``BOOT_PATH [interpreter flags] -c PROG --multiprocessing-fork``. The
# first line (the interpreter) and the launcher's pid are filled in. Only spawn's children ask for
# the signal (the resource tracker, also started through the executable, outlives its parent by design).
BOOT = """#!{python}
import os, sys
if "--multiprocessing-fork" in sys.argv:
    if sys.platform.startswith("linux"):
        import ctypes, signal
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != {launcher}:  # the launcher died before prctl took effect
        os._exit(1)
os.execv(sys.executable, [sys.executable] + sys.argv[1:])  # the signal survives exec
"""


_BOOTS = sys.platform.startswith("linux") and " " not in sys.executable  # a shebang line takes no spaces


@contextmanager
def spawned_through_boot(folder: str | None):
    """While open, processes spawned start through BOOT, written into ``folder`` (see the module
    docstring); None: as before. The caller removes the folder once every rank has exec'd past it
    (``_booted``): Python opens a script some time after its exec, so it must outlive the block."""
    import multiprocessing.spawn as spawn

    if folder is None:
        yield
        return
    path = os.path.join(folder, "rank-boot")
    with open(path, "w") as f:
        f.write(BOOT.format(python=sys.executable, launcher=os.getpid()))
    os.chmod(path, 0o700)
    old = spawn.get_executable()
    spawn.set_executable(path)
    try:
        yield
    finally:
        spawn.set_executable(old)


def _booted(folder: str, procs) -> bool:
    """Whether every rank has left the bootstrap in ``folder`` (exec'd Python, or ended)."""
    for p in procs:
        try:
            with open(f"/proc/{p.pid}/cmdline", "rb") as f:
                if folder.encode() in f.read():
                    return False
        except OSError:
            pass  # ended
    return True


def die_with_parent(parent: int) -> None:
    """Called first in a rank: exit when process ``parent`` (the launcher) is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # no prctl: the watch thread below still notices
    if os.getppid() != parent:  # the launcher died before prctl took effect
        os._exit(1)
    threading.Thread(target=_watch, args=(parent,), name="shardfeed-train-parent-watch", daemon=True).start()


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(_WATCH_S)
    os.kill(os.getpid(), signal.SIGKILL)


class Stopper:
    """While installed: SIGTERM/SIGINT stop ``procs`` (SIGTERM, then SIGKILL after GRACE_S
    or at a second signal). ``signum`` is the first signal received (None if none)."""

    def __init__(self, procs):
        self.procs = procs
        self.signum: int | None = None
        self.deadline: float | None = None
        self._old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}

    def _on_signal(self, signum, _frame) -> None:
        if self.signum is None:
            self.signum, self.deadline = signum, time.monotonic() + GRACE_S
            self._send(signal.SIGTERM)
        else:
            self._send(signal.SIGKILL)

    def _send(self, sig) -> None:
        for p in self.procs:
            if p.is_alive():
                try:
                    os.kill(p.pid, sig)
                except ProcessLookupError:
                    pass

    def tick(self) -> None:
        """Called while waiting: SIGKILL ranks that outlived the grace period."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            self._send(signal.SIGKILL)

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


def run_ranks(fn, nprocs: int, args: tuple) -> int | None:
    """Run ``fn(rank, *args, launcher_pid)`` in ``nprocs`` spawned ranks until all end.

    Returns None when all ranks exited 0, else the number of the signal that
    stopped the job (SIGTERM/SIGINT to the launcher); a rank that failed
    raises torch.multiprocessing.ProcessExitedException (the others are
    stopped by torch)."""
    import torch.multiprocessing as tmp

    folder = tempfile.mkdtemp(prefix="shardfeed-train-") if _BOOTS else None
    try:
        with spawned_through_boot(folder):
            ctx = tmp.start_processes(fn, args=(*args, os.getpid()), nprocs=nprocs, join=False, start_method="spawn")
    except BaseException:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    stop = Stopper(ctx.processes)
    try:
        while True:
            try:
                if ctx.join(timeout=_WATCH_S):
                    return stop.signum
            except tmp.ProcessExitedException:
                if stop.signum is not None:
                    _wait_all(ctx.processes, stop)
                    return stop.signum
                raise
            stop.tick()
            if folder is not None and _booted(folder, ctx.processes):  # the file is read: not left behind
                shutil.rmtree(folder, ignore_errors=True)
                folder = None
    finally:
        stop.restore()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _wait_all(procs, stop: Stopper) -> None:
    for p in procs:
        while p.is_alive():
            p.join(_WATCH_S)
            stop.tick()
