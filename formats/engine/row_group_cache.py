"""The cache of decoded Parquet row groups of every open shard, least recently used first out.

Counted against the process-wide budget for decoded shard bytes held in
memory (decoded_budget.py, shared with compressed tars), which calls
``reclaim`` when it is short. Why keep them: under ``global`` order each batch
takes a row or two from each of many row groups (columns.py).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from shardfeed.formats.engine import decoded_budget
from shardfeed.formats.errors import ShardError


class DecodedGroups:
    """Decoded Parquet row groups of every open shard, LRU, counted against
    decoded_budget.py's budget (which calls ``reclaim`` when it is short)."""

    def __init__(self):
        self._lock = threading.RLock()
        self._groups: OrderedDict[tuple[int, int], tuple[object, int]] = OrderedDict()
        self.kept: dict[int, int] = {}  # view -> its groups held (a full shard needs no look per group)

    def get(self, view: int, g: int):
        with self._lock:
            got = self._groups.get((view, g))
            if got is None:
                return None
            self._groups.move_to_end((view, g))
            return got[0]

    def put(self, view: int, g: int, item, path: str) -> None:
        # acquire may call reclaim (which takes our lock) while holding the
        # budget's lock: never call it with our lock held
        try:
            nbytes = decoded_budget.acquire(max(int(item.nbytes), 1), path)
        except ShardError:
            return  # the budget is held by shards in use: decode this group again when next needed
        with self._lock:
            old = self._groups.pop((view, g), None)
            self._groups[(view, g)] = (item, nbytes)
            self.kept[view] = self.kept.get(view, 0) + (old is None)
        if old is not None:
            decoded_budget.release(old[1])

    def reclaim(self, nbytes: int) -> None:
        freed = []
        with self._lock:
            while self._groups and nbytes > 0:
                (view, _), (_, n) = self._groups.popitem(last=False)
                self.kept[view] -= 1
                freed.append(n)
                nbytes -= n
        for n in freed:
            decoded_budget.release(n)

    def drop_group(self, view: int, g: int) -> None:
        with self._lock:
            got = self._groups.pop((view, g), None)
            self.kept[view] = self.kept.get(view, 0) - (got is not None)
        if got is not None:
            decoded_budget.release(got[1])

    def drop(self, view: int) -> None:
        with self._lock:
            gone = [k for k in self._groups if k[0] == view]
            self.kept.pop(view, None)
            freed = [self._groups.pop(k)[1] for k in gone]
        for n in freed:
            decoded_budget.release(n)

    def nbytes(self) -> int:
        with self._lock:
            return sum(n for _, n in self._groups.values())


DECODED = DecodedGroups()
decoded_budget.add_reclaimer(DECODED.reclaim)
