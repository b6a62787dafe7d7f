"""MixtureFeed: this rank's steps over several datasets mixed with exact counts.

A sibling of feed.EpochFeed (same contract: reset / next / get_state /
lookahead). Everything is a pure function of (sources, counts, seed, epoch,
job), so ranks agree without messages and resume is exact:

- Epoch ``e`` takes ``counts[i]`` samples of source ``i`` (mixture.py
  apportions them). Source ``i`` is read as an endless stream: its own
  permutation of source-epoch 0, then of source-epoch 1, ... (the source's
  PlanSpec at world size 1); mixture epoch ``e`` takes the stream's
  positions ``[C_i(e), C_i(e) + counts[i])`` where ``C_i(e)`` sums the
  counts of the earlier epochs. A source with fewer samples than its count
  is repeated (the next source-epoch has a fresh permutation); one with more
  is sub-sampled, and the next epoch continues where this one stopped, so
  every sample comes before any repeats.
- The epoch's global stream of ``N = sum(counts)`` positions interleaves the
  sources by Webster / Sainte-Lague apportionment: the k-th item of source
  ``i`` sorts at ``(2k+1) / counts[i]`` (ties: lower source first). Every
  prefix of length ``t`` holds ``t * counts[i] / N`` items of source ``i``
  within +-1 per source, so no source comes in runs. An item's position has
  a closed form (``_ranks``), so a range of positions is computed without
  materialising the epoch.
- The stream is dealt to ranks like the follow feed's global batches:
  global batch ``g`` is positions ``[g*G, (g+1)*G)`` with ``G`` the sum of
  the batch sizes, rank ``r`` takes its slice; the last short batch is split
  in proportion to the batch sizes (ranks past a tail smaller than the world
  size repeat one tail sample: padding of at most world_size-1), dropped
  with ``drop_last``. All ranks take the same steps.
- Elastic resume: the ranks step together, so after ``s`` steps the job has
  consumed the first ``s * G`` positions; another world size deals the rest
  from there.

Sample ids handed to the worker are ids of the Mixture's combined index (the
sources' shards one after another), so one BatchMaker reads every source:
no per-batch encoding or regrouping.
"""

from __future__ import annotations

import numpy as np

from shardfeed.loader.feed import STATE_VERSION, Feed, Upcoming, WorkItem
from shardfeed.loader.follow import StreamPlan
from shardfeed.loader.schedule import BatchSchedule, Stage
from shardfeed.loader.state_checks import (
    check_batch_sizes,
    check_header,
    check_ints,
    check_same_content,
    check_same_data,
    out_of_range,
)
from shardfeed.shuffling.spec import Job

MAX_EPOCH_SAMPLES = 1 << 32  # keeps the exact rank arithmetic inside int64
_LOOKAHEAD_STEPS = 4096


def _ranks(counts: list[int], i: int, k: np.ndarray) -> np.ndarray:
    """Global positions of items ``k`` of source ``i`` in the interleaved epoch."""
    ci = counts[i]
    two_k1 = 2 * k + 1
    pos = k.copy()
    for j, cj in enumerate(counts):
        if j == i or cj == 0:
            continue
        num = two_k1 * cj - ci
        if j < i:  # items of j with key <= ours come first
            c = num // (2 * ci) + 1
        else:      # strictly smaller keys only
            c = -((-num) // (2 * ci))
        pos += np.clip(c, 0, cj)
    return pos


def interleave(counts: list[int], a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """(source, k) of the epoch's positions [a, b): position t is item k of source[t]."""
    n = sum(counts)
    m = len(counts)
    src = np.full(b - a, -1, np.int64)
    kk = np.empty(b - a, np.int64)
    for i, ci in enumerate(counts):
        if ci == 0:
            continue
        lo = max(0, a * ci // n - m - 2)
        hi = min(ci, -(-b * ci // n) + m + 2)
        if lo >= hi:
            continue
        k = np.arange(lo, hi, dtype=np.int64)
        pos = _ranks(counts, i, k)
        sel = (pos >= a) & (pos < b)
        src[pos[sel] - a] = i
        kk[pos[sel] - a] = k[sel]
    if (src < 0).any():  # the window bound is a theorem; a guard, never silent
        raise RuntimeError(f"interleave of counts {counts} left positions of [{a}, {b}) unfilled")
    return src, kk


class MixturePlan:
    """One rank's positions of one job of a mixed epoch -> combined sample ids.
    Plain data (pickled once to each worker)."""

    def __init__(self, specs, offsets, counts, starts, deal: StreamPlan):
        self.specs = specs            # PlanSpec per source (its own order and seed)
        self.offsets = list(offsets)  # first combined id of each source
        self.counts = list(counts)    # samples of each source this epoch
        self.starts = list(starts)    # each source's stream position at the epoch's start
        self.deal = deal
        self.num_samples = sum(self.counts)
        self._plans: dict = {}

    def _source_plan(self, i: int, q: int):
        key = (i, q)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) > 2 * len(self.specs):
                self._plans.clear()
            plan = self._plans[key] = self.specs[i].plan(q, Job(1), 0)
        return plan

    def source_ids(self, i: int, p0: int, p1: int) -> np.ndarray:
        """Ids (in source i) of its stream positions [p0, p1)."""
        n = self.specs[i].num_samples
        out = []
        p = p0
        while p < p1:
            q, r = divmod(p, n)
            m = min(p1 - p, n - r)
            out.append(self._source_plan(i, q).positions(r, r + m))
            p += m
        return np.concatenate(out) if out else np.empty(0, np.int64)

    def stream(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, id in source) of the epoch's stream positions ``t``."""
        if t.size == 0:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        lo, hi = int(t.min()), int(t.max()) + 1
        src_all, k_all = interleave(self.counts, lo, hi)
        src, k = src_all[t - lo], k_all[t - lo]
        ids = np.empty(t.size, np.int64)
        for i in np.unique(src).tolist():
            sel = src == i
            p = self.starts[i] + k[sel]
            p0 = int(p.min())
            ids[sel] = self.source_ids(i, p0, int(p.max()) + 1)[p - p0]
        return src, ids

    def positions(self, start: int, stop: int) -> np.ndarray:
        src, ids = self.stream(self.deal.positions(start, stop))
        return ids + np.asarray(self.offsets, np.int64)[src]

    def __getstate__(self):
        return {**self.__dict__, "_plans": {}}


class MixtureFeed(Feed):
    """This rank's steps over a Mixture (see the module docstring)."""

    kind = "mixture"

    def __init__(self, mixture, schedule: BatchSchedule, rank: int, world_size: int,
                 ranks_per_node: int | None = None, epoch: int = 0):
        self.mixture = mixture
        self.schedule = schedule
        self.rank, self.world_size, self.ranks_per_node = rank, world_size, ranks_per_node
        self.fingerprint = mixture.fingerprint()
        self.identity = mixture.identity()
        self.drop_last = mixture.drop_last
        self.epoch, self.step, self.base, self.base_step = int(epoch), 0, 0, 0
        self._plan: tuple | None = None
        self.job(self.epoch)

    # -- jobs and plans --------------------------------------------------
    def stage(self, epoch: int | None = None) -> Stage:
        return self.schedule.at(self.epoch if epoch is None else epoch)

    def job(self, epoch: int | None = None) -> Job:
        stage = self.stage(epoch)
        w = self.world_size
        return Job(w, tuple(stage.rank_batch(r, w) for r in range(w)), self.ranks_per_node)

    def batch_size(self, epoch: int | None = None) -> int:
        return self.job(epoch).batch_size(self.rank)

    def _split(self, epoch: int, base: int, sizes) -> tuple[int, int]:
        """(full global batches, tail samples) of the rest of ``epoch`` after ``base``."""
        left = self.mixture.epoch_total(epoch) - base
        G = sum(sizes)
        full, tail = divmod(left, G)
        return full, (0 if self.drop_last else tail)

    def plan(self, epoch: int | None = None, base: int | None = None) -> MixturePlan:
        epoch = self.epoch if epoch is None else epoch
        base = self.base if base is None else base
        sizes = self.job(epoch).batch_sizes
        key = (epoch, base, sizes)
        if self._plan is None or self._plan[0] != key:
            full, tail = self._split(epoch, base, sizes)
            deal = StreamPlan(base, sizes, self.rank, 0, False, full, tail)
            mx = self.mixture
            self._plan = (key, MixturePlan(mx.specs(), mx.offsets(), mx.counts_at(epoch), mx.starts_at(epoch), deal))
        return self._plan[1]

    def steps(self, epoch: int | None = None, history=None) -> int:
        """Steps of ``epoch`` from its start (history=()) or of what is left of the current job, plus the steps taken."""
        epoch = self.epoch if epoch is None else epoch
        if history == () or epoch != self.epoch:
            full, tail = self._split(epoch, 0, self.job(epoch).batch_sizes)
            return full + (tail > 0)
        full, tail = self._split(epoch, self.base, self.job(epoch).batch_sizes)
        return self.base_step + full + (tail > 0)

    def __len__(self) -> int:
        return self.steps(history=())

    def padded(self, epoch: int | None = None) -> int:
        """Positions repeated as padding in ``epoch`` (the current job's tail)."""
        epoch = self.epoch if epoch is None else epoch
        base = self.base if epoch == self.epoch else 0
        _, tail = self._split(epoch, base, self.job(epoch).batch_sizes)
        return max(0, self.world_size - tail) if tail else 0

    # -- the contract ------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ValueError(f"epoch={epoch!r} must be an int >= 0")
        if int(epoch) != self.epoch:
            self.epoch, self.step, self.base, self.base_step = int(epoch), 0, 0, 0

    def next_epoch(self) -> None:
        self.epoch, self.step, self.base, self.base_step = self.epoch + 1, 0, 0, 0

    def next(self) -> WorkItem:
        plan = self.plan()
        deal, bs = plan.deal, self.batch_size()
        g = self.step - self.base_step
        if g < deal.full:
            start, stop = g * bs, (g + 1) * bs
        elif g == deal.full and deal.tail:
            _, n = deal.shares[self.rank]
            start, stop = g * bs, g * bs + max(n, 1)
        else:
            raise StopIteration
        self.step += 1
        return WorkItem(self.epoch, self.step - 1, plan, start, stop, self.stage(), self.get_state())

    def consumed(self) -> int:
        """Positions of the epoch's stream all ranks have taken."""
        G = sum(self.job().batch_sizes)
        return min(self.mixture.epoch_total(self.epoch), self.base + (self.step - self.base_step) * G)

    def get_state(self) -> dict:
        job = self.job()
        return {"version": STATE_VERSION, "kind": self.kind, "epoch": self.epoch, "step": self.step,
                "base": self.base, "base_step": self.base_step, "world_size": job.world_size,
                "batch_sizes": list(job.batch_sizes), "counts": list(self.mixture.counts_at(self.epoch)),
                "starts": list(self.mixture.starts_at(self.epoch)), "dataset": dict(self.fingerprint),
                "data": dict(self.identity)}

    def reset(self, state: dict | None = None) -> None:
        """Go to ``state`` (this or another world size / batch sizes), or to the start of the current epoch."""
        if state is None:
            self.step, self.base, self.base_step = 0, 0, 0
            return
        s = check_state(state, self.fingerprint, self.identity, len(self.mixture.sources))
        epoch = s["epoch"]
        mx = self.mixture
        if mx.epoch_steps is not None and s["counts"] != mx.counts_at(epoch) and "starts" in s:
            # epoch_steps: the saving job's global batch sized this epoch; keep its counts and
            # positions (checked against the weights), so the rest of the epoch is exactly its rest
            if mx._counts is None and s["counts"] != apportion_like(mx, epoch, sum(s["counts"])):
                raise ValueError(f"state's epoch {epoch} mixes counts {s['counts']}, not the weights' split of "
                                 f"{sum(s['counts'])} samples; resume with the same weights")
            mx.pin_epoch(epoch, s["counts"], s["starts"])
            self._plan = None
        counts = list(mx.counts_at(epoch))
        if s["counts"] != counts:
            raise ValueError(f"state's epoch {epoch} mixes counts {s['counts']} but this Mixture gives {counts} "
                             "(weights, counts or epoch_samples changed); resume with the same mixture settings")
        job = self.job(epoch)
        total, G_old = sum(counts), sum(s["batch_sizes"])
        if s["base"] > total:
            raise out_of_range("base", s["base"], 0, total, f"epoch {epoch}'s {total} mixed samples")
        full, tail = divmod(total - s["base"], G_old)
        hi = s["base_step"] + full + (1 if tail and not self.drop_last else 0)
        if not s["base_step"] <= s["step"] <= hi:
            raise out_of_range("step", s["step"], s["base_step"], hi, f"epoch {epoch} of the saved job "
                               f"({total} mixed samples, global batch {G_old}, from position {s['base']})")
        self.epoch = epoch
        if s["world_size"] == job.world_size and list(s["batch_sizes"]) == list(job.batch_sizes):
            self.step, self.base, self.base_step = s["step"], s["base"], s["base_step"]
            return
        # another job: it deals what the saved one had not consumed
        G_old = sum(s["batch_sizes"])
        consumed = min(self.mixture.epoch_total(epoch), s["base"] + (s["step"] - s["base_step"]) * G_old)
        self.step, self.base, self.base_step = s["step"], consumed, s["step"]

    def lookahead(self, k: int, epochs: int = 2) -> list[Upcoming]:
        """Up to ``k`` shards of the combined index in order of next use (bounded scan)."""
        out: list[Upcoming] = []
        seen: set[int] = set()
        offsets = self.mixture.index.offsets
        epoch, step, base, base_step = self.epoch, self.step, self.base, self.base_step
        budget = _LOOKAHEAD_STEPS
        for _ in range(max(1, epochs)):
            plan, bs = self.plan(epoch, base), self.batch_size(epoch)
            total = plan.deal.full + (plan.deal.tail > 0)
            g = step - base_step
            while g < total and budget > 0 and len(out) < k:
                stop = (g + 1) * bs if g < plan.deal.full else g * bs + max(plan.deal.shares[self.rank][1], 1)
                shards = np.searchsorted(offsets, plan.positions(g * bs, stop), side="right") - 1
                for s in dict.fromkeys(shards.tolist()):
                    if s not in seen:
                        seen.add(s)
                        out.append(Upcoming(int(s), epoch, base_step + g))
                        if len(out) >= k:
                            return out
                g += 1
                budget -= 1
            epoch, step, base, base_step = epoch + 1, 0, 0, 0
        return out

    def __repr__(self) -> str:
        return f"MixtureFeed(rank={self.rank}/{self.world_size}, epoch={self.epoch}, step={self.step}, base={self.base})"


def apportion_like(mixture, epoch: int, total: int) -> list[int]:
    """The weights' split of ``total`` samples in ``epoch`` (what counts_at gives for that length)."""
    from shardfeed.loader.mixture import apportion

    return apportion(total, list(mixture._weights(epoch)))


def check_state(state: dict, fingerprint: dict, identity: dict | None = None, sources: int | None = None) -> dict:
    """Validate a mixture feed's state; ValueError naming the mismatch and the fix."""
    check_header(state, MixtureFeed.kind, "resume a Mixture from a Mixture Loader's state")
    check_ints(state, {"epoch": 0, "step": 0, "base": 0, "base_step": 0, "world_size": 1})
    check_batch_sizes(state)
    for key in ("counts", "starts"):
        v = state.get(key)
        if key in state or key == "counts":
            if not isinstance(v, list) or (sources is not None and len(v) != sources) or not all(
                    isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
                raise ValueError(f"state[{key!r}]={v!r} must list the epoch's int >= 0 per source")
    check_same_data(state, fingerprint, "open the same sources with the same seed, shuffle and drop_last")
    check_same_content(state, identity or {}, "this Mixture's sources", "open the same sources to resume")
    return state
