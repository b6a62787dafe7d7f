"""StreamFeed: what a followed stream's feeds share: global batches formed as samples
are published, the end of the stream, waiting, and the job's position.

Delivery is a pure function of the commit log's prefix, so ranks agree
without messages. Full global batch ``g`` of the job that starts at stream
position ``base`` (at total step ``base_step``) takes ``per`` new stream
samples ``[base + g*per, base + (g+1)*per)`` and is formed only once all of
them are published. The end of the stream is a commit: the ``n < per``
samples left form one last short step of stream samples, split by
``shuffling.apportion.tail_shares`` (padding of at most world_size-1 when
``n`` < world size), not delivered with ``drop_last``; then next() raises
StopIteration on every rank at the same step. Waiting polls the log every
``poll_s`` and raises after ``idle_timeout_s`` without a commit.

A state loaded by another world size / batch sizes starts a new job at the
samples consumed, so nothing is lost or repeated. follow.py (one growing
dataset) and mixture_stream.py (fixed sources mixed with one) say what a
step holds.
"""

from __future__ import annotations

from abc import abstractmethod

import numpy as np

from shardfeed.loader.feeds.base import Feed, Upcoming, WorkItem, first_uses
from shardfeed.loader.feeds.stream_log import StreamLog
from shardfeed.loader.schedule import BatchSchedule


class StreamFeed(Feed):
    """This rank's steps over a stream (see the module docstring); the stream is one "epoch" (0)."""

    _lookahead_steps = 4096  # steps one lookahead call may scan (bounds its cost)

    def __init__(self, root: str, schedule: BatchSchedule, rank: int, world_size: int, ranks_per_node: int | None,
                 poll_s: float, idle_timeout_s: float, drop_last: bool, what: str, source=None):
        super().__init__(schedule, rank, world_size, ranks_per_node)
        self.root, self.poll_s, self.idle_timeout_s = root, poll_s, idle_timeout_s
        self.drop_last = bool(drop_last)
        self._what = what  # how errors name this stream
        self.log = StreamLog(root, source)  # source: a remote dataset's LogMirror (stream_log.py)
        self.epoch = 0
        self.step, self.base, self.base_step, self.done = 0, 0, 0, False
        self._plan = None

    # -- what a step holds (follow.py, mixture_stream.py) -------------------
    @abstractmethod
    def _per(self) -> int:
        """New stream samples per full global batch of the current job."""

    @abstractmethod
    def _full_step(self, g: int, bs: int) -> tuple:
        """(plan, start, stop) of full global batch ``g`` of the current job."""

    @abstractmethod
    def _step_ids(self, g: int, bs: int) -> np.ndarray:
        """This rank's ids of full global batch ``g`` (for lookahead)."""

    @abstractmethod
    def _shard_offsets(self) -> np.ndarray:
        """Cumulative samples of the shards the ids index (for lookahead)."""

    # -- the stream is one epoch --------------------------------------------
    def _epoch_of(self, epoch: int | None) -> int:
        return 0

    def steps(self, epoch: int | None = None, history=None) -> int:
        raise TypeError(f"{self._what} has no length (it grows until its end commit); count steps as they come")

    __len__ = steps

    def set_epoch(self, epoch: int) -> None:
        """A stream is one epoch; set_epoch(0) keeps the position, another epoch is refused."""
        if epoch != self.epoch:
            raise ValueError(f"{self._what} is one stream (epoch 0); set_epoch({epoch!r}) has no meaning for it")

    def next_epoch(self) -> None:
        """Past the end of the stream: nothing more comes."""
        self.done = True

    # -- the contract ----------------------------------------------------------
    def next(self) -> WorkItem:
        if self.done:
            raise StopIteration
        per, bs = self._per(), self.batch_size()
        g = self.step - self.base_step
        need = self.base + (g + 1) * per
        self.log.wait(need, self.step, self.poll_s, self.idle_timeout_s)
        if self.log.total >= need:
            plan, start, stop = self._full_step(g, bs)
        else:  # ended: the short last step, or nothing
            full = (self.log.total - self.base) // per
            tail = self.log.total - self.base - full * per
            if g > full or tail == 0 or self.drop_last:
                self.done = True
                raise StopIteration
            plan = self.plan(full, tail)
            _, n = plan.shares[self.rank]
            start, stop = g * bs, g * bs + max(n, 1)
        self.step += 1
        return WorkItem(0, self.step - 1, plan, start, stop, self.stage(), self.get_state())

    def ready(self) -> bool:
        """Whether next() would return at once (polls the log once when it
        would wait): lets a prefetching consumer hand out what it holds
        instead of blocking on data not yet published."""
        if self.done or self.log.end is not None:
            return True
        need = self.base + (self.step - self.base_step + 1) * self._per()
        if self.log.total < need:
            self.log.poll()
        return self.log.total >= need or self.log.end is not None

    def _taken(self) -> tuple[int, int]:
        """(full global batches of this job all ranks have taken, stream samples consumed)."""
        g = self.step - self.base_step
        if self.log.end is not None and g > (self.log.total - self.base) // self._per():  # the tail was taken
            return g - 1, self.log.total
        return g, self.base + g * self._per()

    def _start(self) -> None:
        self.step, self.base, self.base_step, self.done = 0, 0, 0, False

    def _restore(self, s: dict) -> None:
        self.step, self.base, self.base_step, self.done = s["step"], s["base"], s["base_step"], s["done"]

    def _rejob(self, s: dict) -> None:
        consumed = s["watermark"]["samples"]
        if consumed > self.log.total:
            self.log.poll()
        self.step, self.base, self.base_step, self.done = s["step"], consumed, s["step"], s["done"]
        if self.log.end is not None and consumed >= self.log.total:
            self.done = True

    def lookahead(self, k: int, epochs: int = 1) -> list[Upcoming]:
        """Up to ``k`` published shards this rank reads next, in order of first
        use, each with that step; only samples already published count."""
        out: list[Upcoming] = []
        if self.done:
            return out
        bs, g0 = self.batch_size(), self.step - self.base_step
        full = (self.log.total - self.base) // self._per()
        steps = ((0, self.base_step + g, self._step_ids(g, bs))
                 for g in range(g0, min(full, g0 + self._lookahead_steps)))
        first_uses(steps, self._shard_offsets(), k, out, set())
        return out

    def padded(self, epoch: int | None = None) -> int:
        """Padding of the tail (known once the stream ended and the tail was formed)."""
        p = self._plan
        return max(0, self.world_size - p.tail) if p is not None and p.tail else 0

    def _item_padded(self, item: WorkItem) -> int:
        tail = item.plan.tail
        return max(0, self.world_size - tail) if tail else 0

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.root!r}, rank={self.rank}/{self.world_size}, step={self.step}, "
                f"published={self.log.total}, ended={self.log.end is not None})")
