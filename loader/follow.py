"""FollowFeed: this rank's steps over a dataset that grows while it is read.

A sibling of feed.EpochFeed with the same contract (reset / next /
get_state / lookahead, plus what the Loader calls). Delivery is a pure
function of the commit log's prefix, so ranks agree without messages:

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
- Waiting polls the log every ``poll_s``; when no commit arrives for
  ``idle_timeout_s`` it raises ShardError naming the dataset and the wait,
  never a silent end (ranks could see a timeout differently; an end commit
  they all see alike).

State: ``{"version": 1, "kind": "follow", "epoch": 0, "step", "base",
"base_step", "world_size", "batch_sizes", "watermark": {"samples", "seq"},
"done", "dataset"}``. ``base`` is the stream position where the current job
(world size and batch sizes) started, at total step ``base_step``; a state
loaded by another world size starts a new job at the samples consumed, so
nothing is lost or repeated. ``watermark.seq`` is the commit holding the
last consumed sample (for people and for checks).
"""

from __future__ import annotations

import os
import time

import numpy as np

from shardfeed.formats.commit_log import LOG_DIR, check_new_names, open_stream_index, read_commits
from shardfeed.formats.errors import ShardError
from shardfeed.loader.feed import STATE_VERSION, Feed, Upcoming, WorkItem
from shardfeed.loader.schedule import BatchSchedule, Stage
from shardfeed.loader.state_checks import (
    check_batch_sizes,
    check_header,
    check_ints,
    check_same_data,
    check_stream_position,
)
from shardfeed.shuffling.spec import Job

POLL_S = 0.5
IDLE_TIMEOUT_S = 600.0
_LOOKAHEAD_STEPS = 4096  # steps one lookahead call may scan (bounds its cost)


class IdsPlan:
    """Explicit ids of one step (a replay step, whose old samples depend on the
    log): positions [0, len) of this step."""

    def __init__(self, ids: np.ndarray):
        self.ids = np.asarray(ids, np.int64)

    def positions(self, start: int, stop: int) -> np.ndarray:
        return self.ids[start:stop]


class StreamPlan:
    """Rank ``rank``'s positions -> stream sample ids, for the job that starts
    at stream position ``base``. Pure arithmetic, pickled once to workers.
    ``tail``: the sample count of the stream's last short global batch (set
    only once the end is committed)."""

    def __init__(self, base: int, batch_sizes: tuple[int, ...], rank: int, seed: int, shuffle: bool,
                 full: int | None = None, tail: int = 0, per: int | None = None):
        self.base, self.batch_sizes, self.rank = int(base), tuple(batch_sizes), int(rank)
        self.seed, self.shuffle = int(seed), bool(shuffle)
        self.G = sum(self.batch_sizes)
        self.bs = self.batch_sizes[rank]
        self.pre = sum(self.batch_sizes[:rank])
        self.full, self.tail = full, int(tail)  # full: global batches before the tail (known at the end)
        self.per = self.G if per is None else int(per)  # new stream samples per full global batch
        self.shares = tail_shares(self.tail, self.batch_sizes) if self.tail else None

    def _perm(self, start: int, n: int) -> np.ndarray | None:
        if not self.shuffle or n <= 1:
            return None
        return np.random.default_rng([self.seed, start]).permutation(n)

    def positions(self, start: int, stop: int) -> np.ndarray:
        """Ids of this rank's positions [start, stop) (whole steps or parts of them)."""
        out = np.empty(max(0, stop - start), np.int64)
        k, i = start, 0
        while k < stop:
            g, j = divmod(k, self.bs)
            if self.full is not None and g >= self.full:
                # the tail: this rank's share of the last short global batch
                first = self.base + self.full * self.per
                lo, n = self.shares[self.rank]
                m = min(stop - k, max(n, 1) - j)
                # a rank with no share repeats one tail sample (padding, only when tail < world size)
                q = np.arange(lo + j, lo + j + m, dtype=np.int64) if n else np.full(m, self.rank % self.tail, np.int64)
                perm = self._perm(first, self.tail)
                out[i:i + m] = first + (perm[q] if perm is not None else q)
            else:
                first = self.base + g * self.G
                m = min(stop - k, self.bs - j)
                q = np.arange(self.pre + j, self.pre + j + m, dtype=np.int64)
                perm = self._perm(first, self.G)
                out[i:i + m] = first + (perm[q] if perm is not None else q)
            k += m
            i += m
        return out

    def __repr__(self) -> str:
        return f"StreamPlan(base={self.base}, batch_sizes={self.batch_sizes}, rank={self.rank}, tail={self.tail})"


def tail_shares(n: int, batch_sizes: tuple[int, ...]) -> list[tuple[int, int]]:
    """(offset, count) of each rank in a last global batch of ``n < G`` samples:
    proportional to the batch sizes (never above them), at least one each when
    n >= world size; contiguous, in rank order, covering [0, n) exactly once."""
    G, W = sum(batch_sizes), len(batch_sizes)
    q = [n * b // G for b in batch_sizes]
    left = n - sum(q)
    # the leftover goes to empty ranks first, then by largest remainder (Hamilton's rule)
    for r in sorted(range(W), key=lambda r: (q[r] > 0, -(n * batch_sizes[r] % G), r)):
        if left == 0:
            break
        if q[r] < batch_sizes[r]:
            q[r] += 1
            left -= 1
    if left:  # n < G always leaves room; a guard against a wrong split, never silent
        raise RuntimeError(f"tail split of {n} over {batch_sizes} left {left} samples")
    for r in range(W):  # move one sample to each still-empty rank from the largest share
        if q[r] == 0:
            s = max(range(W), key=lambda i: q[i])
            if q[s] <= 1:
                break
            q[s] -= 1
            q[r] += 1
    out, off = [], 0
    for c in q:
        out.append((off, c))
        off += c
    return out


class _Log:
    """What has been published so far: cumulative sample counts per shard,
    commit seqs, and the end. Grows by reading only the log entries after
    the last seen commit."""

    def __init__(self, root: str):
        self.root = root
        index, view = open_stream_index(root)
        self.names = list(index.names)
        self.counts = [int(c) for c in index.counts]
        # the commit seq of each shard; rows folded into index.arrow carry its log_seq
        folded = len(index) - len(view.shards)
        self.seqs = [int(index.meta["folded_seq"])] * folded + [seq for seq, _ in view.shards]
        self.offsets = np.asarray(index.offsets, np.int64)
        # a dataset without a commit log was written whole (no append): complete, as if ended
        growing = os.path.isdir(os.path.join(root, LOG_DIR))
        self.end = view.end if growing else int(index.meta["folded_seq"])
        self.seen = int(index.meta.get("seen_seq", 0))
        self.last_change = time.monotonic()
        self.known = dict(zip(self.names, self.seqs))  # a name committed again later is damage

    @property
    def total(self) -> int:
        return int(self.offsets[-1])

    def poll(self) -> bool:
        """Read new commits; True if any arrived."""
        if self.end is not None:
            return False
        view = read_commits(self.root, after=self.seen)
        if not view.shards and view.end is None:
            return False
        check_new_names(self.known, view.shards, self.root)
        for seq, info in view.shards:
            self.names.append(info.name)
            self.counts.append(info.samples)
            self.seqs.append(seq)
        if view.shards:
            add = np.cumsum([i.samples for _, i in view.shards], dtype=np.int64) + self.offsets[-1]
            self.offsets = np.concatenate([self.offsets, add])
        self.end = view.end
        self.seen = view.last_seq
        self.last_change = time.monotonic()
        return True

    def wait(self, need: int, step: int, poll_s: float, idle_timeout_s: float) -> None:
        """Poll until ``need`` samples are published or the stream ended; ShardError
        after ``idle_timeout_s`` without a commit (never a silent end)."""
        waited_from = time.monotonic()
        while self.total < need and self.end is None:
            if not self.poll():
                idle = time.monotonic() - max(self.last_change, waited_from)
                if idle >= idle_timeout_s:
                    raise ShardError(self.root, f"no commit arrived for {idle:.1f} s (idle_timeout_s="
                                                f"{idle_timeout_s:g}) while step {step} waits for "
                                                f"{need - self.total} more samples ({self.total} "
                                                "published); the writer may have stopped without end_stream()")
                time.sleep(poll_s)

    def seq_at(self, samples: int) -> int:
        """The commit holding stream sample ``samples - 1`` (0 before any)."""
        if samples <= 0 or not self.seqs:
            return 0
        shard = int(np.searchsorted(self.offsets, samples - 1, side="right")) - 1
        return int(self.seqs[min(shard, len(self.seqs) - 1)])


class FollowFeed(Feed):
    """This rank's steps over a growing dataset (see the module docstring)."""

    kind = "follow"

    def __init__(self, root: str, schedule: BatchSchedule, rank: int, world_size: int, seed: int = 0,
                 shuffle: bool = True, drop_last: bool = False, ranks_per_node: int | None = None,
                 fingerprint: dict | None = None, poll_s: float = POLL_S, idle_timeout_s: float = IDLE_TIMEOUT_S,
                 replay: float = 0.0, window: int | None = None):
        if not poll_s > 0 or not idle_timeout_s > 0:
            raise ValueError(f"poll_s={poll_s!r} and idle_timeout_s={idle_timeout_s!r} must be > 0 seconds")
        self.root = root
        self.schedule = schedule
        self.rank, self.world_size, self.ranks_per_node = rank, world_size, ranks_per_node
        self.seed, self.shuffle, self.drop_last = int(seed), bool(shuffle), bool(drop_last)
        self.fingerprint = dict(fingerprint or {})
        self.poll_s, self.idle_timeout_s = float(poll_s), float(idle_timeout_s)
        if isinstance(replay, bool) or not isinstance(replay, (int, float)) or not 0 <= replay < 1:
            raise ValueError(f"replay={replay!r} must be a fraction in [0, 1): the share of each global batch "
                             "drawn from older samples")
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ValueError(f"window={window!r} must be None (all history) or an int >= 1 (commits)")
        self.replay, self.window = float(replay), window
        self.log = _Log(root)
        self.epoch = 0
        self.step, self.base, self.base_step, self.done = 0, 0, 0, False
        self._plan: StreamPlan | None = None
        self.job()  # check the batch sizes against the world size now

    # -- job and stage: the stream is one "epoch" ----------------------
    def stage(self, epoch: int | None = None) -> Stage:
        return self.schedule.at(0)

    def job(self, epoch: int | None = None) -> Job:
        stage = self.stage()
        w = self.world_size
        return Job(w, tuple(stage.rank_batch(r, w) for r in range(w)), self.ranks_per_node)

    def batch_size(self, epoch: int | None = None) -> int:
        return self.job().batch_size(self.rank)

    def steps(self, epoch: int | None = None, history=None) -> int:
        raise TypeError(f"{self.root}: a followed dataset has no length (it grows until its end commit); "
                        "count steps as they come")

    __len__ = steps

    def set_epoch(self, epoch: int) -> None:
        """A followed stream is one epoch; set_epoch(0) keeps the position, another epoch is refused."""
        if epoch != self.epoch:
            raise ValueError(f"{self.root}: a followed dataset is one stream (epoch 0); set_epoch({epoch!r}) "
                             "has no meaning for it")

    def next_epoch(self) -> None:
        """Past the end of the stream: nothing more comes."""
        self.done = True

    # -- plans ---------------------------------------------------------
    def _sizes(self) -> tuple[int, ...]:
        return self.job().batch_sizes

    def _per(self) -> int:
        """New stream samples per full global batch: G less the replayed ones."""
        G = sum(self._sizes())
        per = G - round(self.replay * G)
        if per < 1:
            raise ValueError(f"replay={self.replay} leaves no new sample in a global batch of {G}; lower it")
        return per

    def _replay_ids(self, g: int) -> np.ndarray:
        """This rank's ids of full global batch ``g`` of the job with replay:
        ``per`` new samples, then ``G - per`` old ones drawn (with repeats)
        from the samples before them in the last ``window`` commits (the
        newest commit being the one holding the batch's last new sample),
        all from (seed, first new id); shuffled inside the batch like plain
        ones. At the stream's start, with nothing older, the batch's own new
        samples are drawn."""
        sizes, per = self._sizes(), self._per()
        G = sum(sizes)
        hi = self.base + g * per
        new = np.arange(hi, hi + per, dtype=np.int64)
        lo = 0
        if self.window is not None:
            newest = int(np.searchsorted(self.log.offsets, hi + per - 1, side="right")) - 1
            lo = int(self.log.offsets[max(0, newest - self.window + 1)])
        rng = np.random.default_rng([self.seed, hi, 1])
        old = lo + rng.integers(0, hi - lo, G - per) if hi > lo else rng.choice(new, G - per)
        batch = np.concatenate([new, old.astype(np.int64)])
        if self.shuffle:
            batch = batch[np.random.default_rng([self.seed, hi]).permutation(G)]
        pre = sum(sizes[:self.rank])
        return batch[pre:pre + sizes[self.rank]]

    def plan(self, full: int | None = None, tail: int = 0) -> StreamPlan:
        p = self._plan
        if (p is None or p.base != self.base or p.batch_sizes != self._sizes() or p.full != full
                or p.tail != tail):
            self._plan = StreamPlan(self.base, self._sizes(), self.rank, self.seed, self.shuffle, full, tail,
                                    self._per())
        return self._plan

    def _consumed(self, steps: int | None = None) -> int:
        """Stream samples consumed by all ranks after ``steps`` job steps (default: the current)."""
        g = self.step - self.base_step if steps is None else steps
        full_end = self._full_end()
        if full_end is not None and g > full_end:  # the tail was taken
            return self.log.total
        return self.base + g * self._per()

    def _full_end(self) -> int | None:
        """Job steps of full global batches once the stream has ended (None before)."""
        if self.log.end is None:
            return None
        return (self.log.total - self.base) // self._per()

    # -- the contract --------------------------------------------------
    def next(self) -> WorkItem:
        if self.done:
            raise StopIteration
        G, bs = self._per(), self.batch_size()
        g = self.step - self.base_step
        need = self.base + (g + 1) * G
        self.log.wait(need, self.step, self.poll_s, self.idle_timeout_s)
        if self.log.total >= need and self.replay:
            plan, start, stop = IdsPlan(self._replay_ids(g)), 0, bs
        elif self.log.total >= need:
            plan, start, stop = self.plan(), g * bs, (g + 1) * bs
        else:  # ended: the short last step, or nothing
            full = (self.log.total - self.base) // G
            tail = self.log.total - self.base - full * G
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

    def get_state(self) -> dict:
        consumed = self._consumed()
        return {
            "version": STATE_VERSION, "kind": self.kind, "epoch": 0, "step": self.step,
            "base": self.base, "base_step": self.base_step, "world_size": self.world_size,
            "batch_sizes": list(self._sizes()), "done": self.done,
            "watermark": {"samples": consumed, "seq": self.log.seq_at(consumed)},
            "dataset": dict(self.fingerprint),
        }

    def reset(self, state: dict | None = None) -> None:
        """Go to ``state`` (of this or another world size / batch sizes), or to the stream's start."""
        if state is None:
            self.step, self.base, self.base_step, self.done = 0, 0, 0, False
            return
        s = check_state(state, self.fingerprint)
        if s["world_size"] == self.world_size and tuple(s["batch_sizes"]) == self._sizes():
            self.step, self.base, self.base_step, self.done = s["step"], s["base"], s["base_step"], s["done"]
            return
        # another job: it starts where the saved one stood, at the samples consumed
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
        seen: set[int] = set()
        if self.done:
            return out
        bs = self.batch_size()
        g0 = self.step - self.base_step
        full = (self.log.total - self.base) // self._per()
        for g in range(g0, min(full, g0 + _LOOKAHEAD_STEPS)):
            ids = self._replay_ids(g) if self.replay else self.plan().positions(g * bs, (g + 1) * bs)
            shards = np.searchsorted(self.log.offsets, ids, side="right") - 1
            for s in dict.fromkeys(shards.tolist()):
                if s not in seen:
                    seen.add(s)
                    out.append(Upcoming(int(s), 0, self.base_step + g))
                    if len(out) >= k:
                        return out
        return out

    def __repr__(self) -> str:
        return (f"FollowFeed({self.root!r}, rank={self.rank}/{self.world_size}, step={self.step}, "
                f"published={self.log.total}, ended={self.log.end is not None})")


def check_state(state: dict, fingerprint: dict) -> dict:
    """Validate a follow feed's state; ValueError naming the mismatch and the fix."""
    check_header(state, FollowFeed.kind, "resume a follow=True dataset from a follow=True Loader's state")
    check_ints(state, {"step": 0, "base": 0, "base_step": 0, "world_size": 1})
    check_batch_sizes(state)
    check_stream_position(state)
    check_same_data(state, fingerprint, "follow the same dataset with the same seed, shuffle and drop_last")
    return state


class FollowMaker:
    """A worker's BatchMaker for a growing dataset: ids past the index it
    knows (published after it was opened) make it reread the index and hand
    the grown one to its reader first. The feed deals only published ids, so
    one reread always finds them."""

    def __init__(self, maker, root: str):
        self.maker, self.root = maker, root

    @property
    def reader(self):
        return self.maker.reader

    def make(self, ids, image_size=None, alloc=None):
        ids = np.asarray(ids, np.int64)
        if ids.size and int(ids.max()) >= self.maker.reader.index.num_samples:
            index, _ = open_stream_index(self.root)
            if int(ids.max()) >= index.num_samples:
                raise ShardError(self.root, f"sample {int(ids.max())} is not published ({index.num_samples} "
                                            "samples in the index and log): the log lost commits?")
            self.maker.reader.update_index(index)
        return self.maker.make(ids, image_size, alloc)

    def close(self) -> None:
        self.maker.close()
