"""A stop (SIGTERM, Ctrl-C) that lands while `convert --processes N` starts
its worker processes: the parent waits until they are up, then stops them
and exits. Two faults this guards: a half-started worker printed a
traceback after the parent's "stopped" line (1 run in about 14 with the
signal just after the plan was written), and with multiprocessing.Pool the
parent once hung for good in Pool.terminate() (seen under load: its
task-feeding thread blocked writing a big task to workers it had stopped).
That race is not reproducible on demand; workers that get their task in
their spawn data cannot meet it, and the 32 MiB case checks a big task
still stops at once."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import multiprocessing.util as mp_util
    import signal
    import sys

    from shardfeed.tools.convert import convert_cmd, processes

    real_spawn = mp_util.spawnv_passfds
    stopped = []


    def spawn_then_stop(path, args, passfds):
        """The stop lands once the first worker process exists, before it has been sent its task."""
        pid = real_spawn(path, args, passfds)
        if any(b"spawn_main" in (a if isinstance(a, bytes) else a.encode()) for a in args) and not stopped:
            stopped.append(pid)
            signal.raise_signal(signal.SIGTERM)
        return pid


    def work(payload, emit):
        emit(len(payload))
        return len(payload)


    if __name__ == "__main__":
        mp_util.spawnv_passfds = spawn_then_stop
        payload = b"x" * int(sys.argv[1])
        with convert_cmd._stop_on_signals():
            try:
                processes.run_each(work, [(payload,), (payload,)], lambda _event: None)
            except convert_cmd.Interrupted as e:
                print("stopped by", e)
                sys.exit(143)
        print("not stopped")
''')


@pytest.mark.parametrize("task_bytes", [10, 32 << 20])
def test_a_stop_while_workers_start_waits_for_them_and_stops_them_quietly(tmp_path, task_bytes):
    script = tmp_path / "stop_at_start.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script), str(task_bytes)], capture_output=True, text=True,
                         timeout=180, cwd=tmp_path)
    assert out.returncode == 143, (out.stdout, out.stderr)
    assert "stopped by SIGTERM" in out.stdout
    # every worker was stopped by the parent: none is left to fail on a parent that is gone
    assert "Traceback" not in out.stderr, out.stderr


def test_workers_results_come_in_order_and_an_error_is_raised_here():
    from shardfeed.tools.convert.processes import run_each

    seen = []
    assert run_each(_square, [(3,), (4,), (5,)], seen.append) == [9, 16, 25]
    assert sorted(seen) == [3, 4, 5]  # each worker's events reached the parent
    with pytest.raises(ValueError, match="no negative: -1"):
        run_each(_square, [(2,), (-1,)], seen.append)
    # an error that does not pickle reaches here as its text, never as a wait for a result that is not coming
    with pytest.raises(RuntimeError, match="(?s)worker 1 failed:.*cannot send this"):
        run_each(_square, [(2,), (-2,)], seen.append)


class _Unpicklable(Exception):
    def __reduce__(self):
        raise TypeError("not picklable")


def _square(x, emit):
    if x == -2:
        raise _Unpicklable("cannot send this")
    if x < 0:
        raise ValueError(f"no negative: {x}")
    emit(x)
    return x * x
