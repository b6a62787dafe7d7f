"""Which cached shard to evict: the one whose next use is farthest away.

Each ShardCache publishes the steps at which it will next need each entry
(its lookahead) as ``lookahead/<owner>.json`` in the cache folder, so the
process that evicts sees the plans of every process on the node, not only
its own: with locality dealing each rank needs different shards. All ranks
take the same steps, so step numbers compare across them. A plan file is
part of the cache's budget: ``max_bytes`` (set by the Loader to what its
start check counted for it) bounds it, keeping the nearest steps. An owner holds a
shared flock on ``<owner>.alive`` while it lives; files of dead owners are
removed by the next reader. Each prefetcher publishes under a name of its own
(``publisher()``: two Loaders of one process share the process's cache, and one
file written by both lost one's plan and the other's rename), removed at its close.

Victim order (Belady's rule, with what is known): entries no live plan
mentions go first, least recently used first; then planned ones, farthest
next use first.
"""

from __future__ import annotations

import json
import os
import threading
import uuid

from shardfeed.cache.storage.disk_blocks import rounded
from shardfeed.cache.storage.locks import FileLock

PLAN_ENTRY_BYTES = 96  # one key's entry in a published lookahead plan (JSON key and step), rounded up
PLAN_BLOCK = 4096  # the block the budget's sizing rounds a plan file to (cost_model.BLOCK)


def plan_bytes(shards: int, ranged: bool) -> int:
    """A rank's plan file in the budget: its keys (a shard's, and its partial copy's with ranges), twice
    (the new file is written beside the old one), in whole disk blocks; ``max_bytes`` keeps it within this."""
    return 2 * rounded((2 if ranged else 1) * PLAN_ENTRY_BYTES * min(int(shards), 4096), PLAN_BLOCK)


class SharedLookahead:
    def __init__(self, folder: str, share: bool = True, parent: SharedLookahead | None = None):
        self.folder = folder
        self.share = share
        self.mine: dict[str, int] = {}
        self.owner = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._alive: FileLock | None = None
        self._alive_pid = -1
        self._seen: dict[str, tuple[int, int, dict]] = {}  # path -> (mtime_ns, size, plan)
        self.max_bytes: int | None = None  # bound of the published file (the budget counted this much)
        self._parent = parent
        self._publishers: set[SharedLookahead] = set()  # publisher()'s, open: their plans count here
        self._mu = threading.Lock()  # one publish at a time (its file is written, then renamed)
        self._pub_mu = threading.Lock()  # _publishers (merged() runs in any thread)
        self._closed = False

    def publisher(self) -> SharedLookahead:
        """A plan of its own in the same folder under its own name (one per prefetcher), counted in
        this one's ``merged()``; ``close()`` it when its prefetcher ends."""
        p = SharedLookahead(self.folder, self.share, parent=self)
        with self._pub_mu:
            self._publishers.add(p)
        return p

    def publish(self, plan: dict[str, int]) -> None:
        with self._mu:
            if self._closed:
                return  # its prefetcher ended: a late pass of its thread publishes nothing
            self.mine = dict(plan)
            if self.share:
                self._write()

    def withdraw(self) -> None:
        """No plan for now: its file removed (a later publish writes one again)."""
        with self._mu:
            self.mine = {}
            self._close_file()

    def _write(self) -> None:
        os.makedirs(self.folder, exist_ok=True)
        if self._alive is None or self._alive_pid != os.getpid():
            # a forked child owns a plan of its own, under its own name
            self.owner = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
            self._alive = FileLock(os.path.join(self.folder, f"{self.owner}.alive"))
            self._alive.acquire(shared=True)
            self._alive_pid = os.getpid()
        path = os.path.join(self.folder, f"{self.owner}.json")
        tmp = f"{path}.tmp"
        text = json.dumps(self.mine)
        bound = self.max_bytes if self.max_bytes is not None or self._parent is None else self._parent.max_bytes
        if bound is not None and len(text) > bound // 2:  # the old file and the new, at once
            text = _bounded(self.mine, bound // 2)
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)  # readers see the old plan or the new one, never half of one

    def merged(self) -> dict[str, int]:
        """Earliest planned step per key over all live owners on the node."""
        out = dict(self.mine)
        mine = {f"{self.owner}.json"}
        with self._pub_mu:
            publishers = list(self._publishers)
        for p in publishers:
            mine.add(f"{p.owner}.json")
            for key, step in dict(p.mine).items():
                if step < out.get(key, step + 1):
                    out[key] = step
        if not self.share or not os.path.isdir(self.folder):
            return out
        for name in os.listdir(self.folder):
            if not name.endswith(".json") or name in mine:
                continue
            path = os.path.join(self.folder, name)
            if not self._owner_alive(name[:-5]):
                for p in (path, path[:-5] + ".alive"):
                    try:
                        os.unlink(p)
                    except FileNotFoundError:
                        pass
                continue
            for key, step in self._read(path).items():
                if step < out.get(key, step + 1):
                    out[key] = step
        return out

    def _owner_alive(self, owner: str) -> bool:
        probe = FileLock(os.path.join(self.folder, f"{owner}.alive"))
        if probe.acquire(blocking=False):
            probe.release()
            return False
        return True

    def _read(self, path: str) -> dict[str, int]:
        try:
            st = os.stat(path)
            cached = self._seen.get(path)
            if cached and cached[:2] == (st.st_mtime_ns, st.st_size):
                return cached[2]
            with open(path) as f:
                plan = {str(k): int(v) for k, v in json.load(f).items()}
        except (OSError, ValueError, TypeError, AttributeError):
            return {}  # a plan is advice: an unreadable one only costs a worse eviction choice
        self._seen[path] = (st.st_mtime_ns, st.st_size, plan)
        return plan

    def close(self) -> None:
        with self._mu:
            if self._parent is not None:  # a publisher's: it ends with its prefetcher, for good
                self._closed = True
                self.mine = {}
                with self._parent._pub_mu:
                    self._parent._publishers.discard(self)
            self._close_file()

    def _close_file(self) -> None:
        if self._alive is not None and self.share and self._alive_pid == os.getpid():
            for p in (os.path.join(self.folder, f"{self.owner}.json"), self._alive.path):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
            self._alive.release()
        self._alive = None


def _bounded(plan: dict[str, int], nbytes: int) -> str:
    """``plan``'s nearest steps as JSON of at most ``nbytes`` (the farthest entries matter least
    to eviction: an entry in no plan goes first, as the farthest would)."""
    out, used = {}, 2
    for key, step in sorted(plan.items(), key=lambda kv: kv[1]):
        used += len(json.dumps(key)) + len(str(step)) + 4  # '"key": step, '
        if used > nbytes:
            break
        out[key] = step
    return json.dumps(out)


def victim_order(entries: dict[str, tuple[int, float]], plan: dict[str, int]) -> list[str]:
    """Keys of ``entries`` (key -> (bytes, last_used)) in the order to evict them.

    Partial copies (``r-`` keys, sample ranges: ranges.py) go before whole
    shards: what they hold is the few samples the plan reads next, refetched
    for little, while a whole shard evicted costs its bytes again later."""
    def order(keys):
        unplanned = sorted((k for k in keys if k not in plan), key=lambda k: entries[k][1])
        planned = sorted((k for k in keys if k in plan), key=lambda k: (-plan[k], entries[k][1]))
        return unplanned + planned
    return order([k for k in entries if k.startswith("r-")]) + order([k for k in entries if not k.startswith("r-")])
