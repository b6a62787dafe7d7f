"""Coverage audit: what one rank delivered, one bit per sample per source per epoch.

``Loader(..., audit=True)`` records every delivered batch's sample ids in a
packed bitmap per (epoch, source) (numpy packbits order: bit 7 of byte
``id >> 3`` is id ``8*(id >> 3)``) plus counters: samples delivered, and
deliveries of an id this rank had already delivered (``extra``, with a few
example ids). One bit per sample per rank and epoch: 10^9 samples take
125 MB per rank per epoch in memory. Repeats across ranks are found when
``shardfeed audit`` merges the ranks' records (overlapping bits).

Each epoch's record also holds what the feed promises, computed from the
same pure functions that deal the samples: per source the deliveries
(``delivered``) and distinct samples (``unique``) of the whole epoch over all
ranks, and the padding of the epoch (``padded``, repeats allowed). A mixture
source that repeats (count > size) or continues a sub-sampled permutation
has ``unique`` computed from its ids (one pass over the epoch's ids of that
source when the epoch's first batch is recorded).

A followed stream (``follow=True``, alone or as a Mixture's source) is one
"epoch" (0) whose expectation is the published prefix consumed so far,
taken from the feed's state after the last recorded step (its watermark):
every stream sample below it exactly once across ranks (the tail's padding
allowed), and each fixed source of a stream mixture ``P`` deliveries of
``min(P, size)`` distinct samples, ``P`` being its consumed walk position.
The stream's bitmap grows with it; its ``samples`` in the record is the
watermark. Records of all ranks must be saved at the same step (the
checkpoint), as for epochs. Replay (``follow=True, replay=...``) is not
audited (its repeats are drawn, not counted).

Save ``audit_state()`` with ``save(state, path)`` beside each checkpoint:
the record covers exactly the batches the state_dict() of the same moment
says were consumed, so the records of a run and of its resumed run (any
world size) merge into the whole epoch. A resumed loader starts a fresh
record.
"""

from __future__ import annotations

import base64
import json
import os
import zlib

import numpy as np

VERSION = 1
_CHUNK = 1 << 20
ID_CHUNK = _CHUNK  # ids a feed hands ``distinct`` at a time (bounds its memory)
_EXAMPLES = 20


def _bits(n: int) -> np.ndarray:
    return np.zeros((n + 7) // 8, np.uint8)


def mark(bits: np.ndarray, ids: np.ndarray) -> tuple[int, np.ndarray]:
    """Set ``ids`` in ``bits``: (how many were set before or repeat within ``ids``, those ids)."""
    if ids.size == 0:
        return 0, ids
    srt = np.sort(ids)
    dup = srt[1:] == srt[:-1]
    uniq = srt[np.concatenate(([True], ~dup))]
    byte, mask = uniq >> 3, (128 >> (uniq & 7)).astype(np.uint8)
    set_before = (bits[byte] & mask) != 0
    # ids sharing a byte are adjacent (sorted): OR their masks, then one store per byte
    starts = np.flatnonzero(np.concatenate(([True], byte[1:] != byte[:-1])))
    bits[byte[starts]] |= np.bitwise_or.reduceat(mask, starts)
    again = np.concatenate((uniq[set_before], srt[1:][dup]))
    return int(again.size), again


def popcount(bits: np.ndarray) -> int:
    return int(np.unpackbits(bits).sum()) if bits.size < _CHUNK else sum(
        int(np.unpackbits(bits[i:i + _CHUNK]).sum()) for i in range(0, bits.size, _CHUNK))


def distinct(n: int, chunks) -> int:
    """Distinct ids among ``chunks`` (arrays of ids in [0, n)), counted in a bitmap."""
    bits = _bits(n)
    for ids in chunks:
        mark(bits, ids)
    return popcount(bits)


def encode(bits: np.ndarray) -> str:
    return base64.b64encode(zlib.compress(bits.tobytes(), 1)).decode("ascii")


def decode(text: str, n: int, where: str) -> np.ndarray:
    raw = zlib.decompress(base64.b64decode(text), bufsize=(n + 7) // 8 + 1)
    if len(raw) != (n + 7) // 8:
        raise ValueError(f"{where}: bitmap holds {len(raw)} bytes, expected {(n + 7) // 8} for {n} samples "
                         "(a record of another dataset?)")
    return np.frombuffer(raw, np.uint8).copy()


class AuditRecorder:
    """One rank's delivery record over a Loader's feed: what it records per source and
    what it expects come from the feed (``audit_sources`` / ``audit_expect``)."""

    def __init__(self, feed):
        self.feed = feed
        self.kind = feed.kind
        src = feed.audit_sources()
        self.names, self.sizes, self._split = list(src.names), list(src.sizes), src.split
        self.stream = src.stream  # the followed source (its bitmap grows; its expectation is the consumed prefix)
        self.epochs: dict[int, dict] = {}
        self._plan = None  # the plan the expectation was last taken from

    def _epoch(self, item) -> dict:
        e = item.epoch
        rec = self.epochs.get(e)
        if rec is None:
            rec = self.epochs[e] = {"bits": [_bits(n) for n in self.sizes], "delivered": [0] * len(self.sizes),
                                    "extra": [0] * len(self.sizes), "examples": [[] for _ in self.sizes],
                                    "expect": self.feed.audit_expect(item), "complete": False, "last_step": -1}
        return rec

    def record(self, item) -> None:
        rec = self._epoch(item)
        if item.plan is not self._plan and self.stream is None:  # a rebalance dealt the rest again
            self._plan = item.plan
            rec["expect"] = self.feed.audit_expect(item)
        ids = np.asarray(item.ids(), np.int64)
        if self.stream is not None and item.step >= rec["last_step"]:
            rec["expect"] = self.feed.audit_expect(item)
            need = (rec["expect"]["unique"][self.stream] + 7) // 8
            bits = rec["bits"][self.stream]
            if bits.size < need:  # the stream grew: grow its bitmap (geometrically, trimmed in state())
                rec["bits"][self.stream] = np.concatenate([bits, _bits(8 * max(need - bits.size, bits.size))])
        rec["last_step"] = max(rec["last_step"], item.step)
        if self._split is None:
            parts = [(0, ids)]
        else:
            src, local = self._split(ids)
            parts = [(int(i), local[src == i]) for i in np.unique(src).tolist()]
        for i, part in parts:
            extra, again = mark(rec["bits"][i], part)
            if extra:
                rec["extra"][i] += extra
                ex = rec["examples"][i]
                ex.extend(int(x) for x in np.unique(again)[:max(0, _EXAMPLES - len(ex))])
            rec["delivered"][i] += int(part.size)

    def end_epoch(self, epoch: int) -> None:
        if epoch in self.epochs:
            self.epochs[epoch]["complete"] = True

    def state(self) -> dict:
        sizes = list(self.sizes)
        if self.stream is not None:
            # the stream's size is what was consumed: the watermark of the last recorded step
            wm = max((r["expect"]["unique"][self.stream] for r in self.epochs.values()), default=0)
            sizes[self.stream] = wm
            for r in self.epochs.values():
                b = r["bits"][self.stream]
                r["bits"][self.stream] = b[:(wm + 7) // 8] if b.size >= (wm + 7) // 8 else np.concatenate(
                    [b, _bits(8 * ((wm + 7) // 8 - b.size))])
        return {"version": VERSION, "kind": self.kind, "rank": self.feed.rank, "world_size": self.feed.world_size,
                "stream": self.stream,
                "sources": [{"name": n, "samples": s} for n, s in zip(self.names, sizes)],
                "epochs": {str(e): {"expect": r["expect"], "complete": r["complete"], "last_step": r["last_step"],
                                    "sources": [{"delivered": d, "extra": x, "examples": ex, "bits": encode(b)}
                                                for d, x, ex, b in zip(r["delivered"], r["extra"], r["examples"],
                                                                       r["bits"])]}
                           for e, r in sorted(self.epochs.items())}}


def save(state: dict, path) -> str:
    """Write an audit record (``Loader.audit_state()``) as JSON, atomically."""
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, path)
    return path


def load(path) -> dict:
    """Read an audit record written by ``save``; ValueError naming the file if it is not one."""
    path = os.fspath(path)
    try:
        with open(path) as f:
            state = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable audit record ({e}); pass files written by "
                         "shardfeed.loader.audit.save(loader.audit_state(), path)") from e
    if not isinstance(state, dict) or state.get("version") != VERSION or not isinstance(state.get("epochs"), dict):
        raise ValueError(f"{path}: audit record version {state.get('version') if isinstance(state, dict) else None!r}"
                         f" is not {VERSION} (written by another shardfeed release, or not an audit record)")
    return state
