"""What a growing dataset has published, as a follower sees it.

``StreamLog`` reads the commit log incrementally (only entries after the last
seen commit), waits for samples under an idle timeout (ShardError, never a
silent end) and names the stream (a digest of its first published shard).
``check_stream_state`` refuses a stream state of another stream or outside
what was published; ``RegrowMaker`` lets a worker's BatchMaker reread an
index that grew since it was opened.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np

from shardfeed.formats.commit_log import INDEX_NAME, LOG_DIR, check_new_names, open_stream_index, read_commits
from shardfeed.formats.errors import ShardError
from shardfeed.loader.feeds import IDLE_TIMEOUT_S, POLL_S  # noqa: F401 - named here too, as before
from shardfeed.loader.makers import Maker
from shardfeed.loader.state import stream_identity
from shardfeed.loader.state_checks import out_of_range


class StreamLog:
    """What has been published so far: cumulative sample counts per shard,
    commit seqs, and the end. Grows by reading only the log entries after
    the last seen commit. A folder that does not hold a dataset yet (missing,
    or neither index.arrow nor a commit log: a follower started before its
    writer) reads as empty and open; each poll looks for it again.

    ``source`` (a cache.log_mirror.LogMirror): the dataset is remote, ``root``
    its URL; each poll first brings new commits into the mirror folder, which
    is then read by the same rules, no further than the mirror checked."""

    def __init__(self, root: str, source=None):
        self.root = root
        self.source = source
        self.folder = source.folder if source is not None else root
        self.names: list[str] = []
        self.counts: list[int] = []
        self.seqs: list[int] = []
        self.offsets = np.zeros(1, np.int64)
        self.end: int | None = None
        self.seen = 0
        self.first: tuple[str, str] | None = None  # (name, hash) of the first published shard
        self._identity: str | None = None
        self.exists = False
        self.known: dict[str, int] = {}
        self.last_change = time.monotonic()
        self._open()

    def _open(self) -> bool:
        """Read the dataset if it appeared; False while it has not."""
        if self.source is not None:
            if not self.source.sync():
                return False
        elif not (os.path.exists(os.path.join(self.root, INDEX_NAME)) or os.path.isdir(os.path.join(self.root, LOG_DIR))):
            if os.path.exists(self.root) and not os.path.isdir(self.root):
                raise ShardError(self.root, "follow=True needs the folder of a growing dataset "
                                            "(ShardWriter(append=True)); this is not a folder")
            return False
        index, view = open_stream_index(self.folder, upto=self._upto())
        self.exists = True
        self.names = list(index.names)
        self.counts = [int(c) for c in index.counts]
        if self.names:
            self.first = (index.names[0], index.hashes[0])
        # the commit seq of each shard; rows folded into index.arrow carry its log_seq
        folded = len(index) - len(view.shards)
        self.seqs = [int(index.meta["folded_seq"])] * folded + [seq for seq, _ in view.shards]
        self.offsets = np.asarray(index.offsets, np.int64)
        # a dataset without a commit log was written whole (no append): complete, as if ended
        growing = self.source.growing if self.source is not None else os.path.isdir(os.path.join(self.root, LOG_DIR))
        self.end = view.end if growing else int(index.meta["folded_seq"])
        self.seen = int(index.meta.get("seen_seq", 0))
        self.known = dict(zip(self.names, self.seqs))  # a name committed again later is damage
        self.last_change = time.monotonic()
        return True

    @property
    def identity(self) -> str | None:
        """The stream's identity (its first published shard), None before one is published."""
        if self._identity is None and self.first is not None:
            self._identity = stream_identity(*self.first)
        return self._identity

    @property
    def total(self) -> int:
        return int(self.offsets[-1])

    def poll(self) -> bool:
        """Read new commits; True if any arrived."""
        if self.end is not None:
            return False
        if not self.exists:
            return self._open()
        if self.source is not None and not self.source.sync():
            return False
        view = read_commits(self.folder, after=self.seen, upto=self._upto())
        if not view.shards and view.end is None:
            return False
        check_new_names(self.known, view.shards, self.root)
        if view.shards and self.first is None:
            self.first = (view.shards[0][1].name, view.shards[0][1].hash)
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

    def _upto(self) -> int | None:
        return self.source.have if self.source is not None else None

    def wait(self, need: int, step: int, poll_s: float, idle_timeout_s: float) -> None:
        """Poll until ``need`` samples are published or the stream ended; ShardError
        after ``idle_timeout_s`` without a commit (never a silent end)."""
        waited_from = time.monotonic()
        while self.total < need and self.end is None:
            if not self.poll():
                idle = time.monotonic() - max(self.last_change, waited_from)
                if idle >= idle_timeout_s and not self.exists:
                    raise ShardError(self.root, f"no dataset appeared here for {idle:.1f} s (idle_timeout_s="
                                                f"{idle_timeout_s:g}): no {INDEX_NAME} and no commit log "
                                                f"({LOG_DIR}/) while step {step} waits for its first samples; "
                                                "start the writer (ShardWriter(root, append=True)) or check the path"
                                                + self._last_error())
                if idle >= idle_timeout_s:
                    raise ShardError(self.root, f"no commit arrived for {idle:.1f} s (idle_timeout_s="
                                                f"{idle_timeout_s:g}) while step {step} waits for "
                                                f"{need - self.total} more samples ({self.total} "
                                                "published); the writer may have stopped without end_stream()"
                                                + self._last_error())
                time.sleep(poll_s)

    def _last_error(self) -> str:
        err = None if self.source is None else self.source.last_error
        return f"; the last poll of the source failed: {err}" if err else ""

    def seq_at(self, samples: int) -> int:
        """The commit holding stream sample ``samples - 1`` (0 before any)."""
        if samples <= 0 or not self.seqs:
            return 0
        shard = int(np.searchsorted(self.offsets, samples - 1, side="right")) - 1
        return int(self.seqs[min(shard, len(self.seqs) - 1)])


def check_stream_state(s: dict, log: StreamLog, drop_last: bool, per_of) -> None:
    """A stream state names this stream and a position inside what it published:
    its identity (version 2), base, step and watermark agree with the saved job's
    dealing (``per_of(batch sizes)`` new samples per full global batch). The log
    is polled once when the state is ahead of it. ValueError otherwise."""
    wm = s["watermark"]["samples"]
    if wm > log.total or not log.exists:
        log.poll()
    if s["version"] >= 2:
        data = s.get("data")
        theirs = data.get("stream") if isinstance(data, dict) else 0
        if not (theirs is None or isinstance(theirs, str)) or (theirs is None and wm > 0):
            raise ValueError(f"state['data']={data!r} must name the stream it belongs to "
                             "({'stream': identity}, None only before any sample was consumed)")
        ours = log.identity
        if theirs is not None and ours != theirs:
            now = "has published nothing" if ours is None else f"is stream {ours}"
            raise ValueError(f"state belongs to stream {theirs} ({wm} samples consumed) but {log.root} {now}: "
                             "another growing dataset, or one recreated in the same folder; resume a stream "
                             "only from its own state")
    total, ended = log.total, log.end is not None
    base, step, base_step = s["base"], s["step"], s["base_step"]
    if base > total:
        raise out_of_range("base", base, 0, total, f"the {total} samples {log.root} has published")
    per = per_of(s["batch_sizes"])
    full, tail = divmod(total - base, per)
    hi = base_step + full + (1 if ended and tail and not drop_last else 0)
    if not base_step <= step <= hi:
        what = "the ended stream" if ended else "the published stream"
        raise out_of_range("step", step, base_step, hi, f"{what} {log.root} ({total} samples, {per} new per step "
                           f"from sample {base} at step {base_step})")
    g = step - base_step
    want = total if g == full + 1 else base + g * per
    if wm != want:
        raise ValueError(f"state['watermark']['samples']={wm} does not match its step {step} (the saved job "
                         f"consumed {want} samples there); the state was edited or belongs to other data")


class RegrowMaker(Maker):
    """A worker's BatchMaker over data that grows: an id past the index it knows
    (published after it was opened) makes it take the grown index (``regrow()``)
    and hand it to its reader first. Feeds deal only published ids, so one
    reread always finds them; ``missing`` formats the error if it does not."""

    def __init__(self, maker: Maker, regrow: Callable, root: str, missing: str):
        self.maker, self.regrow, self.root, self.missing = maker, regrow, root, missing

    @property
    def reader(self):
        return self.maker.reader

    @property
    def cached(self):
        return self.maker.cached

    def inner(self) -> Maker:
        return self.maker.inner()

    def make(self, ids, image_size=None, alloc=None):
        ids = np.asarray(ids, np.int64)
        if ids.size and int(ids.max()) >= self.maker.reader.index.num_samples:
            index = self.regrow()
            if int(ids.max()) >= index.num_samples:
                raise ShardError(self.root, self.missing.format(id=int(ids.max()), n=index.num_samples))
            self.maker.reader.update_index(index)
            if self.cached is not None:  # a followed URL's reads through the cache resolve the new shards too
                self.cached.update_index(index)
        return self.maker.make(ids, image_size, alloc)

    def close(self) -> None:
        self.maker.close()


def stream_index(root: str):
    """Every shard ``root`` has published (a picklable regrow for RegrowMaker)."""
    return open_stream_index(root)[0]
