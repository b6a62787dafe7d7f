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
a worker's maker regrows its index when an id is past it (stream_log.RegrowMaker).
"""

from __future__ import annotations

import numpy as np

from shardfeed.loader.feeds.base import AuditSources, WorkItem
from shardfeed.loader.feeds.stream_feed import StreamFeed
from shardfeed.loader.feeds.stream_log import check_stream_state
from shardfeed.loader.schedule import BatchSchedule
from shardfeed.loader.state_checks import VERSION as STATE_VERSION
from shardfeed.loader.state_checks import (
    check_batch_sizes,
    check_header,
    check_ints,
    check_same_content,
    check_same_data,
    check_stream_position,
)
from shardfeed.shuffling.mixture_plans import StreamMixPlan


class MixtureStreamFeed(StreamFeed):
    """This rank's steps over a Mixture with a followed source (see the module docstring)."""

    kind = "mixture-stream"
    _lookahead_steps = 1024

    def __init__(self, mixture, schedule: BatchSchedule, rank: int, world_size: int,
                 ranks_per_node: int | None = None):
        src = mixture.sources[mixture.stream]
        root = src.index.root
        super().__init__(root, schedule, rank, world_size, ranks_per_node, src.poll_s, src.idle_timeout_s,
                         mixture.drop_last, f"{root}: a mixture with a followed source")
        self.mixture = mixture
        self.seed, self.shuffle = src.seed, src.order.value != "none"
        self.fingerprint = mixture.fingerprint()
        self.identity = mixture.identity()  # the fixed sources' digests (the stream's is its log's)
        self.fixed = [0] * len(mixture.sources)
        self.counts()  # check the batch sizes and weights now

    def counts(self) -> list[int]:
        """Samples of each source in every full global batch."""
        G = sum(self.job().batch_sizes)
        c = self.mixture.mixing.per_batch(G)
        if c[self.mixture.stream] < 1:
            raise ValueError(f"weights {self.mixture.mixing.weights_at(0)} give the followed source "
                             f"{self.root} no sample of a global batch of {G}; raise its weight or the batch size")
        return c

    # -- what a step holds ----------------------------------------------------
    def _per(self) -> int:
        return self.counts()[self.mixture.stream]

    def _full_step(self, g: int, bs: int) -> tuple:
        return self.plan(), g * bs, (g + 1) * bs

    def _step_ids(self, g: int, bs: int) -> np.ndarray:
        return self.plan().positions(g * bs, (g + 1) * bs)

    def _shard_offsets(self) -> np.ndarray:
        return self.mixture.index.offsets

    def plan(self, full: int | None = None, tail: int = 0) -> StreamMixPlan:
        p, sizes = self._plan, self.job().batch_sizes
        if (p is None or p.base != self.base or p.fixed != self.fixed or p.batch_sizes != sizes
                or p.full != full or p.tail != tail):
            mx = self.mixture
            self._plan = StreamMixPlan(mx.specs(), mx.offsets(), self.counts(), mx.stream, self.base, self.fixed,
                                       sizes, self.rank, self.seed, self.shuffle, full, tail)
        return self._plan

    def consumed(self) -> tuple[int, list[int]]:
        """(stream samples, each fixed source's walk position) all ranks have taken."""
        g, stream = self._taken()
        s = self.mixture.stream
        fixed = [0 if i == s else f + g * ci for i, (f, ci) in enumerate(zip(self.fixed, self.counts()))]
        return stream, fixed

    # -- state ------------------------------------------------------------------
    def get_state(self) -> dict:
        stream, fixed = self.consumed()
        job = self.job()
        return {"version": STATE_VERSION, "kind": self.kind, "epoch": 0, "step": self.step, "base": self.base,
                "fixed": list(self.fixed), "base_step": self.base_step, "world_size": job.world_size,
                "batch_sizes": list(job.batch_sizes), "counts": self.counts(), "done": self.done,
                "watermark": {"samples": stream, "seq": self.log.seq_at(stream)}, "fixed_at": fixed,
                "dataset": dict(self.fingerprint), "data": {**self.identity, "stream": self.log.identity}}

    def _start(self) -> None:
        super()._start()
        self.fixed = [0] * len(self.mixture.sources)

    def _checked(self, state: dict) -> dict:
        s = check_state(state, self.fingerprint, len(self.mixture.sources), self.identity)
        self._check_position(s)
        return s

    def _restore(self, s: dict) -> None:
        super()._restore(s)
        self.fixed = list(s["fixed"])

    def _rejob(self, s: dict) -> None:
        """Another job: it starts at the positions the saved one had consumed."""
        super()._rejob(s)
        self.fixed = list(s["fixed_at"])

    def _check_position(self, s: dict) -> None:
        """The saved stream position lies in what the stream published, and the fixed
        sources' positions agree with it (ValueError otherwise)."""
        i_s = self.mixture.stream
        counts = self.mixture.mixing.per_batch(sum(s["batch_sizes"]))
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

    # -- the audit ----------------------------------------------------------------
    def audit_sources(self) -> AuditSources:
        mx = self.mixture
        return AuditSources(list(mx.names), list(mx.sizes), mx.source_of, mx.stream)

    def audit_expect(self, item: WorkItem) -> dict:
        """The consumed prefix after ``item``: the stream's samples below its watermark
        once, each fixed source ``P`` deliveries of ``min(P, size)`` distinct samples."""
        st, s = item.state, self.mixture.stream
        wm = int(st["watermark"]["samples"])
        at = [wm if i == s else int(p) for i, p in enumerate(st["fixed_at"])]
        uniq = [wm if i == s else min(p, n) for i, (p, n) in enumerate(zip(at, self.mixture.sizes))]
        return {"delivered": at, "unique": uniq, "padded": self._item_padded(item)}


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
