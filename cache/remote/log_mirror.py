"""A remote growing dataset's commit log, followed into the node cache.

``LogMirror(url, cache)`` keeps ``<cache_dir>/datasets/<hash of url>/`` (the
folder mirror_index fills) up to date for a follower: index.arrow and the
``_log/<seq>.json`` entries, so the loader's local stream reader
(loader/feeds/stream_log.py) reads the mirror with the local log's rules
(no holes, a name committed once, nothing after the end).

What one ``sync()`` asks the source:

- At the first one (and while the dataset does not exist yet): index.arrow
  (a conditional GET when the mirror holds a copy), one listing of ``_log/``
  where the store lists (S3 always, HTTP when the server answers a folder
  with an HTML listing: a hole in it is damage, as in a local log), then
  every entry after index.arrow's ``log_seq`` (the checkpoint `shardfeed
  compact` writes), LOG_FETCHES at once, until the first missing one. Entries the mirror holds past that point are gone at the
  source (a dataset rewritten at the same URL) and are dropped.
- After that, only the next entry: one GET (S3: one HEAD) answered 404 while
  nothing new was committed, whatever the log's length; once one comes,
  windows of the next ones together (up to LOG_FETCHES), so a follower at
  the head polls in O(new commits) requests, LOG_FETCHES at a time. No listing is needed,
  so a server that lists no folders (a CDN) is followed too.

Entries are immutable once committed (create-if-absent), so a mirrored one
is never asked for again in this process. A transient failure (5xx, reset,
stall, after the fetch retries) is not an answer: ``sync`` reports no news
and keeps it in ``last_error``, so the follower's idle timeout, not one bad
minute of the server, decides when to give up. 403, a malformed entry or a
hole raise at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time

from shardfeed.cache.fetching.fetch import is_retryable
from shardfeed.cache.remote.remote_index import (
    _MAX_LOG_ENTRY,
    _SEQ_RE,
    LOG_FETCHES,
    _copy,
    _list_log,
    fetch_together,
    mirror_folder,
)
from shardfeed.cache.storage import ledger
from shardfeed.cache.storage.store import ShardCache
from shardfeed.formats import ShardError
from shardfeed.formats.commit_log import END, base_log_seq, check_no_holes
from shardfeed.formats.index import INDEX_NAME, LOG_DIR


class LogMirror:
    """A followed remote dataset's index and commit log in the cache folder (see the module docstring).

    ``folder``: the local mirror; ``exists``: the source holds a dataset;
    ``growing``: it has a commit log (a dataset written whole is complete);
    ``have``: the highest entry mirrored and checked by this process (a
    reader reads no further); ``end``: the end commit's seq once seen."""

    def __init__(self, url: str, cache: ShardCache):
        self.url = str(url).rstrip("/")
        self.cache = cache
        self.folder = mirror_folder(self.url, cache)
        self.exists = self.growing = False
        self.have = self.base = 0
        self.end: int | None = None
        self.last_error: str | None = None
        self.requests = 0  # entries and probes asked of the source (the tests and the soak count them)
        self._ends: set[int] = set()  # seqs of end commits seen (taken in order by _take)
        self._mu = threading.Lock()

    def sync(self) -> bool:
        """Bring new commits into the mirror; True if the mirror gained any (or the dataset appeared)."""
        if self.end is not None:
            return False
        try:
            if not self.exists:
                return self._open()
            before = self.have
            self._walk(self.have + 1)
            self._heal()
            self.last_error = None
            return self.have > before
        except ShardError as e:
            if e.__cause__ is None or not is_retryable(e.__cause__):
                raise
            self.last_error = str(e)
            return False

    # -- the first look -------------------------------------------------------
    def _open(self) -> bool:
        started = time.time()
        log = os.path.join(self.folder, LOG_DIR)
        os.makedirs(log, exist_ok=True)
        with self.cache.budget.locked():  # its entries' charge a running total from now on (each is a block)
            ledger.count(log, self.cache.budget.block)
        index = os.path.join(self.folder, INDEX_NAME)
        have_index = self._fetch(f"{self.url}/{INDEX_NAME}", index, 1 << 30)
        if not have_index:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(index)  # the source has none (any more): neither has the mirror
        base = self.base = base_log_seq(self.folder) if have_index else 0
        listed = _list_log(self.url, self.cache)
        self.requests += 1
        self.have = base
        if listed is not None:  # what the listing names after the index's checkpoint, asked together
            self._take(self._entries([int(n[:12]) for n in listed if int(n[:12]) > base]), base + 1)
        self._walk(self.have + 1)
        if listed is not None:
            seqs = sorted(int(n[:12]) for n in listed)
            # the listing came before the walk, so the walk found all it lists unless one is missing: a hole
            check_no_holes(seqs, base, f"{self.url}/{LOG_DIR}", lambda: base)
            if self.end is not None and seqs and seqs[-1] > self.end:
                raise ShardError(f"{self.url}/{LOG_DIR}", f"commit {seqs[-1]} comes after the end of the stream "
                                                          f"(commit {self.end}): the log is damaged; nothing may "
                                                          "be published after end_stream()")
        self._drop_stale(log, started)
        self.exists = have_index or listed is not None or self.have > base
        self.growing = listed is not None or self.have > base or base > 0
        self.last_error = None
        return self.exists

    def _drop_stale(self, log: str, started: float) -> None:
        """Entries the mirror holds past the source's last one: an older dataset at this URL.
        One mirrored since this sync began is another process's newer commit, kept."""
        for name in os.listdir(log):
            if _SEQ_RE.match(name) and int(name[:12]) > self.have:
                path = os.path.join(log, name)
                with self.cache.budget.locked(), contextlib.suppress(FileNotFoundError):
                    if os.stat(path).st_mtime < started - 1.0:
                        ledger.remove(path, self.cache.budget.block)

    # -- entries ----------------------------------------------------------------
    def _walk(self, seq: int) -> None:
        """Mirror entries ``seq``, ``seq + 1``, ... up to the first the source lacks, or the end:
        one at first (a poll while nothing was committed costs one request), then windows of up
        to LOG_FETCHES asked together while entries keep coming (a burst of commits, a log the
        store does not list), so a long tail costs round trips / LOG_FETCHES, not one each."""
        window = 1
        while self.end is None:
            seqs = list(range(seq, seq + window))
            if self._take(self._entries(seqs), seq) < len(seqs):
                return
            seq += window
            window = min(2 * window, LOG_FETCHES)

    def _entries(self, seqs: list[int]) -> dict[int, bool]:
        """Whether the source has each of ``seqs`` (each mirrored and checked if so), asked together."""
        return dict(zip(seqs, fetch_together(self._entry_quiet, seqs)))

    def _take(self, got: dict[int, bool], seq: int) -> int:
        """Advance ``have`` over the entries of ``got`` present in a row from ``seq`` (no further than
        the end); how many it took."""
        taken = 0
        while self.end is None and got.get(seq):
            self.have = seq
            if self._ended_at(seq):
                self.end = seq
            seq += 1
            taken += 1
        return taken

    def _entry_quiet(self, seq: int) -> bool:
        """``_entry`` without noting the end (entries fetched together are taken in order, ``_take``)."""
        return self._entry(seq, note_end=False)

    def _ended_at(self, seq: int) -> bool:
        return seq in self._ends

    def _entry(self, seq: int, note_end: bool = True) -> bool:
        dest = os.path.join(self.folder, LOG_DIR, f"{seq:012d}.json")
        if not self._fetch(f"{self.url}/{LOG_DIR}/{seq:012d}.json", dest, _MAX_LOG_ENTRY):
            return False
        try:
            with open(dest, "rb") as f:
                rec = json.loads(f.read(_MAX_LOG_ENTRY))
        except (OSError, ValueError) as e:
            raise ShardError(f"{self.url}/{LOG_DIR}/{seq:012d}.json", f"commit log entry is malformed: {e}") from e
        if isinstance(rec, dict) and rec.get("kind") == END:
            self._ends.add(seq)
            if note_end:
                self.end = seq
        return True

    def _fetch(self, url: str, dest: str, max_bytes: int) -> bool:
        """``url`` into ``dest`` (revalidated if held); False when the source has no such object."""
        with self._mu:  # entries are fetched by several threads at once
            self.requests += 1
        try:
            _copy(url, dest, self.cache, max_bytes, versioned=max_bytes != _MAX_LOG_ENTRY)
            return True
        except ShardError as e:
            if isinstance(e.__cause__, FileNotFoundError):
                return False
            raise

    def _heal(self) -> None:
        """Another process's first sync may drop an entry it saw missing a moment before
        it was committed: what this process mirrored is brought back, never left a hole."""
        for seq in range(max(self.base + 1, self.have - 63), self.have + 1):
            path = os.path.join(self.folder, LOG_DIR, f"{seq:012d}.json")
            if not os.path.exists(path) and not self._entry(seq):
                raise ShardError(f"{self.url}/{LOG_DIR}/{seq:012d}.json", "a commit the source held is gone "
                                 "(the dataset was rewritten or its log damaged while it was followed)")

