"""One daemon thread that runs the calls its owner hands it, one at a time.

Three places give a second core part of a read, each with one call in flight
at a time: half of a batch's tar gather (split_gather.py), half of a batch's
missing Parquet row groups (row_group_threads.py) and, at ``num_workers=0``, the
next batch (loader/read_ahead.py). The owner hands a call over, does its own
share, then waits for the outcome before it touches what the call wrote.

Per process: a forked child inherits the object but not the thread, so the
thread is started at the first call in each process.
"""

from __future__ import annotations

import os
import queue
import sys
import threading


class Helper:
    """A thread named ``name`` that runs ``submit``'s calls in order; ``wait`` returns their outcome."""

    def __init__(self, name: str):
        self.name = name
        self._pid = -1
        self._jobs: queue.SimpleQueue | None = None
        self._done: queue.SimpleQueue | None = None
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        """Whether this process has the thread (a call was handed over here, and it is not closed)."""
        return self._pid == os.getpid()

    def submit(self, fn, *args) -> None:
        """Run ``fn(*args)`` on the thread; exactly one ``wait`` must follow."""
        if not self.started:
            self._pid = os.getpid()
            self._jobs, self._done = queue.SimpleQueue(), queue.SimpleQueue()
            self._thread = threading.Thread(target=_serve, args=(self._jobs, self._done), name=self.name, daemon=True)
            self._thread.start()
        self._jobs.put((fn, args))

    def wait(self) -> tuple[bool, object]:
        """(True, the call's result) or (False, the exception it raised), once the call has ended."""
        return self._done.get()

    def close(self, join: bool = False) -> None:
        """End the thread (after the call in flight, if any); ``join``: wait until it has ended."""
        if self.started and self._jobs is not None:
            self._jobs.put(None)
            if join and not sys.is_finalizing():  # a daemon thread may be stopped mid-way then: never joined
                self._thread.join()
        self._pid, self._jobs, self._done, self._thread = -1, None, None, None


def _serve(jobs: queue.SimpleQueue, done: queue.SimpleQueue) -> None:
    while True:
        job = jobs.get()
        if job is None:
            return
        fn, args = job
        try:
            done.put((True, fn(*args)))
        except BaseException as e:  # handed to the owner, which raises it where its own call would have
            done.put((False, e))
