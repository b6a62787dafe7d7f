"""MixtureStreamFeed: a growing (follow=True) source mixed with fixed replay sources.

A Mixture with one ``follow=True`` source reads as one stream (epoch 0),
like a followed dataset alone (follow.py), with the same contract (reset /
next / get_state / lookahead / ready). Everything is a pure function of the
commit log's prefix, the weights and the seed:

- Every full global batch (``G`` = all ranks' batch sizes summed) takes
  ``c = apportion(G, weights)`` samples per source, the same ``c`` for every
  batch: ``c[s]`` new samples of the stream (its next ones, in commit order,
  each exactly once) and ``c[i]`` of each fixed source ``i`` (its next
  positions in its own endless walk of permutations, as in an epoch
  mixture, so a fixed source repeats only after all its samples came). The
  batch's ``G`` items are interleaved evenly (Sainte-Lague, ``interleave``),
  the stream's samples permuted among themselves by (seed, first id) unless
  the source's order is ``none``; rank ``r`` takes its contiguous slice.
- A global batch is formed once its ``c[s]`` stream samples are published.
- The end of the stream is its end commit: the ``n < c[s]`` stream samples
  left form one last short step of stream samples only (no fixed ones),
  split by ``tail_shares`` like a followed stream's tail (padding of at
  most world_size-1 when ``n`` < world size); ``drop_last`` drops it. Every
  rank then stops at the same step.
- State: step, the job's start (``base`` in the stream, ``fixed`` positions
  of the fixed sources, ``base_step``), the consumed positions after the
  step (``watermark.samples``, ``fixed_at``), the per-batch ``counts``. A
  state loaded by another world size / batch sizes starts a new job at the
  consumed positions (with that job's own ``c``), so nothing is lost or
  repeated.

Sample ids are ids of the Mixture's combined index, where the stream's
shards come last (the fixed sources keep their ids while the stream grows);
``MixtureFollowMaker`` regrows a worker's index when an id is past it.
"""

from __future__ import annotations

import numpy as np

from shardfeed.formats.errors import ShardError
from shardfeed.loader.feed import STATE_VERSION, Feed, Upcoming, WorkItem
from shardfeed.loader.follow import _Log, check_stream_state, tail_shares
from shardfeed.loader.mixture_feed import MixturePlan, interleave
from shardfeed.loader.schedule import BatchSchedule, Stage
from shardfeed.loader.state_checks import (
    check_batch_sizes,
    check_header,
    check_ints,
    check_same_content,
    check_same_data,
    check_stream_position,
)
from shardfeed.shuffling.spec import Job

_LOOKAHEAD_STEPS = 1024


class StreamMixPlan:
    """One rank's positions of one job -> combined ids. Plain data (pickled to workers)."""

    def __init__(self, specs, offsets, counts, stream: int, base: int, fixed, batch_sizes, rank: int, seed: int,
                 shuffle: bool, full: int | None = None, tail: int = 0):
        self.offsets, self.counts, self.stream = list(offsets), list(counts), int(stream)
        self.base, self.fixed = int(base), list(fixed)
        self.batch_sizes, self.rank = tuple(batch_sizes), int(rank)
        self.seed, self.shuffle = int(seed), bool(shuffle)
        self.G, self.bs, self.pre = sum(self.batch_sizes), self.batch_sizes[rank], sum(self.batch_sizes[:rank])
        self.per = self.counts[self.stream]
        self.full, self.tail = full, int(tail)
        self.shares = tail_shares(self.tail, self.batch_sizes) if self.tail else None
        self._walk = MixturePlan(specs, offsets, counts, [0] * len(counts), None)  # fixed sources' own orders
        self._layout = interleave(self.counts, 0, self.G)
        self._last: tuple[int, np.ndarray] | None = None

    def _perm(self, first: int, n: int) -> np.ndarray | None:
        if not self.shuffle or n <= 1:
            return None
        return np.random.default_rng([self.seed, first]).permutation(n)

    def global_batch(self, g: int) -> np.ndarray:
        """The ``G`` combined ids of full global batch ``g`` of this job, in deal order."""
        if self._last is not None and self._last[0] == g:
            return self._last[1]
        src, k = self._layout
        ids = np.empty(self.G, np.int64)
        for i, c in enumerate(self.counts):
            if c == 0:
                continue
            sel = src == i
            if i == self.stream:
                first = self.base + g * c
                perm = self._perm(first, c)
                ids[sel] = self.offsets[i] + first + (perm[k[sel]] if perm is not None else k[sel])
            else:
                p0 = self.fixed[i] + g * c
                ids[sel] = self.offsets[i] + self._walk.source_ids(i, p0, p0 + c)[k[sel]]
        self._last = (g, ids)
        return ids

    def positions(self, start: int, stop: int) -> np.ndarray:
        out = np.empty(max(0, stop - start), np.int64)
        k, i = start, 0
        while k < stop:
            g, j = divmod(k, self.bs)
            if self.full is not None and g >= self.full:  # the tail: stream samples only
                first = self.base + self.full * self.per
                lo, n = self.shares[self.rank]
                m = min(stop - k, max(n, 1) - j)
                q = np.arange(lo + j, lo + j + m, dtype=np.int64) if n else np.full(m, self.rank % self.tail, np.int64)
                perm = self._perm(first, self.tail)
                out[i:i + m] = self.offsets[self.stream] + first + (perm[q] if perm is not None else q)
            else:
                m = min(stop - k, self.bs - j)
                out[i:i + m] = self.global_batch(g)[self.pre + j:self.pre + j + m]
            k += m
            i += m
        return out

    def __getstate__(self):
        return {**self.__dict__, "_last": None}


class MixtureStreamFeed(Feed):
    """This rank's steps over a Mixture with a followed source (see the module docstring)."""

    kind = "mixture-stream"

    def __init__(self, mixture, schedule: BatchSchedule, rank: int, world_size: int,
                 ranks_per_node: int | None = None):
        self.mixture = mixture
        src = mixture.sources[mixture.stream]
        self.root, self.poll_s, self.idle_timeout_s = src.index.root, src.poll_s, src.idle_timeout_s
        self.seed, self.shuffle = src.seed, src.order.value != "none"
        self.schedule = schedule
        self.rank, self.world_size, self.ranks_per_node = rank, world_size, ranks_per_node
        self.drop_last = mixture.drop_last
        self.fingerprint = mixture.fingerprint()
        self.identity = mixture.identity()  # the fixed sources' digests (the stream's is its log's)
        self.log = _Log(self.root)
        self.epoch = 0
        m = len(mixture.sources)
        self.step, self.base, self.fixed, self.base_step, self.done = 0, 0, [0] * m, 0, False
        self._plan: StreamMixPlan | None = None
        self.counts()  # check the batch sizes and weights now

    # -- job and stage: the stream is one "epoch" -------------------------
    def stage(self, epoch: int | None = None) -> Stage:
        return self.schedule.at(0)

    def job(self, epoch: int | None = None) -> Job:
        w = self.world_size
        stage = self.stage()
        return Job(w, tuple(stage.rank_batch(r, w) for r in range(w)), self.ranks_per_node)

    def batch_size(self, epoch: int | None = None) -> int:
        return self.job().batch_size(self.rank)

    def counts(self) -> list[int]:
        """Samples of each source in every full global batch."""
        G = sum(self.job().batch_sizes)
        c = self.mixture.batch_counts(G)
        if c[self.mixture.stream] < 1:
            raise ValueError(f"weights {self.mixture.weights_at(0)} give the followed source "
                             f"{self.root} no sample of a global batch of {G}; raise its weight or the batch size")
        return c

    def steps(self, epoch: int | None = None, history=None) -> int:
        raise TypeError(f"{self.root}: a mixture with a followed source has no length (it grows until its end "
                        "commit); count steps as they come")

    __len__ = steps

    def set_epoch(self, epoch: int) -> None:
        if epoch != 0:
            raise ValueError(f"a mixture with a followed source ({self.root}) is one stream (epoch 0); "
                             f"set_epoch({epoch!r}) has no meaning for it")

    def next_epoch(self) -> None:
        self.done = True

    def padded(self, epoch: int | None = None) -> int:
        """Padding of the tail (known once the stream ended and the tail was formed)."""
        p = self._plan
        if p is None or not p.tail:
            return 0
        return max(0, self.world_size - p.tail)

    def plan(self, full: int | None = None, tail: int = 0) -> StreamMixPlan:
        p, sizes = self._plan, self.job().batch_sizes
        if (p is None or p.base != self.base or p.fixed != self.fixed or p.batch_sizes != sizes
                or p.full != full or p.tail != tail):
            mx = self.mixture
            self._plan = StreamMixPlan(mx.specs(), mx.offsets(), self.counts(), mx.stream, self.base, self.fixed,
                                       sizes, self.rank, self.seed, self.shuffle, full, tail)
        return self._plan

    # -- the contract ------------------------------------------------------
    def next(self) -> WorkItem:
        if self.done:
            raise StopIteration
        per, bs = self.counts()[self.mixture.stream], self.batch_size()
        g = self.step - self.base_step
        need = self.base + (g + 1) * per
        self.log.wait(need, self.step, self.poll_s, self.idle_timeout_s)
        if self.log.total >= need:
            plan, start, stop = self.plan(), g * bs, (g + 1) * bs
        else:  # ended: the short last step of stream samples, or nothing
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
        if self.done or self.log.end is not None:
            return True
        need = self.base + (self.step - self.base_step + 1) * self.counts()[self.mixture.stream]
        if self.log.total < need:
            self.log.poll()
        return self.log.total >= need or self.log.end is not None

    def consumed(self) -> tuple[int, list[int]]:
        """(stream samples, each fixed source's walk position) all ranks have taken."""
        c = self.counts()
        per, s = c[self.mixture.stream], self.mixture.stream
        g = self.step - self.base_step
        if self.log.end is not None and g > (self.log.total - self.base) // per:  # the tail was taken
            g -= 1
            stream = self.log.total
        else:
            stream = self.base + g * per
        fixed = [0 if i == s else f + g * ci for i, (f, ci) in enumerate(zip(self.fixed, c))]
        return stream, fixed

    def get_state(self) -> dict:
        stream, fixed = self.consumed()
        job = self.job()
        return {"version": STATE_VERSION, "kind": self.kind, "epoch": 0, "step": self.step, "base": self.base,
                "fixed": list(self.fixed), "base_step": self.base_step, "world_size": job.world_size,
                "batch_sizes": list(job.batch_sizes), "counts": self.counts(), "done": self.done,
                "watermark": {"samples": stream, "seq": self.log.seq_at(stream)}, "fixed_at": fixed,
                "dataset": dict(self.fingerprint), "data": {**self.identity, "stream": self.log.identity}}

    def reset(self, state: dict | None = None) -> None:
        """Go to ``state`` (this or another world size / batch sizes), or to the stream's start."""
        m = len(self.mixture.sources)
        if state is None:
            self.step, self.base, self.fixed, self.base_step, self.done = 0, 0, [0] * m, 0, False
            return
        s = check_state(state, self.fingerprint, m, self.identity)
        self._check_position(s)
        if s["world_size"] == self.world_size and tuple(s["batch_sizes"]) == self.job().batch_sizes:
            self.step, self.base, self.fixed = s["step"], s["base"], list(s["fixed"])
            self.base_step, self.done = s["base_step"], s["done"]
            return
        # another job: it starts at the positions the saved one had consumed
        self.step, self.base, self.fixed = s["step"], s["watermark"]["samples"], list(s["fixed_at"])
        self.base_step, self.done = s["step"], s["done"]
        if self.base > self.log.total:
            self.log.poll()
        if self.log.end is not None and self.base >= self.log.total:
            self.done = True

    def _check_position(self, s: dict) -> None:
        """The saved stream position lies in what the stream published, and the fixed
        sources' positions agree with it (ValueError otherwise)."""
        mx, i_s = self.mixture, self.mixture.stream
        counts = mx.batch_counts(sum(s["batch_sizes"]))
        if s["counts"] != counts:
            raise ValueError(f"state['counts']={s['counts']} but the weights give {counts} for its global batch "
                             f"of {sum(s['batch_sizes'])}; resume with the same weights")
        check_stream_state(s, self.log, self.drop_last, lambda sizes: counts[i_s])
        g = s["step"] - s["base_step"]
        if s["watermark"]["samples"] == self.log.total and g == (self.log.total - s["base"]) // counts[i_s] + 1:
            g -= 1  # the tail (stream samples only) was taken
        want = [0 if i == i_s else f + g * c for i, (f, c) in enumerate(zip(s["fixed"], counts))]
        if s["fixed_at"] != want or s["fixed"][i_s] != 0:
            raise ValueError(f"state['fixed_at']={s['fixed_at']} does not match its step {s['step']} (the saved "
                             f"job had consumed {want}); the state was edited or belongs to other data")

    def lookahead(self, k: int, epochs: int = 1) -> list[Upcoming]:
        """Up to ``k`` shards of the combined index this rank reads next (published batches only)."""
        out: list[Upcoming] = []
        seen: set[int] = set()
        if self.done:
            return out
        bs, per = self.batch_size(), self.counts()[self.mixture.stream]
        g0 = self.step - self.base_step
        full = (self.log.total - self.base) // per
        offsets = self.mixture.index.offsets
        plan = self.plan()
        for g in range(g0, min(full, g0 + _LOOKAHEAD_STEPS)):
            ids = plan.positions(g * bs, (g + 1) * bs)
            ids = ids[ids < offsets[-1]]  # stream shards past the index this process knows are not listed
            for sh in dict.fromkeys((np.searchsorted(offsets, ids, side="right") - 1).tolist()):
                if sh not in seen:
                    seen.add(sh)
                    out.append(Upcoming(int(sh), 0, self.base_step + g))
                    if len(out) >= k:
                        return out
        return out

    def __repr__(self) -> str:
        return (f"MixtureStreamFeed({self.root!r}, rank={self.rank}/{self.world_size}, step={self.step}, "
                f"published={self.log.total}, ended={self.log.end is not None})")


def check_state(state: dict, fingerprint: dict, sources: int, identity: dict | None = None) -> dict:
    """Validate a stream mixture's state; ValueError naming the mismatch and the fix."""
    check_header(state, MixtureStreamFeed.kind,
                 "resume a Mixture with a followed source from such a Mixture's Loader state")
    check_ints(state, {"step": 0, "base": 0, "base_step": 0, "world_size": 1})
    for key in ("fixed", "fixed_at", "counts"):
        v = state.get(key)
        if not isinstance(v, list) or len(v) != sources or not all(isinstance(x, int) and x >= 0 for x in v):
            raise ValueError(f"state[{key!r}]={v!r} must list one int >= 0 per source ({sources})")
    check_batch_sizes(state)
    check_stream_position(state)
    check_same_data(state, fingerprint, "open the same sources with the same weights, seeds and shuffles")
    check_same_content(state, {**(identity or {}), "stream": None}, "this Mixture's sources",
                       "open the same sources to resume")
    return state


class MixtureFollowMaker:
    """A worker's BatchMaker for a Mixture with a followed source: an id past
    the combined index it knows makes it rebuild the index with the stream's
    grown one (the feed deals only published ids)."""

    def __init__(self, maker, mixture):
        self.maker, self.mixture = maker, mixture

    @property
    def reader(self):
        return self.maker.reader

    def make(self, ids, image_size=None, alloc=None):
        ids = np.asarray(ids, np.int64)
        if ids.size and int(ids.max()) >= self.maker.reader.index.num_samples:
            index = self.mixture.grown_index()
            if int(ids.max()) >= index.num_samples:
                root = self.mixture.sources[self.mixture.stream].index.root
                raise ShardError(root, f"combined sample {int(ids.max())} is not published ({index.num_samples} "
                                       "samples in the mixture's index): the stream's log lost commits?")
            self.maker.reader.update_index(index)
        return self.maker.make(ids, image_size, alloc)

    def close(self) -> None:
        self.maker.close()
