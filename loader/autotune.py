"""``Loader(num_workers="auto")``: how many worker processes, chosen from a measured probe.

Like tf.data's AUTOTUNE or Grain's worker count, but decided once and kept: the
first ``PROBE_BATCHES`` batches of the first iteration are made in the main
process (they are delivered, not wasted), timing each batch's making (read,
decode, transform, collate) and the consumer's time between batches (the
training step). Then:

- reading is already a small part of the step at 0 workers (stall under
  ``MIN_STALL``): 0 workers, since workers cost start-up and memory for nothing;
- no core is free for a worker (the CPUs this process may use, from
  ``os.sched_getaffinity``, minus the 1-minute load that is not this process,
  minus one core for the main process): 0 workers;
- what is left of the epoch is too short for a worker's start-up to pay back:
  0 workers;
- otherwise as many workers as it takes for making to hide behind the step
  (``ceil(make / step)``), at most the free cores and ``MAX_WORKERS``.

The choice cannot change what is delivered: the Loader yields the plan's batches
in step order for any ``num_workers`` (and the batches made during the probe are
the first steps of that same order). ``Loader.stats()["autotune"]`` says what was
chosen and why.

``prefetch="auto"``: the batches each worker may have ready ahead, chosen from the
same probe (``PREFETCH_PROBE`` batches then, the first of them left out of the
timing: it opens shards and loads kernels once). Depth only matters where the
workers keep up on average: then it has to ride out the slowest batch seen (a
worker's batch is wanted every ``num_workers * step`` seconds, so
``1 + ceil(slowest / that)`` ready batches cover it), between ``MIN_PREFETCH`` and
``MAX_PREFETCH``. Workers that cannot keep up hand each batch over as soon as it
is made whatever the depth, so deeper would only hold memory: ``MIN_PREFETCH``.
The depth changes when batches are ready, never which or in what order.
``stats()["autotune"]["prefetch"]`` holds its choice and reason.
"""

from __future__ import annotations

import math
import os
import time

PROBE_BATCHES = 2
MAX_WORKERS = 8
MIN_STALL = 0.05  # below this share of the step spent reading, workers are not worth starting
# Wall seconds to start a worker and have its first batch ready (fork, import, open shards): measured
# 0.03-0.1 s on a quiet machine, several times that when busy.
WORKER_START_S = 0.2
PREFETCH_PROBE = 4  # batches probed under prefetch="auto" (the first is cold and not used for the depth)
MIN_PREFETCH = 2  # one batch handed over while the next is made: what keeps a worker busy
MAX_PREFETCH = 8


def requested(num_workers, prefetch) -> tuple[dict | None, int, int]:
    """(the Loader's autotune record or None, num_workers, prefetch) from its arguments: "auto" starts
    at 0 workers and MIN_PREFETCH until the probe chooses; other values are checked here."""
    auto: dict = {}
    if prefetch == "auto":
        auto["prefetch"] = {"requested": "auto", "chosen": None, "reason": "not chosen yet: the first iteration "
                            "probes the first batches"}
        prefetch = MIN_PREFETCH
    elif isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
        raise ValueError(f"prefetch={prefetch!r} must be an int >= 1 or \"auto\"")
    if num_workers == "auto":
        auto.update(requested="auto", chosen=None, reason="not chosen yet: the first iteration probes the first "
                    "batches")
        num_workers = 0
    elif isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers={num_workers!r} must be an int >= 0 or \"auto\"")
    return auto or None, num_workers, prefetch


def pending(auto: dict | None) -> bool:
    """Whether a choice is still to be made by a probe."""
    return auto is not None and ((auto.get("requested") and auto["chosen"] is None)
                                 or (auto.get("prefetch") is not None and auto["prefetch"]["chosen"] is None))


def choose_prefetch(makes: list[float], step_s: float, workers: int) -> tuple[int, str]:
    """(prefetch, reason) from the probe's seconds to make each batch, the consumer's mean step and the
    worker count (module docstring)."""
    if workers == 0:
        return MIN_PREFETCH, f"{MIN_PREFETCH}: 0 workers, so no batch is made ahead (the depth is per worker)"
    step_s = max(step_s, 1e-6)
    typical, slowest = sorted(makes)[len(makes) // 2], max(makes)
    turn = workers * step_s  # how often each worker's next batch is wanted
    seen = (f"probe: {typical * 1e3:.2f} ms to make a batch (slowest {slowest * 1e3:.2f} ms), "
            f"{step_s * 1e3:.2f} ms of step between batches, {workers} worker{'s' if workers > 1 else ''}")
    if typical > turn:
        return MIN_PREFETCH, (f"{MIN_PREFETCH}: the workers cannot keep up (a batch takes {typical * 1e3:.2f} ms, one "
                              f"is wanted from each every {turn * 1e3:.2f} ms), so each is taken as soon as made and "
                              f"a deeper queue would only hold memory ({seen})")
    need = 1 + math.ceil(slowest / turn)
    n = min(max(need, MIN_PREFETCH), MAX_PREFETCH)
    ready = f"{need - 1} batch{'es' if need > 2 else ''} ready per worker {'rides' if need == 2 else 'ride'} out"
    limit = ("" if n == need else f", limited by MAX_PREFETCH={MAX_PREFETCH}" if n < need
             else f", at least MIN_PREFETCH={MIN_PREFETCH}")
    return n, (f"{n}: the workers keep up; {ready} the slowest batch ({slowest / turn:.1f} of a worker's "
               f"{turn * 1e3:.2f} ms turn){limit} ({seen})")


def free_cores() -> tuple[int, float, float]:
    """(CPUs this process may run on, 1-minute load average, cores free for workers): the load counts this
    process (it is running the probe), so one unit of it is ours; one core stays with the main process."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    others = max(0.0, load - 1.0)
    return cpus, load, max(0.0, cpus - others - 1.0)


def choose(make_s: float, step_s: float, remaining: int, cpus: int, load: float, free: float) -> tuple[int, str]:
    """(num_workers, reason) from the probe's mean seconds per batch spent making (``make_s``) and
    consuming (``step_s``), the batches left in the epoch and the machine's free cores."""
    step_s = max(step_s, 1e-6)
    stall = make_s / (make_s + step_s)
    seen = f"probe: {make_s * 1e3:.2f} ms to make a batch, {step_s * 1e3:.2f} ms of step between batches"
    machine = f"{cpus} CPUs, load {load:.1f}, {free:.1f} free for workers"
    if stall < MIN_STALL:
        return 0, f"0 workers: reading is {stall:.1%} of the step at 0 workers ({seen})"
    budget = int(free)
    if budget < 1:
        return 0, f"0 workers: no core free for a worker ({machine}; {seen})"
    # a worker saves at most min(make, step) per batch (the part that overlaps the step)
    saving = remaining * min(make_s, step_s)
    if saving < WORKER_START_S:
        return 0, (f"0 workers: {remaining} batches left would save about {saving:.2f} s, less than a "
                   f"worker's start (~{WORKER_START_S} s) ({seen})")
    needed = max(1, math.ceil(make_s / step_s))
    n = min(needed, budget, MAX_WORKERS)
    limit = ("enough to hide making behind the step" if n == needed else
             f"limited by {'the free cores' if n == budget else f'MAX_WORKERS={MAX_WORKERS}'} "
             f"(hiding making behind the step would take {needed})")
    return n, f"{n} workers: at 0 workers the consumer would wait {stall:.0%} of the time; {limit} ({seen}; {machine})"


def probed_batches(loader, feed):
    """The Loader's (item, columns, info) source under "auto": the first batches made in the main
    process, each timed with the consumer's step after it; then the chosen workers (or this process) make
    the rest from the feed's next step on, so the order is the plan's whatever is chosen."""
    auto = loader._auto
    deep = auto.get("prefetch") is not None
    probe = PREFETCH_PROBE if deep else PROBE_BATCHES
    local = loader._local_batches(feed, threads=False)  # no reading thread alive when workers fork
    makes, step_s = [], 0.0
    for _ in range(probe):
        t0 = time.perf_counter()
        got = next(local, None)
        if got is None:
            break
        t1 = time.perf_counter()
        makes.append(t1 - t0)
        yield got
        step_s += time.perf_counter() - t1  # the consumer's step (and materializing) after this batch
    made = len(makes)
    n = loader.num_workers
    if auto.get("requested"):
        if made < probe:
            n, why = 0, f"0 workers: the epoch ended within the probe ({made} batches)"
        else:
            n, why = choose(sum(makes) / made, step_s / made, _steps_left(loader), *free_cores())
        auto.update(chosen=n, reason=why)
        loader.num_workers = n
    if deep:
        if made < probe:
            p, why = MIN_PREFETCH, f"{MIN_PREFETCH}: the epoch ended within the probe ({made} batches)"
        else:
            p, why = choose_prefetch(makes[1:], step_s / made, n)
        auto["prefetch"].update(chosen=p, reason=why)
        loader.prefetch = p
    if n == 0:
        loader._allow_threads()
        yield from local
        return
    local.close()
    loader._maker.close()
    loader._maker = None
    yield from loader._worker_batches(feed)


def _steps_left(loader) -> int:
    try:
        return max(0, len(loader) - loader.feed.get_state()["step"])
    except (TypeError, KeyError, ValueError):  # a followed stream has no fixed length
        return 1 << 30


def from_cores(loader) -> None:
    """"auto" for a dataset read through the node cache: its budget is sized for the readers at
    construction, before any batch can be probed, so the choice comes from the free cores alone
    (and the depth is the default)."""
    auto = loader._auto
    if auto.get("requested"):
        cpus, load, free = free_cores()
        n = min(int(free), MAX_WORKERS)
        auto.update(chosen=n, reason=f"{n} workers: read through the node cache, so chosen at construction "
                    f"from the free cores ({cpus} CPUs, load {load:.1f}, {free:.1f} free), without a probe")
        loader.num_workers = n
    if auto.get("prefetch") is not None:
        auto["prefetch"].update(chosen=MIN_PREFETCH, reason=f"{MIN_PREFETCH}: read through the node cache, so "
                                "chosen at construction (the default), without a probe")
