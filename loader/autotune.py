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
    """The Loader's (item, columns, info) source under "auto": the first PROBE_BATCHES made in the main
    process, each timed with the consumer's step after it; then the chosen workers (or this process) make
    the rest from the feed's next step on, so the order is the plan's whatever is chosen."""
    local = loader._local_batches(feed, threads=False)  # no reading thread alive when workers fork
    make_s = step_s = 0.0
    made = 0
    for _ in range(PROBE_BATCHES):
        t0 = time.perf_counter()
        got = next(local, None)
        if got is None:
            break
        made += 1
        t1 = time.perf_counter()
        make_s += t1 - t0
        yield got
        step_s += time.perf_counter() - t1  # the consumer's step (and materializing) after this batch
    if made < PROBE_BATCHES:
        n, why = 0, f"0 workers: the epoch ended within the probe ({made} batches)"
    else:
        n, why = choose(make_s / made, step_s / made, _steps_left(loader), *free_cores())
    loader._auto.update(chosen=n, reason=why)
    loader.num_workers = n
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
    construction, before any batch can be probed, so the choice comes from the free cores alone."""
    cpus, load, free = free_cores()
    n = min(int(free), MAX_WORKERS)
    loader._auto.update(chosen=n, reason=f"{n} workers: read through the node cache, so chosen at construction "
                        f"from the free cores ({cpus} CPUs, load {load:.1f}, {free:.1f} free), without a probe")
    loader.num_workers = n
