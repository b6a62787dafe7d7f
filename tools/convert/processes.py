"""``convert --processes N``: one spawned worker process per call, results in order.

Not multiprocessing.Pool: Pool.terminate() joins the thread that feeds tasks
to the workers, and that thread can be blocked for good writing a big task
(the source, pickled) into the pipe of a worker already stopped. A SIGTERM
landing then hung `convert` (seen under load: the parent alive an hour
after the signal). Here each worker gets its call in its spawn data,
written by start() on the calling thread, so stopping is terminate and
join, and nothing waits on a pipe nobody reads.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import signal
import time
import traceback

from shardfeed.formats.staging import SignalsHeld

_RESULT_GRACE_S = 5.0


def die_with_parent() -> None:
    """A worker outliving a parent killed outright would go on writing into the
    stage that the rerun resumes; on Linux the kernel ends it with the parent."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return  # not Linux: a killed run's workers finish their part, then exit
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def _worker(fn, args, i: int, events, results) -> None:
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    try:
        out = (i, True, fn(*args, events.put))
    except BaseException as e:  # noqa: BLE001 - handed to the parent, which raises it
        out = (i, False, e)
    try:
        pickle.dumps(out)  # the queue pickles on its own thread, where a failure would only be printed
    except Exception:  # noqa: BLE001 - an error or a result that does not pickle: its text does
        text = "".join(traceback.format_exception(out[2])) if not out[1] else "its result does not pickle"
        out = (i, False, RuntimeError(f"convert worker {i} failed:\n{text}"))
    results.put(out)
    results.close()
    results.join_thread()  # sent before this process ends: the parent reads it after our exit


def run_each(fn, calls: list[tuple], progress) -> list:
    """``fn(*args, emit)`` for each of ``calls`` in a worker process of its own, where
    ``emit(event)`` reaches ``progress`` here; their results in order. A worker's error
    is raised here; an interrupt here stops them all (none is left half-started)."""
    # spawn, not fork: the parent may hold Arrow/numba thread pools, which fork does not copy safely
    ctx = mp.get_context("spawn")
    events, results = ctx.Queue(), ctx.Queue()
    procs = []
    # a stop while the workers start would leave one half-started, printing a traceback after the
    # parent's "stopped" line: it is delivered once they are all up, and stops them
    with SignalsHeld() as held:
        for i, args in enumerate(calls):
            p = ctx.Process(target=_worker, args=(fn, args, i, events, results), daemon=True)
            p.start()
            procs.append(p)
    try:
        held.replay()
        done: dict[int, object] = {}
        gone: dict[int, float] = {}  # worker -> when it was first seen ended without a result
        while len(done) < len(calls):
            _drain(events, progress, wait=0.1)
            while True:
                try:
                    i, ok, value = results.get_nowait()
                except queue.Empty:
                    break
                if not ok:
                    raise value
                done[i] = value
            for i, p in enumerate(procs):
                if i in done or p.exitcode is None:
                    continue
                # its result, sent before it ended, may still be on its way: give it a moment
                gone.setdefault(i, time.monotonic())
                if time.monotonic() - gone[i] > _RESULT_GRACE_S:
                    raise RuntimeError(f"convert worker {i} ended with exit code {p.exitcode} without its result")
        _drain(events, progress)
        return [done[i] for i in range(len(calls))]
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join()
        for q in (events, results):
            q.cancel_join_thread()  # what the workers sent and nobody read is dropped, not waited on
            q.close()


def _drain(events, progress, wait: float = 0.0) -> None:
    try:
        progress(events.get(timeout=wait) if wait else events.get_nowait())
    except queue.Empty:
        return
    while True:
        try:
            progress(events.get_nowait())
        except queue.Empty:
            return
