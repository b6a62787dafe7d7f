"""The commit log of a growing dataset: ``_log/<seq>.json``, one commit a file.

A commit is either a published shard (a ShardInfo) or the end of the stream
(``{"kind": "end"}``). Sequence numbers are taken with a no-overwrite hard
link (create-if-absent), so concurrent writers never take the same one, a
reader never sees a partial entry, and the numbers have no holes: a writer
links at (highest it listed) + 1 and walks up only past names that exist.

No holes is what makes the end final: a writer that listed the log either
saw the end (it is the highest entry, nothing is ever linked past it) or
walks up through every number linked since, the end's included, and stops
there. So no shard is ever committed after the end, and every follower sees
the same stream, whatever the interleaving of writers.

Readers hold the log to those rules rather than trust them: a hole (an
entry missing below the highest) or a name committed twice is damage
(ShardError naming the seqs), never a silently shorter or doubled stream.
A writer refuses to commit a name the dataset already holds, or anything
once an end exists at any seq (it reads every entry once, then only new
ones: see _Scan).
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

from shardfeed.formats.base.records import SlotRecord
from shardfeed.formats.errors import ShardError
from shardfeed.formats.files import open_regular
from shardfeed.formats.index import (
    FORMATS,
    INDEX_NAME,
    LOG_DIR,
    MAX_COUNT,
    DatasetIndex,
    ShardInfo,
    check_shard_name,
    check_unique_names,
)
from shardfeed.formats.own_tables import read_index_file

_SEQ_RE = re.compile(r"^(\d{12})\.json$")
END = "end"
_MAX_ENTRY = 1 << 16  # bytes of one entry read at most (entries are tiny; a huge one is damage)


class LogView(SlotRecord):
    """Commits after ``after``: published shards (seq, info) in commit order and the end's seq (or None)."""

    # a SlotRecord, not a dataclass: a dataclass compiles its methods at import (issue #24); not frozen: nothing assigns to it
    __slots__ = ("shards", "end", "fields")

    def __init__(self, shards: list, end: int | None, fields: tuple = ()):
        self.shards = shards
        self.end = end
        self.fields = fields  # field names the shards' commits record, first seen first

    @property
    def last_seq(self) -> int | None:
        if self.end is not None:
            return self.end
        return self.shards[-1][0] if self.shards else None


def _parse(path: str) -> dict:
    try:
        with open_regular(path, what="commit log entry") as f:
            rec = json.loads(f.read(_MAX_ENTRY))
        if not isinstance(rec, dict):
            raise ValueError("entry is not a JSON object")
        return rec
    except (ValueError, UnicodeDecodeError) as err:
        raise ShardError(path, f"commit log entry is malformed: {err}") from err


def _is_end(rec: dict) -> bool:
    return rec.get("kind") == END


def _shard(rec: dict, path: str) -> ShardInfo:
    try:
        info = ShardInfo(check_shard_name(rec["name"], path), rec["format"], int(rec["samples"]),
                         int(rec["bytes"]), str(rec["hash"]))
    except (ValueError, KeyError, TypeError) as err:
        raise ShardError(path, f"commit log entry is malformed: {err!r}") from err
    if info.format not in FORMATS or not 0 <= info.samples < MAX_COUNT or not 0 <= info.bytes < MAX_COUNT:
        raise ShardError(path, f"commit log entry has bad values {rec!r}")
    return info


def _fields(rec: dict, path: str) -> list:
    got = rec.get("fields", [])
    if not isinstance(got, list) or len(got) > 4096 or not all(isinstance(f, str) and 0 < len(f) <= 256 for f in got):
        raise ShardError(path, f"commit log entry has a bad fields list {str(got)[:200]}")
    return got


def _seqs(log: str) -> list[int]:
    try:
        names = os.listdir(log)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for e in names if (m := _SEQ_RE.match(e)))


def check_no_holes(seqs: list[int], after: int, where: str, base) -> list[int]:
    """The listed ``seqs`` above ``after``, which must run on without a gap.
    ``base()`` (called only on a gap at the start) is the last seq folded into
    index.arrow: entries at or below it may be gone, the index holds them."""
    seqs = [s for s in seqs if s > after]
    if seqs and seqs[0] != after + 1:
        after = max(after, base())
        seqs = [s for s in seqs if s > after]
    expect = after + 1
    for s in seqs:
        if s != expect:
            raise ShardError(where, f"commit {expect} is missing from the log (the entries go on at {s}): the log "
                                    "is damaged (a hole); its shards would be silently left out of the stream. "
                                    "Restore the entry from a good copy")
        expect += 1
    return seqs


def check_new_names(known: dict, shards, where: str) -> None:
    """Add ``shards`` ((seq, info) pairs) to ``known`` (name -> seq); a name
    already there is damage: the shard would be delivered twice."""
    for seq, info in shards:
        first = known.setdefault(info.name, seq)
        if first != seq:
            raise ShardError(where, f"shard {info.name} is committed twice (commits {first} and {seq}): the log is "
                                    "damaged; its samples would be delivered twice. Remove the later entry")


def read_commits(root: str, after: int = 0, upto: int | None = None) -> LogView:
    """Commits with sequence number > ``after`` (and <= ``upto``: a follower's
    mirror of a remote log reads no further than it checked). Anything
    committed after an end (only a damaged or hand-edited log has that), a
    hole or a name committed twice among them is an error."""
    log = os.path.join(root, LOG_DIR)
    shards, end, fields = [], None, {}
    seqs = _seqs(log) if upto is None else [s for s in _seqs(log) if s <= upto]
    for seq in check_no_holes(seqs, after, log, lambda: base_log_seq(root)):
        path = os.path.join(log, f"{seq:012d}.json")
        if end is not None:
            raise ShardError(path, f"commit {seq} comes after the end of the stream (commit {end}): "
                                   "the log is damaged; nothing may be published after end_stream()")
        rec = _parse(path)
        if _is_end(rec):
            end = seq
        else:
            shards.append((seq, _shard(rec, path)))
            fields.update(dict.fromkeys(_fields(rec, path)))
    check_new_names({}, shards, log)
    return LogView(shards, end, tuple(fields))


def with_entries(names, formats, counts, sizes, hashes, entries) -> tuple:
    """An index's columns (names, formats, counts, sizes, hashes) with the log's ``entries``
    (``(seq, ShardInfo)`` pairs) appended, in order."""
    return (list(names) + [e.name for _, e in entries], list(formats) + [e.format for _, e in entries],
            np.concatenate([np.asarray(counts, np.int64), [e.samples for _, e in entries]]),
            np.concatenate([np.asarray(sizes, np.int64), [e.bytes for _, e in entries]]),
            list(hashes) + [e.hash for _, e in entries])


def read_log(root: str, after: int = 0) -> list[tuple[int, ShardInfo]]:
    """Published shards with sequence number > ``after``, in commit order (the end marker left out)."""
    return read_commits(root, after).shards


def ended(root: str) -> int | None:
    """The seq of the end-of-stream commit, or None while the stream is open."""
    return read_commits(root).end


def base_log_seq(root: str) -> int:
    """The last commit folded into index.arrow (0 without one)."""
    path = os.path.join(root, INDEX_NAME)
    if not os.path.exists(path):
        return 0
    meta, _ = read_index_file(path, root)
    return int(meta.get("log_seq", 0))


class _Scan:
    """What a writer knows of a log: every committed name and the end, read
    once and then only the entries past the last one read (a writer that
    commits a shard a minute pays for one entry a commit, not the log)."""

    _by_log: dict = {}

    def __init__(self):
        self.upto, self.names, self.end, self.index_key, self.index_names = 0, {}, None, None, frozenset()
        self.last = None  # (inode, mtime, size) of entry ``upto``: tells a log made again at the same path

    @staticmethod
    def _stamp(path: str):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    @classmethod
    def of(cls, root: str, seqs: list[int]) -> _Scan:
        log = os.path.realpath(os.path.join(root, LOG_DIR))
        key = (log, os.stat(log).st_ino)  # a log deleted and made again at the same path is another log
        scan = cls._by_log.setdefault(key, cls())
        # the log was replaced under the writer: start over. A folder deleted and made again often
        # gets the old inode back, so the key alone does not tell; the last entry read does (an
        # ended stream's scan once refused every commit to the new, empty log at the same path)
        if scan.upto and (not seqs or seqs[-1] < scan.upto
                          or cls._stamp(os.path.join(log, f"{scan.upto:012d}.json")) != scan.last):
            scan = cls._by_log[key] = cls()
        scan._index(root)
        for seq in seqs:
            if seq > scan.upto:
                path = os.path.join(log, f"{seq:012d}.json")
                try:
                    rec = _parse(path)
                except FileNotFoundError:
                    continue
                scan.note(seq, rec, path)
                if seq == scan.upto:
                    scan.last = cls._stamp(path)
        return scan

    def note(self, seq: int, rec: dict, path: str) -> None:
        if _is_end(rec):
            self.end = seq if self.end is None else min(self.end, seq)
        else:
            self.names.setdefault(_shard(rec, path).name, seq)
        self.upto = max(self.upto, seq)

    def _index(self, root: str) -> None:
        path = os.path.join(root, INDEX_NAME)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self.index_key, self.index_names = None, frozenset()
            return
        if self.index_key != (st.st_mtime_ns, st.st_size, st.st_ino):
            _, cols = read_index_file(path, root)
            self.index_key, self.index_names = (st.st_mtime_ns, st.st_size, st.st_ino), frozenset(cols[0])

    def refuse(self, root: str, what: str, name: str | None) -> None:
        if self.end is not None:
            raise ShardError(root, f"cannot commit {what}: the stream was ended by commit {self.end} "
                                   "(end_stream); start a new dataset folder to publish more")
        if name is not None and (name in self.names or name in self.index_names):
            where = f"commit {self.names[name]}" if name in self.names else INDEX_NAME
            raise ShardError(root, f"cannot commit {what}: it is already committed ({where}); a name is "
                                   "committed at most once (a second commit would deliver its samples twice)")


def _commit(root: str, record: dict, what: str, name: str | None = None) -> int:
    log = os.path.join(root, LOG_DIR)
    os.makedirs(log, exist_ok=True)
    tmp = os.path.join(log, f".tmp-{os.getpid()}-{os.urandom(6).hex()}")
    with open(tmp, "w") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    try:
        seqs = _seqs(log)
        scan = _Scan.of(root, seqs)
        scan.refuse(root, what, name)
        seq = seqs[-1] + 1 if seqs else base_log_seq(root) + 1
        while True:
            path = os.path.join(log, f"{seq:012d}.json")
            try:
                os.link(tmp, path)
                scan.note(seq, record, path)
                return seq
            except FileExistsError:
                # another writer took this number (a listing older than it, or a race): what it holds
                # counts as if listed, so an end or this very name there stops this writer
                scan.note(seq, _parse(path), path)
                if scan.end is not None:
                    raise ShardError(root, f"cannot commit {what}: the stream was ended by commit {scan.end} "
                                           "(end_stream) while this writer was publishing; start a new "
                                           "dataset folder to publish more") from None
                scan.refuse(root, what, name)
                seq += 1
    finally:
        os.unlink(tmp)


def publish(root: str, info: ShardInfo, fields=()) -> int:
    """Commit one completely written shard to a live dataset; returns its sequence number.
    ``fields``: the sample fields written so far (the index lists them). ShardError once the stream has ended."""
    check_shard_name(info.name, root)
    record = dict(info.__dict__)
    if fields:
        record["fields"] = list(fields)
    return _commit(root, record, f"shard {info.name}", info.name)


def end_stream(root: str) -> int:
    """Commit the end of the stream; returns its sequence number. Ending twice is an error."""
    return _commit(root, {"kind": END}, "the end of the stream")


def open_stream_index(root: str, upto: int | None = None) -> tuple[DatasetIndex, LogView]:
    """(index of every published shard, the log read after index.arrow's
    ``log_seq``: its shards and end seq or None): index.arrow's rows,
    then the log's shards after its ``log_seq``, in commit order. Sample ids
    are offsets in this order, so they never change as the log grows or is
    compacted."""
    path = os.path.join(root, INDEX_NAME)
    log_seq, fields = 0, []
    names, formats, counts, sizes, hashes = [], [], [], [], []
    meta: dict = {}
    if os.path.exists(path):
        meta, (names, formats, counts, sizes, hashes) = read_index_file(path, root)
        log_seq = int(meta.get("log_seq", 0))
        fields = meta.get("fields", [])
    elif not os.path.isdir(os.path.join(root, LOG_DIR)):
        raise ShardError(root, f"not a growing dataset: no {INDEX_NAME} and no commit log ({LOG_DIR}/); "
                               "create it with ShardWriter(root, append=True)")
    view = read_commits(root, after=log_seq, upto=upto)
    fields = list(dict.fromkeys([*fields, *view.fields]))
    entries = view.shards
    check_unique_names(list(names) + [e.name for _, e in entries], root)
    check_new_names({}, entries, root)
    if entries:
        names, formats, counts, sizes, hashes = with_entries(names, formats, counts, sizes, hashes, entries)
    last = view.last_seq
    meta = dict(meta, log_seq=entries[-1][0] if entries else log_seq, folded_seq=log_seq)
    if view.end is not None:
        meta["end_seq"] = view.end
    idx = DatasetIndex(root, names, formats, np.asarray(counts, np.int64), np.asarray(sizes, np.int64), hashes,
                       fields, meta)
    idx.meta["seen_seq"] = last if last is not None else log_seq
    return idx, view
