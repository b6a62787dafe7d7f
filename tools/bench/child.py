"""One benchmark configuration in a fresh process: ``python -m
shardfeed.tools.bench.child '<json job>'``.

A fresh process per configuration keeps each peak RSS its own, and isolates
a peer that crashes or cannot be imported. The last stdout line is
``BENCH_RESULT <json>``; libraries may print anything before it.

Jobs:
- ``{"mode": "write", "library", "folder", "count", "size"}``: writes the
  samples with the library's own writer.
- ``{"mode": "read", "library", "folder", "count", "size", "workers",
  "shuffle", "batch_size", "expected"}``: one timed pass, content-checked,
  its batches counted (the orchestrator gives no rate to a pass too short
  for a steady state). With ``"record": true`` the result also holds the
  keys in read order and the size of each batch (for shuffle quality).

- ``{"mode": "noop"}``: imports the harness only (what every read job imports
  before its library: numpy, xxhash, torch): the interpreter-and-harness part of a fresh-process pass.

A job with ``"spawned_at"`` (``time.time()`` of the parent just before it
started this process) also gets ``fresh_s``: from that moment to the end of
the pass, so interpreter start and every import are in it.

A job with ``"classes"`` (and ``"per_shard"``) reads or writes the
class-ordered samples of ``compare_quality.ClassOrderedSpec`` instead.
"""

from __future__ import annotations

import json
import sys
import time
import traceback

RESULT_PREFIX = "BENCH_RESULT "


def result_of(cmd: list[str], prefix: str, timeout: float, env: dict | None = None, who: str = "process") -> dict:
    """Run ``cmd`` (a benchmark's own process, often another venv's python) and return the json of
    its last ``prefix`` line; a timeout or an exit without that line becomes ``{"status": "error: ..."}``
    naming ``who`` and the last line of its stderr, so one broken peer is a row, not a crash."""
    import subprocess

    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"status": f"error: {who} gave no result after {timeout:.0f} s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(prefix):
            return json.loads(line[len(prefix):])
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
    return {"status": f"error: {who} exited {done.returncode} without a result ({tail})"}


def _short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".replace("\n", " ")
    return text if len(text) <= 300 else text[:297] + "..."


def _peak_rss_mib() -> float | None:
    """This process's own peak RSS (VmHWM), or None where /proc is absent.

    Not getrusage's ru_maxrss: Linux carries it across exec, so a fresh
    interpreter would report the peak of the process that spawned it.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)  # kB
    except OSError:
        pass
    return None


def _since_spawn(job: dict) -> dict:
    """``fresh_s``: wall seconds since the parent started this process (interpreter start and imports
    included), where the job says when that was."""
    return {"fresh_s": time.time() - job["spawned_at"]} if job.get("spawned_at") else {}


def spec_of(job: dict):
    """The samples a job writes or reads."""
    if job.get("classes"):
        from shardfeed.tools.bench.compare_quality import ClassOrderedSpec
        return ClassOrderedSpec(job["count"], job["size"], job["classes"], job.get("per_shard"))
    from shardfeed.tools.bench.samples import SampleSpec
    return SampleSpec(job["count"], job["size"])


def _run(job: dict) -> dict:
    from shardfeed.tools.bench.peers import ADAPTERS
    from shardfeed.tools.bench.samples import ContentCheck, _as_int_array

    if job["mode"] != "write":
        import torch.utils.data  # noqa: F401 (every read path is a torch DataLoader: the harness's, not timed)
    if job["mode"] == "noop":
        return {"status": "ok", **_since_spawn(job)}
    adapter = ADAPTERS[job["library"]]
    import_start = time.perf_counter()
    try:
        adapter.load(read=job["mode"] == "read")
    except Exception as e:  # ImportError and friends: the library is absent or broken here
        # A missing peer is optional; shardfeed itself failing to import is a fault.
        return {"status": f"{'skipped' if adapter.peer else 'error'}: cannot import ({_short(e)})"}
    import_s = time.perf_counter() - import_start
    spec = spec_of(job)

    if job["mode"] == "write":
        start = time.perf_counter()
        adapter.write(spec, job["folder"])
        return {"status": "ok", "write_s": time.perf_counter() - start}

    # Steady-state rate: from the end of the first batch to the end of the
    # pass, so start-up (reported as first-batch latency) is not counted twice.
    check = ContentCheck()
    first_batch_s = steady_start = None
    first = {}
    check_s = 0.0
    batches = 0
    order, sizes = ([], []) if job.get("record") else (None, None)
    start = time.perf_counter()
    for keys, payloads, classes in adapter.batches(job["folder"], job["workers"], job["shuffle"],
                                                   job["batch_size"]):
        got = time.perf_counter()
        check.add(keys, payloads, classes)
        done = time.perf_counter()
        check_s += done - got
        batches += 1
        if order is not None:
            order.append(_as_int_array(keys).copy())
            sizes.append(len(order[-1]))
        if first_batch_s is None:
            first_batch_s, steady_start, first = got - start, done, check.result()
    end = time.perf_counter()
    result = {"elapsed_s": end - start, "first_batch_s": first_batch_s, "check_s": check_s, "batches": batches,
              "import_s": import_s, **_since_spawn(job), **check.result(),
              "child_peak_rss_mib": _peak_rss_mib()}
    if steady_start is not None and check.count > first.get("count", 0):
        result.update(steady_s=end - steady_start, steady_count=check.count - first["count"],
                      steady_bytes=check.bytes - first["bytes"])
    if order is not None:
        result.update(order=[int(k) for a in order for k in a], batch_sizes=sizes)
    wrong = check.mismatch(job["expected"])
    result["status"] = f"FAILED: wrong content ({wrong})" if wrong else "ok"
    return result


def run(job: dict) -> dict:
    """The job's result; any exception becomes an ``error: ...`` status (traceback on stderr)."""
    try:
        return _run(job)
    except Exception as e:
        traceback.print_exc()
        return {"status": f"error: {_short(e)}"}


def main(argv: list[str]) -> int:
    result = run(json.loads(argv[0]))
    sys.stdout.flush()
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
