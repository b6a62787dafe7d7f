"""FollowFeed: this rank's steps over a dataset that grows while it is read.

A StreamFeed (stream_feed.py: waiting, the end, the job's position) over one
growing dataset. Delivery is a pure function of the commit log's prefix, so
ranks agree without messages:

- The stream is every published sample in commit order (index.arrow's rows,
  then the log's shards), i.e. sample ids 0, 1, 2, ... (ids never change as
  the log grows or is compacted).
- Global batch ``g`` is the ``G = sum(batch sizes)`` stream samples
  ``[base + g*G, base + (g+1)*G)``; it is formed only once all of them are
  published. Rank ``r`` takes its ``batch_size[r]``-long slice at offset
  ``sum(batch_size[:r])`` (shuffled inside the global batch by (seed, batch
  start) unless ``shuffle="none"``). Each published sample goes to exactly
  one rank; every rank takes the same steps.
- The end of the stream is a commit (ShardWriter.end_stream). The samples
  left after the last full global batch (``n < G``) form one last short step:
  each rank gets a contiguous share in proportion to its batch size, at
  least one sample when ``n >= world_size``; only when ``n < world_size``
  do the ranks past ``n`` repeat one tail sample each (padding of at most
  world_size-1, the epoch rule). With ``drop_last=True`` the tail is not
  delivered (at most G-1 samples). Then next() raises StopIteration on every
  rank at the same step.
- Replay (``replay`` fraction, ``window`` commits), for incremental
  training: each full global batch holds ``per = G - round(replay*G)`` new
  stream samples (each new sample still comes once) and ``G - per`` older
  ones drawn from the samples before them within the last ``window``
  commits (all history when None), deterministic from (seed, the batch's
  first new id), so resume is exact. The tail carries only new samples.
- A remote dataset (``source``, a cache.log_mirror.LogMirror) is read from
  its mirror in the node cache, brought up to date before each poll: the
  same rules, the same stream (loader/remote_follow.py).
- Waiting polls the log every ``poll_s``; when no commit arrives for
  ``idle_timeout_s`` it raises ShardError naming the dataset and the wait,
  never a silent end (ranks could see a timeout differently; an end commit
  they all see alike).

State: ``{"version": 1, "kind": "follow", "epoch": 0, "step", "base",
"base_step", "world_size", "batch_sizes", "watermark": {"samples", "seq"},
"done", "dataset", "data": {"stream"}}``. ``base`` is the stream position where the current job
(world size and batch sizes) started, at total step ``base_step``; a state
loaded by another world size starts a new job at the samples consumed, so
nothing is lost or repeated. ``watermark.seq`` is the commit holding the
last consumed sample (for people and for checks).
"""

from __future__ import annotations

import numpy as np

from shardfeed.loader.feeds.base import AuditSources, WorkItem
from shardfeed.loader.feeds.stream_feed import StreamFeed
from shardfeed.loader.feeds.stream_log import IDLE_TIMEOUT_S, POLL_S, check_stream_state
from shardfeed.loader.schedule import BatchSchedule
from shardfeed.loader.state_checks import VERSION as STATE_VERSION
from shardfeed.loader.state_checks import (
    check_batch_sizes,
    check_header,
    check_ints,
    check_same_data,
    check_stream_position,
)
from shardfeed.shuffling.stream_plans import IdsPlan, StreamPlan, replay_ids


class FollowFeed(StreamFeed):
    """This rank's steps over a growing dataset (see the module docstring)."""

    kind = "follow"

    def __init__(self, root: str, schedule: BatchSchedule, rank: int, world_size: int, seed: int = 0,
                 shuffle: bool = True, drop_last: bool = False, ranks_per_node: int | None = None,
                 fingerprint: dict | None = None, poll_s: float = POLL_S, idle_timeout_s: float = IDLE_TIMEOUT_S,
                 replay: float = 0.0, window: int | None = None, source=None):
        if not poll_s > 0 or not idle_timeout_s > 0:
            raise ValueError(f"poll_s={poll_s!r} and idle_timeout_s={idle_timeout_s!r} must be > 0 seconds")
        if isinstance(replay, bool) or not isinstance(replay, (int, float)) or not 0 <= replay < 1:
            raise ValueError(f"replay={replay!r} must be a fraction in [0, 1): the share of each global batch "
                             "drawn from older samples")
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ValueError(f"window={window!r} must be None (all history) or an int >= 1 (commits)")
        super().__init__(root, schedule, rank, world_size, ranks_per_node, float(poll_s), float(idle_timeout_s),
                         drop_last, f"{root}: a followed dataset", source)
        self.seed, self.shuffle = int(seed), bool(shuffle)
        self.fingerprint = dict(fingerprint or {})
        self.replay, self.window = float(replay), window
        self.job()  # check the batch sizes against the world size now

    # -- what a step holds ----------------------------------------------------
    def _sizes(self) -> tuple[int, ...]:
        return self.job().batch_sizes

    def _per(self) -> int:
        """New stream samples per full global batch: G less the replayed ones."""
        return per_of(self._sizes(), self.replay)

    def _replay_ids(self, g: int) -> np.ndarray:
        return replay_ids(self.base, g, self._per(), self._sizes(), self.rank, self.seed, self.shuffle,
                          self.log.offsets, self.window)

    def _full_step(self, g: int, bs: int) -> tuple:
        if self.replay:
            return IdsPlan(self._replay_ids(g)), 0, bs
        return self.plan(), g * bs, (g + 1) * bs

    def _step_ids(self, g: int, bs: int) -> np.ndarray:
        return self._replay_ids(g) if self.replay else self.plan().positions(g * bs, (g + 1) * bs)

    def _shard_offsets(self) -> np.ndarray:
        return self.log.offsets

    def plan(self, full: int | None = None, tail: int = 0) -> StreamPlan:
        p = self._plan
        if (p is None or p.base != self.base or p.batch_sizes != self._sizes() or p.full != full
                or p.tail != tail):
            self._plan = StreamPlan(self.base, self._sizes(), self.rank, self.seed, self.shuffle, full, tail,
                                    self._per())
        return self._plan

    # -- state ------------------------------------------------------------------
    def get_state(self) -> dict:
        _, consumed = self._taken()
        return {
            "version": STATE_VERSION, "kind": self.kind, "epoch": 0, "step": self.step,
            "base": self.base, "base_step": self.base_step, "world_size": self.world_size,
            "batch_sizes": list(self._sizes()), "done": self.done,
            "watermark": {"samples": consumed, "seq": self.log.seq_at(consumed)},
            "dataset": dict(self.fingerprint), "data": {"stream": self.log.identity},
        }

    def _checked(self, state: dict) -> dict:
        s = check_state(state, self.fingerprint)
        check_stream_state(s, self.log, self.drop_last, lambda sizes: per_of(sizes, self.replay))
        return s

    # -- the audit ----------------------------------------------------------------
    def audit_sources(self) -> AuditSources:
        if self.replay:
            raise NotImplementedError(f"{self.root}: audit of a followed stream with replay={self.replay} is "
                                      "not built (replayed samples are drawn with repeats); audit without replay")
        return AuditSources([self.root], [self.log.total], None, 0)

    def audit_expect(self, item: WorkItem) -> dict:
        """The consumed prefix after ``item``: every sample below its watermark once."""
        wm = int(item.state["watermark"]["samples"])
        return {"delivered": [wm], "unique": [wm], "padded": self._item_padded(item)}


def per_of(sizes, replay: float) -> int:
    G = sum(sizes)
    per = G - round(replay * G)
    if per < 1:
        raise ValueError(f"replay={replay} leaves no new sample in a global batch of {G}; lower it")
    return per


def check_state(state: dict, fingerprint: dict) -> dict:
    """Validate a follow feed's state; ValueError naming the mismatch and the fix."""
    check_header(state, FollowFeed.kind, "resume a follow=True dataset from a follow=True Loader's state")
    check_ints(state, {"step": 0, "base": 0, "base_step": 0, "world_size": 1})
    check_batch_sizes(state)
    check_stream_position(state)
    check_same_data(state, fingerprint, "follow the same dataset with the same seed, shuffle and drop_last")
    return state
