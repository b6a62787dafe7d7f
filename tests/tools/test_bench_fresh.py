"""The benchmarks' one fresh-process runner (tools/bench/fresh.py): a function's dict comes back from a new
interpreter; a crash, an exit without a result or a timeout is an ``error:`` row naming who, and a timeout
kills the child's whole session (its own children too); with ``rss=True`` the tree's peak RSS is measured."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from shardfeed.tools.bench import fresh

HERE = os.path.abspath(__file__)


# -- the functions the children run (this file is loaded by path there) ------------------------------------
def noisy(job: dict) -> dict:
    print("a library's chatter\nBENCH_RESULT not json either way")  # noqa: T201 (the child's stdout, on purpose)
    return {"status": "ok"}


def raises(job: dict) -> dict:
    raise ValueError("the peer broke\nover two lines")


def exits(job: dict) -> dict:
    sys.stderr.write("last words\n")
    sys.stderr.flush()
    os._exit(3)


def hangs_with_a_child(job: dict) -> dict:
    sleeper = subprocess.Popen(["sleep", "60"])
    with open(job["pid_file"], "w") as f:
        f.write(str(sleeper.pid))
    time.sleep(60)
    return {"status": "ok"}


def holds(job: dict) -> dict:
    block = b"\x01" * (job["mib"] << 20)  # touched pages
    time.sleep(0.3)  # long enough for the 20 ms sampler
    return {"status": "ok", "held": len(block), "child_peak_rss_mib": fresh.peak_rss_mib()}


# -- the tests ----------------------------------------------------------------------------------------------
ECHO = """
import os, sys
def echo(job):
    return {"status": "ok", "job": job, "pid": os.getpid(), "shardfeed_imported": "shardfeed" in sys.modules}
"""


def test_a_function_runs_in_a_new_interpreter_and_its_dict_comes_back(tmp_path):
    (tmp_path / "echo.py").write_text(ECHO)
    got = fresh.run(f"{tmp_path / 'echo.py'}:echo", {"a": [1, 2]}, timeout=60)
    assert got["status"] == "ok" and got["job"] == {"a": [1, 2]} and got["pid"] != os.getpid()
    # a module loaded by path that imports nothing of shardfeed: the runner imported none of it either (what
    # `bench startup` relies on to time shardfeed's import from a cold interpreter)
    assert got["shardfeed_imported"] is False


def test_a_module_by_name_and_by_path_reaches_the_same_function():
    by_name = fresh.run("shardfeed.tools.bench.fresh:peak_rss_mib", {}, timeout=60)
    # peak_rss_mib takes no job: the TypeError is the row, by name and by path alike
    assert by_name["status"].startswith("error: TypeError"), by_name
    by_path = fresh.run("shardfeed.tools.bench.fresh:peak_rss_mib", {}, timeout=60, by_path=True)
    assert by_path["status"] == by_name["status"]


def test_chatter_before_the_last_line_is_ignored():
    assert fresh.run(f"{HERE}:noisy", {}, timeout=60) == {"status": "ok"}


def test_an_exception_is_an_error_row_with_the_traceback_kept():
    got = fresh.run(f"{HERE}:raises", {}, timeout=60)
    assert got["status"] == "error: ValueError: the peer broke over two lines", got
    assert "Traceback" in got["stderr_tail"] and "raises" in got["stderr_tail"]


def test_an_exit_without_a_result_names_who_and_the_last_stderr_line():
    got = fresh.run(f"{HERE}:exits", {}, timeout=60, who="the peer's process")
    assert got == {"status": "error: the peer's process exited 3 without a result (last words)"}


def test_a_timeout_kills_the_child_and_its_own_children(tmp_path):
    pid_file = tmp_path / "pid"
    start = time.monotonic()
    got = fresh.run(f"{HERE}:hangs_with_a_child", {"pid_file": str(pid_file)}, timeout=2)
    assert got == {"status": "error: the process gave no result after 2 s"}
    assert time.monotonic() - start < 20
    sleeper = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(sleeper):
        time.sleep(0.05)
    assert not _alive(sleeper), "the child's own child outlived the timeout"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            state = next(line for line in f if line.startswith("State:"))
    except (OSError, StopIteration):
        return False
    return " Z " not in state and "zombie" not in state


def test_rss_of_the_tree_is_sampled_and_never_below_the_childs_own_peak():
    got = fresh.run(f"{HERE}:holds", {"mib": 150}, timeout=60, rss=True)
    assert got["status"] == "ok" and got["held"] == 150 << 20
    assert got["child_peak_rss_mib"] >= 150 and got["peak_rss_mib"] >= got["child_peak_rss_mib"]
    assert 0 < got["peak_anon_rss_mib"] <= got["peak_rss_mib"]
