"""Parsed sidecars kept in memory per process, so a reader that reopens a shard parses its sidecar once.

A ranged reader through the node cache closes its shards between reads and
reopens about 10 a batch (cache/ranged_reads.py); each open parsed and
digest-checked the sidecar again (1.1-1.7 ms each: the demo's worker spent
about a fifth of its time there). ``read_sidecar_once`` still reads the
file's bytes at every open (a few KB: one read), and reuses the parse of the
same path when the bytes are the same, byte for byte, as those it parsed; any
other bytes are parsed and checked as ``own_tables.read_sidecar`` does. So a
sidecar replaced or damaged on disk is never served from memory, whatever its
timestamps say. What it hands out is shared: SampleTables are read-only by
contract, and the metadata dict is a copy.

Bounded: at most ``MAX_BYTES`` of sidecar bytes are kept, least recently
used dropped first; a sidecar above a quarter of that, or one own_tables
declines (pyarrow reads it), is not kept.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

from shardfeed.formats import own_tables
from shardfeed.formats.files import open_regular

MAX_BYTES = 32 << 20

_memo: OrderedDict[str, tuple[bytes, object, dict]] = OrderedDict()  # path -> (its bytes, table, metadata)
_valid: dict[int, tuple[object, set]] = {}  # id(kept table) -> (the table, stream sizes it was validated for)
_held = 0
_mu = threading.Lock()
parses = 0  # sidecars parsed by read_sidecar_once (tests and benchmarks)


def read_sidecar_once(path: str, shard: str):
    """``own_tables.read_sidecar(path, shard)``, the parse reused while the file's bytes are the same."""
    global _held, parses
    from shardfeed.formats.own_tables import read_sidecar

    with open_regular(path, shard, "sidecar") as f:  # FileNotFoundError passes through, as read_sidecar's
        raw = f.read() if os.fstat(f.fileno()).st_size <= own_tables.MAX_FAST_BYTES else None
    if raw is None:
        return read_sidecar(path, shard)
    with _mu:
        got = _memo.get(path)
        if got is not None and got[0] == raw:
            _memo.move_to_end(path)
            return got[1], dict(got[2])
        parses += 1
    try:
        table, meta = own_tables.sidecar(raw)
    except own_tables.Declined:
        return read_sidecar(path, shard)  # pyarrow's checks say what is wrong with it
    if len(raw) > MAX_BYTES // 4:
        return table, meta  # kept, it would push out most others
    with _mu:
        old = _memo.pop(path, None)
        if old is not None:
            _held -= len(old[0])
            _valid.pop(id(old[1]), None)
        _held += len(raw)
        _memo[path] = (raw, table, dict(meta))
        _valid[id(table)] = (table, set())
        while _held > MAX_BYTES:
            _, (gone, gone_table, _) = _memo.popitem(last=False)
            _held -= len(gone)
            _valid.pop(id(gone_table), None)
    return table, meta


def validate_once(table, shard: str, stream_bytes: int) -> None:
    """``table.validate(shard, stream_bytes)``, once per kept table and stream size: a kept
    table is never changed, so what it was checked against once holds at every reopen."""
    with _mu:
        got = _valid.get(id(table))
        if got is not None and got[0] is table and stream_bytes in got[1]:
            return
    table.validate(shard, stream_bytes)
    with _mu:
        got = _valid.get(id(table))
        if got is not None and got[0] is table:
            got[1].add(int(stream_bytes))


def forget() -> None:
    """Drop every kept parse (tests)."""
    global _held
    with _mu:
        _memo.clear()
        _valid.clear()
        _held = 0
