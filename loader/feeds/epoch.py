"""EpochFeed: this rank's steps over the epochs of a fixed dataset.

Each epoch's plan comes from shuffling (``PlanSpec.plan``: the order, the
seed, the job and the elastic history); the feed walks it in steps of this
rank's batch size. Position: (epoch, step, history), see ``EpochFeed``.
"""

from __future__ import annotations

import numpy as np

from shardfeed.loader.feeds.base import AuditSources, Feed, Upcoming, WorkItem, check_epoch
from shardfeed.loader.schedule import BatchSchedule
from shardfeed.loader.state_checks import VERSION as STATE_VERSION
from shardfeed.loader.state_checks import (
    check_batch_sizes,
    check_header,
    check_ints,
    check_same_content,
    check_same_data,
    out_of_range,
)
from shardfeed.shuffling import EpochPlan
from shardfeed.shuffling.spec import Job, PlanSpec

_LOOKAHEAD_POSITIONS = 1 << 22  # positions one lookahead call may scan (bounds its cost)
_LOOKAHEAD_CHUNK = 1 << 16


class EpochFeed(Feed):
    """This rank's steps over the epochs of a fixed dataset.

    spec: what is shuffled (shuffling.PlanSpec); schedule: batch and image
    size by epoch; rank / world_size / ranks_per_node: this process's place;
    fingerprint: plain data naming the dataset's shape and shuffle; identity:
    the data's content (``{"digest": ...}`` of the index); both are checked on
    reset, so a state is never applied to other data.

    Position: (epoch, step, history). ``history`` lists the earlier jobs of
    this epoch when the world size or batch sizes changed midway (elastic
    resume), oldest first, as (Job, consumed per rank).
    """

    kind = "epoch"
    knows_near = True

    def __init__(self, spec: PlanSpec, schedule: BatchSchedule, rank: int, world_size: int,
                 ranks_per_node: int | None = None, fingerprint: dict | None = None, epoch: int = 0,
                 identity: dict | None = None, name: str = "dataset"):
        super().__init__(schedule, rank, world_size, ranks_per_node)
        self.spec, self.name = spec, str(name)
        self.identity = dict(identity or {})
        self._valid: set = set()  # (epoch, history) whose saved consumed counts were checked
        self.fingerprint = dict(fingerprint or {})
        self.epoch, self.step, self.history = int(epoch), 0, ()
        self._plans: dict = {}  # (epoch, job, history) -> plan: the current epoch's and the next one's
        self._steps: tuple | None = None  # see _epoch_steps
        self.job(self.epoch)  # check the batch sizes against the world size now

    # -- the plan of an epoch --------------------------------------------
    def plan(self, epoch: int | None = None, history=None) -> EpochPlan:
        epoch = self.epoch if epoch is None else epoch
        history = self.history if history is None else history
        job = self.job(epoch)
        key = (epoch, job, history)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= 2:  # two: a lookahead across an epoch's end asks for both in turn
                self._plans.pop(next(iter(self._plans)))
            plan = self._plans[key] = self.spec.plan(epoch, job, self.rank, history)
        return plan

    def steps(self, epoch: int | None = None, history=None) -> int:
        """Steps of ``epoch`` (default: the current one, after its resizes)."""
        return self.plan(epoch, history).steps(self.batch_size(epoch))

    # -- the contract -------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Go to the start of ``epoch``; a no-op for the current one (keeps a resumed position)."""
        epoch = check_epoch(epoch)
        if epoch != self.epoch:
            self.epoch, self.step, self.history = epoch, 0, ()

    def next_epoch(self) -> None:
        """Move past a finished epoch."""
        self.epoch, self.step, self.history = self.epoch + 1, 0, ()

    def _epoch_steps(self) -> tuple:
        """(epoch, history, plan, stage, batch size, steps, samples) of the current
        epoch and history: next() needs all of them every step, and rebuilding
        them (a plan looked up by a key of Jobs, the batch size, the step count)
        cost several us a step."""
        c = self._steps
        if c is None or c[0] != self.epoch or c[1] is not self.history:
            plan = self.plan()
            stage, job = self._stage_job(self.epoch)
            bs = job.batch_size(self.rank)
            c = self._steps = (self.epoch, self.history, plan, stage, bs, plan.steps(bs), plan.num_samples)
        return c

    def next(self) -> WorkItem:
        _, _, plan, stage, bs, steps, samples = self._epoch_steps()
        s = self.step
        if s >= steps:
            raise StopIteration
        self.step = s + 1
        return WorkItem(self.epoch, s, plan, s * bs, min(samples, (s + 1) * bs), stage, self.get_state())

    def get_state(self) -> dict:
        job = self.job()
        return {
            "version": STATE_VERSION, "kind": self.kind, "epoch": self.epoch, "step": self.step,
            "world_size": job.world_size, "batch_sizes": list(job.batch_sizes),
            "history": [[j.world_size, list(j.batch_sizes), [int(c) for c in consumed]] for j, consumed in self.history]
            if self.history else [],
            "dataset": dict(self.fingerprint), "data": dict(self.identity),
        } | ({"balanced": b} if (b := self.balanced_state()) is not None else {})

    def rebalance(self, batch_sizes) -> None:
        """Per-rank ``batch_sizes`` (one per rank; None: the schedule's) from this step on, every
        rank passing the same at the same step. The rest of the epoch is dealt again from the
        consumed position exactly as an elastic resume deals it (the current job and what each
        of its ranks consumed join the history); at a job's first step nothing is consumed, so
        the new job simply deals what the history left. The sizes hold in later epochs while the
        schedule stays at this epoch's stage."""
        old = self.job()
        if batch_sizes is None:
            self._set_balanced(None, None)
        else:
            new = Job(self.world_size, _sizes(batch_sizes, self.world_size), self.ranks_per_node)
            self._set_balanced(self.epoch, new.batch_sizes)
        if self.job().batch_sizes == old.batch_sizes or self.step == 0:
            return
        self._rejob({"epoch": self.epoch, "_history": self.history, "world_size": old.world_size,
                     "batch_sizes": list(old.batch_sizes), "step": self.step})

    def _set_balanced(self, since, sizes) -> None:
        super()._set_balanced(since, sizes)
        self._steps = None  # the job of the cached epoch may have changed

    def _start(self) -> None:
        self.step, self.history = 0, ()

    def _checked(self, state: dict) -> dict:
        s = dict(check_state(state, self.fingerprint, self.identity))  # a copy: it gains "_history"
        epoch = s["epoch"]
        s["_history"] = history = tuple((Job(w, tuple(b), self.ranks_per_node), tuple(c)) for w, b, c in s["history"])
        self._check_history(epoch, history)
        job = self.job(epoch)
        old = Job(s["world_size"], tuple(s["batch_sizes"]), self.ranks_per_node)
        same = old.world_size == job.world_size and old.batch_sizes == job.batch_sizes
        steps = self.steps(epoch, history) if same else self.spec.plan(epoch, old, 0, history).steps(old.batch_size(0))
        if s["step"] > steps:
            raise out_of_range("step", s["step"], 0, steps, f"epoch {epoch} of the saved job "
                               f"({old.world_size} rank(s), batch sizes {list(old.batch_sizes)}: {steps} steps)")
        return s

    def _restore(self, s: dict) -> None:
        self.epoch, self.step, self.history = s["epoch"], s["step"], s["_history"]

    def _rejob(self, s: dict) -> None:
        """Another world size or other per-rank batch sizes: an elastic re-plan of exactly
        the samples the saved job had not consumed."""
        epoch, history = s["epoch"], s["_history"]
        old = Job(s["world_size"], tuple(s["batch_sizes"]), self.ranks_per_node)
        consumed = self.spec.consumed(epoch, old, s["step"], history)
        self.epoch, self.step, self.history = epoch, 0, history + ((old, consumed),)

    def _check_history(self, epoch: int, history: tuple) -> None:
        """Each earlier job's consumed counts lie inside its ranks' shares (checked once per history)."""
        if not history or (epoch, history) in self._valid:
            return
        for i, (job, consumed) in enumerate(history):
            for r, c in enumerate(consumed):
                n = self.spec.plan(epoch, job, r, history[:i]).num_samples
                if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c <= n:
                    raise out_of_range(f"history[{i}] consumed[{r}]", c, 0, n,
                                       f"rank {r}'s share of epoch {epoch} in that job")
        self._valid.add((epoch, history))

    def lookahead(self, k: int, epochs: int = 2) -> list[Upcoming]:
        """Up to ``k`` shards in order of next use from the current position,
        each with the first step that reads it, over this and the following
        ``epochs - 1`` epochs; scans a bounded number of positions per call."""
        out: list[Upcoming] = []
        seen: set[int] = set()
        budget = _LOOKAHEAD_POSITIONS
        epoch, step, history = self.epoch, self.step, self.history
        for _ in range(max(1, epochs)):
            plan, bs = self.plan(epoch, history), self.batch_size(epoch)
            pos, end = step * bs, plan.num_samples
            offsets = plan.offsets
            while pos < end and len(out) < k and budget > 0:
                stop = min(end, pos + min(_LOOKAHEAD_CHUNK, budget))
                shards = np.searchsorted(offsets, plan.positions(pos, stop), side="right") - 1
                uniq, first = np.unique(shards, return_index=True)
                for j in np.argsort(first, kind="stable"):
                    s = int(uniq[j])
                    if s not in seen:
                        seen.add(s)
                        out.append(Upcoming(s, epoch, (pos + int(first[j])) // bs))
                        if len(out) == k:
                            break
                budget -= stop - pos
                pos = stop
            if len(out) >= k or budget <= 0:
                break
            epoch, step, history = epoch + 1, 0, ()
        return out

    def near(self, steps: int, skip: int = 0) -> list[tuple[int, int, int, np.ndarray]]:
        """The samples of this rank's next ``steps`` steps from the current position, crossing
        into the next epoch at the end of this one (its plan is a pure function of the seed
        and the epoch, so a prefetcher can bring its first steps while this one ends): a list
        of ``(epoch, first step, batch size, sample ids)``, one per epoch touched. ``skip``:
        start that many steps later, at most at this epoch's end (the steps a Loader's workers are
        reading already: they do not read past the epoch). A caller
        that goes elsewhere (``set_epoch`` to another epoch) only wasted the prefetch."""
        out = []
        epoch, step, history, left = self.epoch, self.step + max(0, int(skip)), self.history, int(steps)
        for k in range(2):
            try:
                plan, bs = self.plan(epoch, history), self.batch_size(epoch)
            except ValueError:
                if not k:
                    raise
                break  # the next epoch's job is not valid (a schedule's): that epoch says so when it starts
            start, stop = step * bs, min(plan.num_samples, (step + left) * bs)
            if stop > start and bs > 0:
                out.append((epoch, step, bs, plan.positions(start, stop)))
                left -= -(-(stop - start) // bs)
            if left <= 0:
                break
            epoch, step, history = epoch + 1, 0, ()
        return out

    # -- the audit ------------------------------------------------------------
    def audit_sources(self) -> AuditSources:
        return AuditSources([self.name], [self.spec.num_samples])

    def audit_expect(self, item: WorkItem) -> dict:
        """The whole epoch's samples (a re-planned plan holds only the rest), and the padding every
        job of the epoch's history may have repeated (its deal's padding, a bound) besides the last one's."""
        plan = item.plan
        unique = self.spec.num_samples - plan.dropped
        padded = plan.padded
        hist = tuple((Job(w, tuple(b), self.ranks_per_node), tuple(c)) for w, b, c in item.state.get("history") or ())
        for i, (job, _) in enumerate(hist):
            padded += self.spec.plan(item.epoch, job, 0, hist[:i]).padded
        return {"delivered": [unique], "unique": [unique], "padded": padded}

    def __repr__(self) -> str:
        return (f"EpochFeed(rank={self.rank}/{self.world_size}, epoch={self.epoch}, step={self.step}, "
                f"resizes={len(self.history)})")


def _sizes(batch_sizes, world_size: int) -> tuple[int, ...]:
    if not isinstance(batch_sizes, (list, tuple)):
        raise TypeError(f"rebalance takes one batch size per rank (a list of {world_size} ints), got {batch_sizes!r}")
    if len(batch_sizes) != world_size:
        raise ValueError(f"rebalance got {len(batch_sizes)} batch sizes for world_size={world_size}; pass one per "
                         "rank, the same list on every rank")
    return tuple(batch_sizes)


def check_state(state: dict, fingerprint: dict, identity: dict | None = None) -> dict:
    """Validate an epoch feed's state against this dataset; ValueError naming the mismatch and the fix."""
    check_header(state, "epoch", "resume a dataset from a Loader state of the same kind of dataset")
    check_ints(state, {"epoch": 0, "step": 0, "world_size": 1})
    check_batch_sizes(state)
    hist = state.get("history")
    if not isinstance(hist, list) or not all(
            isinstance(h, list) and len(h) == 3 and isinstance(h[0], int) and h[0] >= 1 and isinstance(h[1], list)
            and len(h[1]) == h[0] and isinstance(h[2], list) and len(h[2]) == h[0] for h in hist):
        raise ValueError(f"state['history']={hist!r} must be a list of [world_size, batch_sizes, consumed], "
                         "one batch size and one consumed count per rank of each earlier job")
    check_same_data(state, fingerprint, "open the same dataset with the same shuffle, seed and drop_last to resume")
    check_same_content(state, identity or {}, "this dataset", "resume from a state saved for this dataset")
    return state
