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
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

import numpy as np

from shardfeed.formats.errors import ShardError
from shardfeed.formats.files import open_regular
from shardfeed.formats.index import (
    FORMATS,
    INDEX_NAME,
    LOG_DIR,
    MAX_COUNT,
    DatasetIndex,
    ShardInfo,
    _read_index_file,
    check_shard_name,
)

_SEQ_RE = re.compile(r"^(\d{12})\.json$")
END = "end"
_MAX_ENTRY = 1 << 16  # bytes of one entry read at most (entries are tiny; a huge one is damage)


@dataclass(frozen=True)
class LogView:
    """Commits after ``after``: published shards (seq, info) in commit order and the end's seq (or None)."""

    shards: list
    end: int | None
    fields: tuple = ()  # field names the shards' commits record, first seen first

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


def read_commits(root: str, after: int = 0) -> LogView:
    """Commits with sequence number > ``after``. Anything committed after an
    end (only a damaged or hand-edited log has that) is an error."""
    log = os.path.join(root, LOG_DIR)
    shards, end, fields = [], None, {}
    for seq in _seqs(log):
        if seq <= after:
            continue
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
    return LogView(shards, end, tuple(fields))


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
    meta, _ = _read_index_file(path, root)
    return int(meta.get("log_seq", 0))


def _commit(root: str, record: dict, what: str) -> int:
    log = os.path.join(root, LOG_DIR)
    os.makedirs(log, exist_ok=True)
    tmp = os.path.join(log, f".tmp-{os.getpid()}-{os.urandom(6).hex()}")
    with open(tmp, "w") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    try:
        seqs = _seqs(log)
        if seqs:
            top = os.path.join(log, f"{seqs[-1]:012d}.json")
            if _is_end(_parse(top)):
                raise ShardError(root, f"cannot commit {what}: the stream was ended by commit {seqs[-1]} "
                                       "(end_stream); start a new dataset folder to publish more")
        seq = seqs[-1] + 1 if seqs else base_log_seq(root) + 1
        while True:
            path = os.path.join(log, f"{seq:012d}.json")
            try:
                os.link(tmp, path)
                return seq
            except FileExistsError:
                # another writer took this number; if it ended the stream, stop here
                if _is_end(_parse(path)):
                    raise ShardError(root, f"cannot commit {what}: the stream was ended by commit {seq} "
                                           "(end_stream) while this writer was publishing; start a new "
                                           "dataset folder to publish more") from None
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
    return _commit(root, record, f"shard {info.name}")


def end_stream(root: str) -> int:
    """Commit the end of the stream; returns its sequence number. Ending twice is an error."""
    return _commit(root, {"kind": END}, "the end of the stream")


def open_stream_index(root: str) -> tuple[DatasetIndex, LogView]:
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
        meta, (names, formats, counts, sizes, hashes) = _read_index_file(path, root)
        log_seq = int(meta.get("log_seq", 0))
        fields = meta.get("fields", [])
    elif not os.path.isdir(os.path.join(root, LOG_DIR)):
        raise ShardError(root, f"not a growing dataset: no {INDEX_NAME} and no commit log ({LOG_DIR}/); "
                               "create it with ShardWriter(root, append=True)")
    view = read_commits(root, after=log_seq)
    fields = list(dict.fromkeys([*fields, *view.fields]))
    entries = view.shards
    if entries:
        names = list(names) + [e.name for _, e in entries]
        formats = list(formats) + [e.format for _, e in entries]
        counts = np.concatenate([np.asarray(counts, np.int64), [e.samples for _, e in entries]])
        sizes = np.concatenate([np.asarray(sizes, np.int64), [e.bytes for _, e in entries]])
        hashes = list(hashes) + [e.hash for _, e in entries]
    last = view.last_seq
    meta = dict(meta, log_seq=entries[-1][0] if entries else log_seq, folded_seq=log_seq)
    if view.end is not None:
        meta["end_seq"] = view.end
    idx = DatasetIndex(root, names, formats, np.asarray(counts, np.int64), np.asarray(sizes, np.int64), hashes,
                       fields, meta)
    idx.meta["seen_seq"] = last if last is not None else log_seq
    return idx, view
