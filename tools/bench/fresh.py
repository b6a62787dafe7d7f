"""The benchmarks' one fresh-process runner: a function run in a new interpreter, its result back as a dict.

A process of its own keeps a configuration's peak RSS its own, turns a peer that crashes or cannot be
imported into a row instead of a crash, keeps an import measured from a cold interpreter cold, and lets a
library that lives in another venv (MosaicML Streaming, DALI) run under that venv's python.

``run("package.module:function", job, timeout=...)`` starts ``python fresh.py TARGET JOB`` in a session
of its own. The child imports the module, calls ``function(job)`` (a dict in, a JSON-able dict out) and
prints ``BENCH_RESULT <json>`` as its last stdout line; a library may print anything before it. Under this
interpreter the module is imported by name; under another ``python`` (or with ``by_path=True``) it is
loaded from its file, because that venv may hold another checkout's shardfeed or none, and a start-up
measurement must import nothing of shardfeed before its own timing. This file imports nothing of shardfeed
for the same reason.

What comes back is the function's dict, or ``{"status": "error: ..."}`` naming ``who`` gave no result (a
timeout, an exit without the line, an exception: its traceback on stderr, the end of which is kept as
``stderr_tail``). On a timeout the child's whole session is killed: it and its workers, nothing else. With
``rss=True`` the RSS of the child's process tree is sampled every 20 ms (``peak_rss_mib``,
``peak_anon_rss_mib``), never below the child's own VmHWM where its function reports
``child_peak_rss_mib``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import traceback

RESULT_PREFIX = "BENCH_RESULT "
_HERE = os.path.abspath(__file__)
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))
# the venvs of the libraries that cannot share this interpreter: (folder beside the checkout, environment
# variable, how to make it)
VENVS = {"peers": (".venv-peers", "SHARDFEED_PEERS_PYTHON", "tools/bench/install_peers.sh"),
         "dali": (".venv-dali", "SHARDFEED_DALI_PYTHON", "WITH_DALI=1 tools/bench/install_peers.sh")}


def run(target: str, job: dict, *, timeout: float, python: str | None = None, by_path: bool | None = None,
        env: dict | None = None, rss: bool = False, who: str = "the process") -> dict:
    """``target`` ("package.module:function", or "path/file.py:function") called with ``job`` in a fresh
    ``python`` (default: this one)."""
    python = python or sys.executable
    if by_path is None:
        by_path = python != sys.executable
    module, _, function = target.rpartition(":")
    if by_path and not module.endswith(".py"):
        target = f"{_module_file(module)}:{function}"
    cmd = [python, _HERE, target, json.dumps(job)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    sampler = _TreeRss(proc.pid) if rss else None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # the child's own session: it and its workers, nothing else
        proc.communicate()
        return {"status": f"error: {who} gave no result after {timeout:.0f} s"}
    finally:
        if sampler is not None:
            sampler.stop()
    result = _last_result(out)
    if result is None:
        tail = (err.strip().splitlines() or ["no output"])[-1][:300]
        return {"status": f"error: {who} exited {proc.returncode} without a result ({tail})"}
    if str(result.get("status", "")).startswith("error"):
        result["stderr_tail"] = err[-2000:]
    if sampler is not None:
        result["peak_rss_mib"] = round(max(sampler.peak / 2**20, result.get("child_peak_rss_mib") or 0), 1)
        result["peak_anon_rss_mib"] = round(sampler.peak_anon / 2**20, 1)
    return result


def venv_python(venv: str, given: str | None = None) -> str | None:
    """The interpreter of one of VENVS: ``given`` (an option), else its environment variable, else the
    folder beside this checkout when it exists; None when there is none. A given path that is not an
    executable is a ValueError saying how to make the venv."""
    folder, env, make = VENVS[venv]
    path = given or os.environ.get(env) or os.path.join(_CHECKOUT, folder, "bin", "python")
    if given and not (os.path.isfile(given) and os.access(given, os.X_OK)):
        raise ValueError(f"{given}: not an executable python; make the venv with {make} or leave the option out")
    return path if os.access(path, os.X_OK) else None


def _module_file(module: str) -> str:
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        raise ValueError(f"fresh.run: no file for module {module!r}")
    return spec.origin


def _last_result(out: str) -> dict | None:
    for line in reversed(out.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    return None


class _TreeRss:
    """The peak RSS and anonymous RSS (RSS minus file-backed and shared pages: the heap alone) summed over
    a process and its descendants, sampled every 20 ms on a thread. RSS counts the file pages a process has
    mapped (mmapped shards it touched); both are kept: the targets use RSS, the other tells why."""

    def __init__(self, pid: int):
        from shardfeed.tools.extras import require

        self.psutil = require("psutil", "the benchmarks' memory sampling")
        self.proc = self.psutil.Process(pid)
        self.peak = self.peak_anon = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="bench-rss-sampler", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(0.02):
            total, anon = self.now()
            self.peak, self.peak_anon = max(self.peak, total), max(self.peak_anon, anon)

    def now(self) -> tuple[int, int]:
        total = anon = 0
        try:
            procs = [self.proc] + self.proc.children(recursive=True)
        except self.psutil.Error:
            return 0, 0
        for p in procs:
            try:
                mem = p.memory_info()
            except self.psutil.Error:
                continue  # a worker that just exited
            total += mem.rss
            anon += mem.rss - getattr(mem, "shared", 0)
        return total, anon

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def peak_rss_mib() -> float | None:
    """This process's own peak RSS (VmHWM), or None where /proc is absent.

    Not getrusage's ru_maxrss: Linux carries it across exec, so a fresh interpreter would report the
    peak of the process that spawned it.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)  # kB
    except OSError:
        pass
    return None


def short(e: BaseException) -> str:
    """An exception as one line of at most 300 characters, for a row's status."""
    text = f"{type(e).__name__}: {e}".replace("\n", " ")
    return text if len(text) <= 300 else text[:297] + "..."


def _load(target: str):
    where, _, function = target.rpartition(":")
    if where.endswith(".py"):
        import importlib.util

        name = "bench_" + os.path.splitext(os.path.basename(where))[0]
        spec = importlib.util.spec_from_file_location(name, where)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    else:
        import importlib

        module = importlib.import_module(where)
    return getattr(module, function)


def main(argv: list[str]) -> int:
    target, job = argv[0], json.loads(argv[1])
    try:
        result = _load(target)(job)
    except Exception as e:
        traceback.print_exc()
        result = {"status": f"error: {short(e)}"}
    sys.stdout.flush()
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    # run as a file, its folder is sys.path[0]: the benchmarks' modules would shadow top-level names
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(_HERE):
        sys.path.pop(0)
    sys.exit(main(sys.argv[1:]))
