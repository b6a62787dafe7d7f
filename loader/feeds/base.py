"""The feed contract: what the Loader, the node cache, the audit and the trainer read.

A feed says what comes next, one work item at a time (torchdata.nodes'
``reset / next / get_state``), so the Loader only delivers and a node-local
cache, streaming and mixing attach to the same seam:

    feed.reset(state)      # go to a position (None: the start of the current epoch)
    feed.next()            # -> WorkItem, or StopIteration at the end of the epoch
    feed.get_state()       # plain JSON data; reset(get_state()) continues exactly
    feed.lookahead(k)      # -> up to k Upcoming(shard, epoch, step), in order of next use
    feed.near(steps, skip) # -> the sample ids of the next steps (knows_near; default: [])

and, for the consumers: ``job / stage / batch_size(epoch)`` (the schedule's
job), ``plan(...)``, ``steps(epoch, history)`` and ``len()``, ``set_epoch``
and ``next_epoch``, ``ready()`` (would next() return at once), ``padded``
and ``audit_sources / audit_expect`` (what the audit records and expects).

A work item is one step of this rank: a plan (shuffling.plan_protocol.Plan),
the positions ``[start, stop)`` of it and the stage (batch and image size).
It carries the feed's state *after* it, so a consumer that received items
ahead of use (prefetch) saves the position of what it actually delivered.

Feeds: epoch.py (the epochs of a fixed dataset), follow.py (a growing one),
mixture_epochs.py (sources mixed with exact counts), mixture_stream.py (fixed
sources mixed with a growing one); stream_feed.py holds what the two streams share.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import NamedTuple

import numpy as np

from shardfeed.formats.base.records import SlotRecord
from shardfeed.loader.schedule import BatchSchedule, Stage
from shardfeed.loader.state_checks import check_balanced
from shardfeed.shuffling.plan_protocol import Plan
from shardfeed.shuffling.spec import Job


class WorkItem(SlotRecord):
    """One step: read positions [start, stop) of ``plan`` at ``stage``."""

    # a SlotRecord, not a dataclass: a dataclass compiles its methods at import (issue #24); not frozen: nothing assigns to it
    __slots__ = ("epoch", "step", "plan", "start", "stop", "stage", "state")

    def __init__(self, epoch: int, step: int, plan: Plan, start: int, stop: int, stage: Stage, state: dict):
        self.epoch = epoch
        self.step = step
        self.plan = plan
        self.start = start
        self.stop = stop
        self.stage = stage
        self.state = state  # the feed's state once this item is consumed

    @property
    def image_size(self) -> int | None:
        return self.stage.image_size

    def ids(self) -> np.ndarray:
        return self.plan.positions(self.start, self.stop)


class Upcoming(NamedTuple):
    """A shard and the first step (of ``epoch``) that reads it."""

    shard: int
    epoch: int
    step: int


class AuditSources(SlotRecord):
    """What an audit records per source: names, sample counts (a stream's grows), how
    combined ids split into (source, id in source) (None: one source), and which
    source is a followed stream (None: none)."""

    __slots__ = ("names", "sizes", "split", "stream")

    def __init__(self, names: list, sizes: list,
                 split: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None,
                 stream: int | None = None):
        self.names = names
        self.sizes = sizes
        self.split = split
        self.stream = stream

class Feed(ABC):
    """The contract every feed keeps (see the module docstring); iterating a
    feed yields its work items up to the end of the epoch (or stream)."""

    kind = "feed"
    epoch: int

    def __init__(self, schedule: BatchSchedule, rank: int, world_size: int, ranks_per_node: int | None):
        self.schedule = schedule
        self.rank, self.world_size, self.ranks_per_node = rank, world_size, ranks_per_node
        self._jobs: tuple | None = None  # (epoch, stage, job) of the last epoch asked about
        # per-rank batch sizes set at a step boundary (rebalance): (since epoch, sizes, that epoch's stage)
        self._balanced: tuple | None = None

    # -- the schedule's job ------------------------------------------------
    def _epoch_of(self, epoch: int | None) -> int:
        return self.epoch if epoch is None else epoch

    def _stage_job(self, epoch: int) -> tuple[Stage, Job]:
        # next() asks for the stage and job several times per step: building
        # and validating a Job each time cost ~10 us a step, so the last
        # epoch's pair is kept (a schedule is a function of the epoch)
        got = self._jobs
        if got is None or got[0] != epoch:
            stage = self.schedule.at(epoch)
            w = self.world_size
            sizes = self._balanced_sizes(epoch, stage) or tuple(stage.rank_batch(r, w) for r in range(w))
            got = self._jobs = (epoch, stage, Job(w, sizes, self.ranks_per_node))
        return got[1], got[2]

    def _balanced_sizes(self, epoch: int, stage: Stage) -> tuple[int, ...] | None:
        """The rebalanced sizes where they hold: from the epoch they were set in, while the
        schedule stays at that epoch's stage (a stage change goes back to its own sizes)."""
        b = self._balanced
        if b is None or epoch < b[0] or stage != b[2]:
            return None
        return b[1]

    def _set_balanced(self, since: int | None, sizes: tuple[int, ...] | None) -> None:
        self._balanced = None if sizes is None else (since, tuple(sizes), self.schedule.at(since))
        self._jobs = None

    def balanced_state(self) -> list | None:
        """``[since epoch, per-rank sizes]`` of the rebalance in force (plain data for a state), or None."""
        b = self._balanced
        return None if b is None else [b[0], list(b[1])]

    def stage(self, epoch: int | None = None) -> Stage:
        return self._stage_job(self._epoch_of(epoch))[0]

    def job(self, epoch: int | None = None) -> Job:
        """The job this process is part of in ``epoch``: one batch size per rank."""
        return self._stage_job(self._epoch_of(epoch))[1]

    def batch_size(self, epoch: int | None = None) -> int:
        return self.job(epoch).batch_size(self.rank)

    # -- the contract ---------------------------------------------------------
    def reset(self, state: dict | None = None) -> None:
        """Go to ``state`` (from get_state of this feed or of another world size /
        batch sizes), or to the start of the current epoch. The same job restores
        the saved position; another job starts where the saved one stood, with
        exactly what it had not consumed."""
        if state is None:
            self._start()
            return
        s = self._checked(state)
        self._restore_balanced(check_balanced(s))
        job = self.job(s.get("epoch", 0))
        if s["world_size"] == job.world_size and tuple(s["batch_sizes"]) == job.batch_sizes:
            self._restore(s)
        else:
            self._rejob(s)

    def _restore_balanced(self, saved) -> None:
        """A saved rebalance holds again on the same world size; on another one the new job's
        own sizes deal the rest (an elastic resume), and a balancer measures anew."""
        want = None if saved is None or len(saved[1]) != self.world_size else (saved[0], tuple(saved[1]))
        if want != (self._balanced[:2] if self._balanced else None):  # a reset per step (the cache's) keeps its caches
            self._set_balanced(*(want or (None, None)))

    def rebalance(self, batch_sizes) -> None:
        """New per-rank batch sizes from the current position on (None: the schedule's again).
        Feeds that cannot deal the rest of an epoch again say so."""
        raise TypeError(f"a {self.kind} feed cannot change its per-rank batch sizes mid-run (rebalance): that "
                        "needs a ShardDataset read by epochs (not follow=True, not a Mixture)")

    @abstractmethod
    def next(self) -> WorkItem: ...

    @abstractmethod
    def get_state(self) -> dict: ...

    @abstractmethod
    def lookahead(self, k: int, epochs: int = 2) -> list[Upcoming]: ...

    @abstractmethod
    def _start(self) -> None:
        """To the start of the current epoch (or stream)."""

    @abstractmethod
    def _checked(self, state: dict) -> dict:
        """``state`` checked against this feed's data, shuffle and positions (ValueError naming what is wrong)."""

    @abstractmethod
    def _restore(self, s: dict) -> None:
        """To a checked state of this feed's own job."""

    @abstractmethod
    def _rejob(self, s: dict) -> None:
        """A new job (this feed's) starting at what the checked state's job had consumed."""

    # -- what consumers ask ----------------------------------------------------
    @abstractmethod
    def steps(self, epoch: int | None = None, history=None) -> int:
        """Steps of ``epoch`` (history=(): from its start); TypeError for a stream."""

    def __len__(self) -> int:
        return self.steps(history=())

    @abstractmethod
    def plan(self, *args, **kwargs) -> Plan: ...

    @abstractmethod
    def set_epoch(self, epoch: int) -> None: ...

    @abstractmethod
    def next_epoch(self) -> None: ...

    def ready(self) -> bool:
        """Whether next() would return at once (a stream may wait for data)."""
        return True

    # whether near() says which samples come next (an epoch feed's plans do; a stream's and a
    # mixture's are not read as sample ranges): the cache's sample prefetch needs it
    knows_near = False

    def near(self, steps: int, skip: int = 0) -> list[tuple[int, int, int, np.ndarray]]:
        """The samples of this rank's next ``steps`` steps after ``skip`` ones: a list of
        ``(epoch, first step, batch size, sample ids)``, one per epoch touched. A feed
        that does not know them (``knows_near`` False) says nothing: ``[]``."""
        return []

    def padded(self, epoch: int | None = None) -> int:
        """Positions repeated as padding in ``epoch`` (over all ranks)."""
        return 0

    @abstractmethod
    def audit_sources(self) -> AuditSources: ...

    @abstractmethod
    def audit_expect(self, item: WorkItem) -> dict:
        """What the epoch (or stream prefix) of ``item`` delivers over all ranks, per source:
        ``{"delivered": [...], "unique": [...], "padded": int}``."""

    def __iter__(self):
        while True:
            try:
                yield self.next()
            except StopIteration:
                return


def check_epoch(epoch) -> int:
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
        raise ValueError(f"epoch={epoch!r} must be an int >= 0")
    return int(epoch)


def first_uses(steps: Iterable[tuple[int, int, np.ndarray]], offsets: np.ndarray, k: int,
               out: list[Upcoming], seen: set[int]) -> bool:
    """Append to ``out`` each shard's first use among ``steps`` ((epoch, step, ids),
    in order), skipping ``seen`` ones and ids past ``offsets`` (shards not known
    here yet); True once ``out`` holds ``k``."""
    end = offsets[-1]
    for epoch, step, ids in steps:
        ids = ids[ids < end]
        for sh in dict.fromkeys((np.searchsorted(offsets, ids, side="right") - 1).tolist()):
            if sh not in seen:
                seen.add(sh)
                out.append(Upcoming(int(sh), epoch, step))
                if len(out) >= k:
                    return True
    return False
