"""The base classes of convert's sources: a numbered list of samples read by id (see source_kinds.py).

Apart from source_kinds.py so the table sources (table_sources.py), which
source_kinds.py opens, can build on them without importing source_kinds.py back.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from shardfeed.tools.text import plural


class Source:
    """``len()`` samples, read by id with ``load_many``."""

    kind = "?"
    random_access = True  # load_many of scattered ids is cheap (see order.py for the sources where not)

    def __len__(self) -> int:
        raise NotImplementedError

    def load_many(self, ids: np.ndarray) -> list[dict[str, Any]]:
        raise NotImplementedError

    def extra_files(self) -> dict[str, str]:
        """Small text files written beside the shards (e.g. ``classes.txt``)."""
        return {}

    def describe(self) -> str:
        return f"{self.kind} source, {plural(len(self), 'sample')}"

    def close(self) -> None:
        pass


class UnitSource(Source):
    """Samples grouped in units (a file, a row group, a shard) opened on demand.

    A batch is read in id order so each unit is opened once per batch even
    when the ids are shuffled; the last few units stay open for the next batch.
    """

    max_open = 4

    def __init__(self, counts):
        self.counts = np.asarray(counts, np.int64)
        self.offsets = np.zeros(len(self.counts) + 1, np.int64)
        np.cumsum(self.counts, out=self.offsets[1:])
        self._open_units: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_open_units"] = OrderedDict()
        return state

    def _open_unit(self, u: int):
        raise NotImplementedError

    def _read(self, unit, u: int, local: int, sample_id: int) -> dict[str, Any]:
        raise NotImplementedError

    def _close_unit(self, unit) -> None:
        close = getattr(unit, "close", None)
        if close is not None:
            close()

    def _unit(self, u: int):
        if u in self._open_units:
            self._open_units.move_to_end(u)
            return self._open_units[u]
        unit = self._open_unit(u)
        self._open_units[u] = unit
        while len(self._open_units) > self.max_open:
            self._close_unit(self._open_units.popitem(last=False)[1])
        return unit

    def load_many(self, ids) -> list[dict[str, Any]]:
        ids = np.asarray(ids, np.int64)
        order = np.argsort(ids, kind="stable")
        units = np.searchsorted(self.offsets, ids, side="right") - 1
        out: list = [None] * len(ids)
        for pos in order.tolist():
            sid, u = int(ids[pos]), int(units[pos])
            out[pos] = self._read(self._unit(u), u, sid - int(self.offsets[u]), sid)
        return out

    def close(self) -> None:
        while self._open_units:
            self._close_unit(self._open_units.popitem()[1])
