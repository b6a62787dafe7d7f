"""One pass of a peer adapter, the job that `bench read` and `bench compare` run in a fresh process
(``fresh.run("shardfeed.tools.bench.child:run", job)``): write, read, train or nothing.

Jobs:
- ``{"mode": "write", "library", "folder", "count", "size"}``: writes the
  samples with the library's own writer.
- ``{"mode": "write_all", "jobs": [...]}``: several write jobs of one library in
  one process (fewer interpreter starts); ``{"results": [...]}`` comes back.
- ``{"mode": "read", "library", "folder", "count", "size", "workers",
  "shuffle", "batch_size", "expected"}``: one timed pass, content-checked,
  its batches counted (the orchestrator gives no rate to a pass too short
  for a steady state). With ``"record": true`` the result also holds the
  keys in read order and the size of each batch (for shuffle quality).
- ``{"mode": "train", ...}``: the reference trainer fed by the library (compare_train.py).
- ``{"mode": "noop"}``: imports the harness only (what every read job imports
  before its library: numpy, xxhash, torch): the interpreter-and-harness part of a fresh-process pass.

A job with ``"spawned_at"`` (``time.time()`` of the parent just before it
started this process) also gets ``fresh_s``: from that moment to the end of
the pass, so interpreter start and every import are in it.

A job with ``"classes"`` (and ``"per_shard"``) reads or writes the
class-ordered samples of ``compare_quality.ClassOrderedSpec`` instead.
"""

from __future__ import annotations

import time
import traceback

from shardfeed.tools.bench.fresh import peak_rss_mib, short
from shardfeed.tools.bench.peers import adapter


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
    from shardfeed.tools.bench.samples import ContentCheck, _as_int_array

    if job["mode"] != "write":
        import torch.utils.data  # noqa: F401 (every read path is a torch DataLoader: the harness's, not timed)
    if job["mode"] == "noop":
        return {"status": "ok", **_since_spawn(job)}
    peer = adapter(job["library"])
    import_start = time.perf_counter()
    try:
        peer.load(read=job["mode"] == "read")
    except Exception as e:  # ImportError and friends: the library is absent or broken here
        # A missing peer is optional; shardfeed itself failing to import is a fault.
        return {"status": f"{'skipped' if peer.peer else 'error'}: cannot import ({short(e)})"}
    import_s = time.perf_counter() - import_start
    spec = spec_of(job)

    if job["mode"] == "write":
        start = time.perf_counter()
        peer.write(spec, job["folder"])
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
    for keys, payloads, classes in peer.batches(job["folder"], job["workers"], job["shuffle"],
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
              "child_peak_rss_mib": peak_rss_mib()}
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
    mode = job["mode"]
    if mode == "write_all":
        return {"results": [run(j) for j in job["jobs"]]}
    try:
        return _train(job) if mode == "train" else _run(job)
    except Exception as e:
        traceback.print_exc()
        return {"status": f"error: {short(e)}"}


def _train(job: dict) -> dict:
    """The reference trainer fed by the library; an ImportError (its or the trainer's) is "skipped" for a peer."""
    from shardfeed.tools.bench.compare_train import run_train

    peer = adapter(job["library"])
    try:
        peer.load(read=True)
        return run_train(job, peer)
    except ImportError as e:
        return {"status": f"{'skipped' if peer.peer else 'error'}: cannot import ({short(e)})"}
