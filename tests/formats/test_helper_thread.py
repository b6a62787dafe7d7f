"""The helper thread behind the split gather, the group decode and the read-ahead (helper_thread.py)."""

from __future__ import annotations

import multiprocessing as mp
import threading

import pytest

from shardfeed.formats.engine.helper_thread import Helper


def _names() -> list[str]:
    return [t.name for t in threading.enumerate()]


def test_calls_run_on_the_thread_in_order_and_errors_come_back_as_outcomes():
    h = Helper("shardfeed-test-helper")
    assert not h.started and "shardfeed-test-helper" not in _names()  # no thread before the first call
    h.submit(lambda a, b: (a + b, threading.current_thread().name), 2, 3)
    assert h.wait() == (True, (5, "shardfeed-test-helper"))
    h.submit(int, "not a number")
    ok, err = h.wait()
    assert not ok and isinstance(err, ValueError)
    h.submit(sum, [1, 2, 3])  # the thread outlives a call's error
    assert h.wait() == (True, 6)
    h.close(join=True)
    assert not h.started and "shardfeed-test-helper" not in _names()


def _in_child(h: Helper, q) -> None:
    h.submit(threading.current_thread)
    ok, t = h.wait()
    q.put((ok, t.name, t is not threading.main_thread()))


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="needs fork")
def test_a_forked_child_starts_its_own_thread():
    h = Helper("shardfeed-test-fork")
    h.submit(int, 1)
    assert h.wait() == (True, 1)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_in_child, args=(h, q), daemon=True)
    p.start()
    got = q.get(timeout=30)
    p.join(30)
    assert got == (True, "shardfeed-test-fork", True)  # without a thread of its own the child waits forever
    h.close(join=True)
