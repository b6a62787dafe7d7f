"""The worker split: which worker of a rank makes which step.

Step ``s`` always goes to worker ``s % num_workers``, and the consumer takes
steps in order, so the sequence of batches never depends on the number of
workers. The loader's dispatch, ``EpochPlan.worker_slice`` and a plain torch
DataLoader's block split all use these two functions.
"""

from __future__ import annotations


def worker_of(step: int, num_workers: int) -> int:
    return step % num_workers


def steps_of(worker: int, num_workers: int, start: int, stop: int) -> range:
    """The steps in [start, stop) that ``worker`` makes."""
    return range(start + (worker - start) % num_workers, stop, num_workers)
