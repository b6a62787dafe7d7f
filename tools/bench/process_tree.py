"""One benchmark job in a fresh interpreter, with the peak RSS of its whole process tree.

``bench read`` runs each configuration this way so no library's imports,
caches or worker processes leak into the next one's figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

from shardfeed.tools.bench.child import RESULT_PREFIX


def _tree_rss(proc) -> tuple[int, int]:
    """(RSS, anonymous RSS) summed over the process and its descendants.

    RSS counts the file pages a process has mapped (mmapped shards it has
    touched); anonymous RSS (RSS minus file-backed and shared pages) is its
    heap alone. Both are kept: the targets use RSS, the other tells why.
    """
    from shardfeed.tools.extras import require

    psutil = require("psutil", "the benchmarks' memory sampling")
    total = anon = 0
    try:
        procs = [proc] + proc.children(recursive=True)
    except psutil.Error:
        return 0, 0
    for p in procs:
        try:
            mem = p.memory_info()
        except psutil.Error:
            continue  # a worker that just exited
        total += mem.rss
        anon += mem.rss - getattr(mem, "shared", 0)
    return total, anon


def run_child(job: dict, timeout: float) -> dict:
    """Runs one job in a fresh interpreter, sampling the RSS of its whole process tree."""
    from shardfeed.tools.extras import require

    psutil = require("psutil", "the benchmarks' memory sampling")
    cmd = [sys.executable, "-m", "shardfeed.tools.bench.child", json.dumps(job)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    watched = psutil.Process(proc.pid)
    peak = [0, 0]
    done = threading.Event()

    def sample():
        while not done.wait(0.02):
            rss, anon = _tree_rss(watched)
            peak[0], peak[1] = max(peak[0], rss), max(peak[1], anon)

    sampler = threading.Thread(target=sample, name="bench-rss-sampler", daemon=True)
    sampler.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # the child's own session: it and its workers, nothing else
        proc.communicate()
        return {"status": f"error: no result after {timeout:.0f} s (--timeout)"}
    finally:
        done.set()
        sampler.join()
    for line in reversed(out.splitlines()):
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX):])
            break
    else:
        tail = (err.strip().splitlines() or ["no output"])[-1][:300]
        return {"status": f"error: process exited {proc.returncode} without a result ({tail})"}
    if result.get("status", "").startswith("error"):
        result["stderr_tail"] = err[-2000:]
    rss = max(peak[0] / 2**20, result.get("child_peak_rss_mib") or 0)
    result["peak_rss_mib"] = round(rss, 1)
    result["peak_anon_rss_mib"] = round(peak[1] / 2**20, 1)
    return result
