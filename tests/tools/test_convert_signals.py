"""A stop (SIGTERM, Ctrl-C) that lands while `convert --processes N` starts
its worker processes: the parent waits until they are up, then stops them.
It used to leave a half-started worker behind, which printed a traceback
after the parent's "stopped" line (1 run in about 14 with the signal just
after the plan was written)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import multiprocessing.util as mp_util
    import signal
    import sys

    from shardfeed.tools.convert import command, job

    real_spawn = mp_util.spawnv_passfds
    stopped = []


    def spawn_then_stop(path, args, passfds):
        """The stop lands once the first worker process exists, before it has been sent its task."""
        pid = real_spawn(path, args, passfds)
        if any(b"spawn_main" in (a if isinstance(a, bytes) else a.encode()) for a in args) and not stopped:
            stopped.append(pid)
            signal.raise_signal(signal.SIGTERM)
        return pid


    def work(x):
        return x


    if __name__ == "__main__":
        mp_util.spawnv_passfds = spawn_then_stop
        with command._stop_on_signals():
            try:
                job._in_pool(work, [(1,), (2,)], lambda _event: None)
            except command.Interrupted as e:
                print("stopped by", e)
                sys.exit(143)
        print("not stopped")
''')


def test_a_stop_while_workers_start_waits_for_them_and_stops_them_quietly(tmp_path):
    script = tmp_path / "stop_at_start.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert out.returncode == 143, (out.stdout, out.stderr)
    assert "stopped by SIGTERM" in out.stdout
    # every worker was stopped by the parent: none is left to fail on a parent that is gone
    assert "Traceback" not in out.stderr, out.stderr
