"""The balancer: per-rank batch sizes from measured rank speed, agreed by all ranks mid-run.

Mixed hardware (ranks of different speed in one DDP job) waits for the
slowest rank at every step unless each rank's batch fits its speed. A
``Balancer`` measures, on each rank, the compute time of each step (the
time between batches less the time the loader made the consumer wait for
data), and every ``every`` steps gathers every rank's measurements with one
small collective (``torch.distributed.all_gather_object`` when a process
group is initialised, or any ``gather`` callable: a list of every rank's
object, in rank order). Every rank then computes the same proposal
(``shuffling.balance_proposal.propose_batch_sizes``: a cost model ``t = a*b + c``
fitted per rank, the global batch kept, per-rank limits, a rounding rule,
hysteresis) and, when it changes the sizes, calls ``Loader.rebalance`` at
the same step. A stage change of the schedule (another image or global
batch size) starts the measurements anew.

``BalanceLog`` is the Loader's record of its rebalances: when, from what to
what, and what the balancer measured, in ``stats()["balance"]`` and in the
state.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from shardfeed.shuffling.balance_proposal import DEFAULT_THRESHOLD, propose_batch_sizes, recent_points

LOG_ENTRIES = 16  # rebalances a Loader keeps (stats and state): enough to see a trend, bounded in size
INTERVALS = 8  # intervals of measurements a Balancer keeps per rank (recent_points picks among them)


class BalanceLog:
    """The last ``LOG_ENTRIES`` rebalances of a Loader, as plain JSON data."""

    def __init__(self, entries=()):
        self.entries = [dict(e) for e in entries]

    @classmethod
    def of(cls, state: dict) -> BalanceLog:
        """The log a Loader state holds (``"balance"``; empty when absent)."""
        log = state.get("balance", [])
        if not isinstance(log, list) or not all(isinstance(e, dict) for e in log):
            raise ValueError(f"state['balance']={log!r} must be a list of dicts, as Loader.state_dict() writes it")
        return cls(log)

    def record(self, pos: dict, before, after, why) -> None:
        """A rebalance at feed position ``pos`` (the consumer's, before it) from sizes ``before`` to ``after``."""
        self.entries.append({"epoch": pos["epoch"], "step": epoch_step(pos), "from": list(before),
                             "batch_sizes": list(after), "why": why})
        del self.entries[:-LOG_ENTRIES]

    def state(self) -> list[dict]:
        """For a state dict: every entry's sizes, and the measurements (``why``) of the newest only, so
        the state stays small for a job of many ranks (``stats()`` has them all)."""
        return [dict(e) if i == len(self.entries) - 1 else {**e, "why": None} for i, e in enumerate(self.entries)]

    def all(self) -> list[dict]:
        return [dict(e) for e in self.entries]

    def __bool__(self) -> bool:
        return bool(self.entries)


def epoch_step(pos: dict) -> int:
    """Steps taken in the epoch of feed state ``pos``, over its elastic history too."""
    done = sum(max(-(-c // b) for c, b in zip(consumed, sizes)) for _, sizes, consumed in pos.get("history") or ())
    return done + pos["step"]


def default_gather(world_size: int) -> Callable[[object], list]:
    """torch.distributed's all_gather_object where a process group is initialised; alone, the object itself."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        def gather(obj):
            out = [None] * dist.get_world_size()
            dist.all_gather_object(out, obj)
            return out
        return gather
    if world_size == 1:
        return lambda obj: [obj]
    raise ValueError(f"a Balancer of {world_size} ranks needs torch.distributed initialised or a gather callable "
                     "(obj -> list of every rank's obj, in rank order)")


class Balancer:
    """Per-rank batch sizes for ``loader`` from measured speed; call ``step()`` once per training step.

    every: steps between agreements (each one gather of a few numbers per rank). min_batch /
    max_batch: an int or one per rank (max: a memory cap; None: no cap below the global batch).
    multiple: every size a multiple of it. threshold: the share the predicted step time must
    improve by (beyond the measurements' own noise) before the sizes change. gather: ``obj ->
    list of every rank's obj`` (default: torch.distributed.all_gather_object). The global batch
    is the one in force (the stage's, or a rebalance's): the balancer only re-splits it.

    Under DDP pass ``step(compute_s=timer.take())`` from a ``step_timer.ComputeTimer``: the
    gradient all-reduce makes the wall time between batches the slowest rank's on every rank,
    so measured that way all ranks look alike and nothing changes.
    """

    def __init__(self, loader, every: int = 50, *, min_batch=1, max_batch=None, multiple: int = 1,
                 threshold: float = DEFAULT_THRESHOLD, gather: Callable[[object], list] | None = None):
        if isinstance(every, bool) or not isinstance(every, int) or every < 2:
            raise ValueError(f"every={every!r} must be an int >= 2 (steps between agreements)")
        self.loader, self.every = loader, every
        self.limits = {"min_batch": min_batch, "max_batch": max_batch, "multiple": multiple, "threshold": threshold}
        self.rank, self.world_size = loader.feed.rank, loader.feed.world_size
        self.gather = gather or default_gather(self.world_size)
        self._points: list[tuple[int, float]] = []  # this interval's (batch size, compute s)
        self._history: list[list] = [[] for _ in range(self.world_size)]  # per rank, its last intervals
        self._stage = None
        self._last: tuple | None = None  # (time, loader's samples, loader's data wait) at the last step()
        self.steps = self.agreements = 0

    def step(self, compute_s: float | None = None) -> bool:
        """One training step done. Measures its compute time (or takes ``compute_s``, e.g. one the
        trainer timed with device synchronisation) and, every ``every`` steps, agrees with the other
        ranks and rebalances; True when it rebalanced. Every rank calls it at every step."""
        now, (samples, wait) = time.perf_counter(), self.loader.progress()
        if compute_s is None and self._last is not None:
            compute_s = (now - self._last[0]) - (wait - self._last[2])
        # the samples this step took (an epoch's last batch may be short of the batch size)
        taken = samples - self._last[1] if self._last is not None else self.loader.batch_sizes()[self.rank]
        self._last = (now, samples, wait)
        if compute_s is not None and taken > 0:
            self._points.append((taken, max(0.0, float(compute_s))))
        self.steps += 1
        if self.steps % self.every:
            return False
        changed = self._agree()
        self._last = (time.perf_counter(), *self.loader.progress())  # the agreement is not a step's compute
        return changed

    def _agree(self) -> bool:
        loader = self.loader
        stage = loader.stage()
        if stage != self._stage:  # another image size or global batch: what was measured no longer holds
            self._stage = stage
            self._history = [[] for _ in range(self.world_size)]
        pos = loader.state_dict()
        mine = {"rank": self.rank, "at": [pos["epoch"], epoch_step(pos["feed"])], "points": self._points}
        self._points = []
        got = self.gather(mine)
        self.agreements += 1
        if len(got) != self.world_size or [g["rank"] for g in got] != list(range(self.world_size)):
            raise RuntimeError(f"the balancer's gather returned {[g.get('rank') for g in got]}, not one entry per "
                               f"rank 0..{self.world_size - 1} in rank order")
        if any(g["at"] != mine["at"] for g in got):
            raise RuntimeError("ranks called the balancer at different positions (epoch, step): "
                               f"{[g['at'] for g in got]}; every rank calls step() once per training step")
        for h, g in zip(self._history, got):
            if g["points"]:
                h.append(g["points"])
                del h[:-INTERVALS]
        if not all(self._history):
            return False  # a rank has nothing measured yet (its first step): wait for the next interval
        current = loader.batch_sizes()
        measured = [recent_points(h) for h in self._history]
        p = propose_batch_sizes(measured, sum(current), current, **self.limits)
        if not p.changed:
            return False
        loader.rebalance(list(p.batch_sizes), why={"agreement": self.agreements, "proposal": p.as_dict(),
                                                   "measured": [_summary(m) for m in measured]})
        return True

    def stats(self) -> dict:
        return {"steps": self.steps, "agreements": self.agreements, "every": self.every,
                "batch_sizes": list(self.loader.batch_sizes())}


def _summary(points) -> list[list]:
    """[batch size, median seconds, steps] per batch size a rank ran: what the fit saw."""
    by: dict[int, list[float]] = {}
    for b, t in points:
        by.setdefault(b, []).append(t)
    return [[b, sorted(ts)[len(ts) // 2], len(ts)] for b, ts in sorted(by.items())]


def rebalance(loader, batch_sizes, why: dict | None) -> None:
    """``Loader.rebalance``: the feed deals the rest of the epoch again from the consumer's position
    (EpochFeed.rebalance: every sample still once per epoch, equal steps, exact resume), a live
    iterator makes its batches again from there (``redealt``), and the log records it."""
    if loader._closed:
        raise RuntimeError("Loader is closed; create a new one (state_dict/load_state_dict to resume)")
    pos = loader._pos
    loader.feed.reset(pos)  # the feed runs ahead of the consumer while iterating
    before = loader.feed.job().batch_sizes
    try:
        loader.feed.rebalance(batch_sizes)
    finally:
        loader._pos = loader.feed.get_state()
    loader._rebalances += 1
    if loader._cache is not None:
        loader._cache.moved(loader._pos)
    loader._balance_log = loader._balance_log or BalanceLog()
    loader._balance_log.record(pos, before, loader.batch_sizes(), why)


def redealt(loader, feed, make):
    """``make(feed)``'s (item, columns, info), made again from the consumer's position after each
    rebalance: what was read ahead for the old deal (a read-ahead thread's batch, the workers'
    batches in flight, which the next source drains) is dropped; the workers keep running."""
    while True:
        seen = loader._rebalances
        source = make(feed)
        for got in source:
            yield got
            if loader._rebalances != seen:
                break
        else:
            return
        source.close()
        feed.reset(loader._pos)
