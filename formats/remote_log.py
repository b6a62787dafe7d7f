"""The commit log of a growing dataset in an object store (``s3://``, ...).

The same log as commit_log.py (``<url>/_log/<seq>.json``, one commit an
object, the end a ``{"kind": "end"}`` entry) with the same no-holes rule,
where create-if-absent is the store's conditional put (S3: ``PUT`` with
``If-None-Match: *``, through fsspec's ``pipe_file(mode="create")``): a writer
lists the log, puts at (highest) + 1, and on a refusal (412, FileExistsError)
reads the entry that won and walks up unless it is the end. So writers on any
number of hosts append without a lost commit, and nothing lands after an end.

``RemoteAppender`` is a ShardWriter whose finished shards are uploaded (the
sidecar first, the shard, then the commit), so a reader that sees a commit
finds both objects complete. Readers follow the remote log through the node
cache (cache/remote_index.py mirrors ``_log/``); this module knows nothing of
the cache. A store without conditional put is refused, never raced.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import tempfile

from shardfeed.formats.commit_log import END, LogView, _fields, _shard, check_new_names, check_no_holes
from shardfeed.formats.errors import ShardError
from shardfeed.formats.index import INDEX_NAME, LOG_DIR, ShardInfo, check_shard_name
from shardfeed.formats.own_tables import parse_index_bytes
from shardfeed.formats.sidecar import SIDECAR_SUFFIX

_SEQ_RE = re.compile(r"^(\d{12})\.json$")
_MAX_ENTRY = 1 << 16
# schemes whose fsspec filesystem implements pipe_file(mode="create") as an atomic conditional put
# (an object appears whole or not at all). A local folder uses commit_log.py's hard links instead:
# fsspec's local "create" opens with O_EXCL and writes after, so a reader could see half an entry.
CONDITIONAL_PUT = ("s3", "s3a")


class RemoteLog:
    """The commit log at ``url`` (a dataset prefix), through fsspec."""

    def __init__(self, url: str, storage_options: dict | None = None):
        import fsspec

        self.url = str(url).rstrip("/")
        scheme = self.url.split("://", 1)[0] if "://" in self.url else "file"
        if scheme not in CONDITIONAL_PUT:
            raise ShardError(self.url, f"{scheme}:// has no atomic create-if-absent put that shardfeed uses, so "
                                       "two writers could overwrite one commit; for a local folder use "
                                       "ShardWriter(append=True), for a bucket s3:// "
                                       f"(supported: {', '.join(CONDITIONAL_PUT)})")
        # every listing must be fresh: a cached one hides commits and the end
        opts = dict(storage_options or {}, use_listings_cache=False)
        self.fs, self.path = fsspec.core.url_to_fs(self.url, **opts)
        self.log = f"{self.path}/{LOG_DIR}"
        # what this writer has read of the log (as commit_log._Scan): every committed name and the
        # end, read once, then only entries past ``_upto``; index.arrow's names, by its ETag
        self._names: dict[str, int] = {}
        self._upto, self._end, self._index_tag, self._index_names = 0, None, None, frozenset()

    def _entry(self, seq: int) -> str:
        return f"{self.log}/{seq:012d}.json"

    def seqs(self) -> list[int]:
        try:
            listed = self.fs.ls(self.log, detail=False, refresh=True)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for p in listed if (m := _SEQ_RE.match(p.rstrip("/").rsplit("/", 1)[-1])))

    def read_entry(self, seq: int) -> dict:
        where = f"{self.url}/{LOG_DIR}/{seq:012d}.json"
        try:
            # a plain GET: open() would consult a listing cached a moment ago and miss a newer entry
            rec = json.loads(self.fs.cat_file(self._entry(seq), start=0, end=_MAX_ENTRY))
        except (ValueError, UnicodeDecodeError) as e:
            raise ShardError(where, f"commit log entry is malformed: {e}") from e
        if not isinstance(rec, dict):
            raise ShardError(where, "commit log entry is malformed: not a JSON object")
        return rec

    def base_seq(self) -> int:
        """The last commit folded into the remote index.arrow (0 without one)."""
        import pyarrow as pa

        try:
            data = self.fs.cat_file(f"{self.path}/{INDEX_NAME}")
        except FileNotFoundError:
            return 0
        try:
            meta = json.loads((pa.ipc.open_file(io.BytesIO(data)).schema.metadata or {})[b"shardfeed.index"])
            return int(meta.get("log_seq", 0))
        except (pa.ArrowInvalid, KeyError, ValueError, TypeError) as e:
            raise ShardError(f"{self.url}/{INDEX_NAME}", f"is not a readable shardfeed index: {e}") from e

    def read_commits(self, after: int = 0) -> LogView:
        shards, end, fields = [], None, {}
        for seq in check_no_holes(self.seqs(), after, f"{self.url}/{LOG_DIR}", self.base_seq):
            where = f"{self.url}/{LOG_DIR}/{seq:012d}.json"
            if end is not None:
                raise ShardError(where, f"commit {seq} comes after the end of the stream (commit {end}): "
                                        "the log is damaged; nothing may be published after end_stream()")
            rec = self.read_entry(seq)
            if rec.get("kind") == END:
                end = seq
            else:
                shards.append((seq, _shard(rec, where)))
                fields.update(dict.fromkeys(_fields(rec, where)))
        check_new_names({}, shards, f"{self.url}/{LOG_DIR}")
        return LogView(shards, end, tuple(fields))

    def try_commit(self, seq: int, record: dict) -> bool:
        """Create entry ``seq`` if absent: True if this call created it, False if it existed."""
        try:
            self.fs.pipe_file(self._entry(seq), json.dumps(record).encode(), mode="create")
            return True
        except FileExistsError:
            return False

    def _note(self, seq: int, rec: dict) -> None:
        if rec.get("kind") == END:
            self._end = seq if self._end is None else min(self._end, seq)
        else:
            self._names.setdefault(_shard(rec, f"{self.url}/{LOG_DIR}/{seq:012d}.json").name, seq)
        self._upto = max(self._upto, seq)

    def _scan(self) -> list[int]:
        """List the log and read the entries not read before; returns the listing."""
        seqs = self.seqs()
        if seqs and seqs[-1] < self._upto:  # the log was rewritten under this writer: read it afresh
            self._names, self._upto, self._end = {}, 0, None
        for seq in seqs:
            if seq > self._upto:
                try:
                    self._note(seq, self.read_entry(seq))
                except FileNotFoundError:
                    continue  # folded into index.arrow and removed since the listing
        try:
            tag = self.fs.info(f"{self.path}/{INDEX_NAME}", refresh=True).get("ETag")
        except FileNotFoundError:
            self._index_tag, self._index_names = None, frozenset()
        else:
            if tag is None or tag != self._index_tag:
                where = f"{self.url}/{INDEX_NAME}"
                self._index_names = frozenset(parse_index_bytes(self.fs.cat_file(f"{self.path}/{INDEX_NAME}"),
                                                                where)[1][0])
                self._index_tag = tag
        return seqs

    def committed(self, name: str) -> str | None:
        """Where ``name`` is already committed ("commit N" or index.arrow), as of the last scan; None if not."""
        if name in self._names:
            return f"commit {self._names[name]}"
        return INDEX_NAME if name in self._index_names else None

    def _refuse(self, what: str, name: str | None) -> None:
        if self._end is not None:
            raise ShardError(self.url, f"cannot commit {what}: the stream was ended by commit {self._end} "
                                       "(end_stream); start a new dataset prefix to publish more")
        held = self.committed(name) if name is not None else None
        if held is not None:
            raise ShardError(f"{self.url}/{name}", f"cannot commit {what}: it is already committed ({held}); a "
                                                   "name is committed at most once (a second commit would "
                                                   "deliver its samples twice)")

    def check_new(self, name: str) -> None:
        """ShardError unless ``name`` may still be committed (not committed, the stream not ended): the
        appender asks before uploading, so a committed object is never written over."""
        self._scan()
        self._refuse(f"shard {name}", name)

    def commit(self, record: dict, what: str, name: str | None = None) -> int:
        seqs = self._scan()
        self._refuse(what, name)
        seq = seqs[-1] + 1 if seqs else self.base_seq() + 1
        while not self._put(seq, record):
            held = self.read_entry(seq)
            if held == record:
                # our own put landed and its response was lost (s3fs retried it, or we did): the entry
                # at seq is this commit; walking on would commit the same shard again at seq + 1
                self._note(seq, held)
                return seq
            # another writer took this number: what it holds counts as listed, so an end or this
            # very name there stops this writer
            self._note(seq, held)
            if self._end is not None:
                raise ShardError(self.url, f"cannot commit {what}: the stream was ended by commit {self._end} "
                                           "(end_stream) while this writer was publishing")
            self._refuse(what, name)
            seq += 1
        self._note(seq, record)
        return seq

    def _put(self, seq: int, record: dict, attempts: int = 4) -> bool:
        """try_commit, retried at the same seq when the outcome is unknown (a
        reset or timeout after the request was sent): the retry's 412 is then
        told apart by reading the entry back (commit())."""
        for attempt in range(attempts):
            try:
                return self.try_commit(seq, record)
            except FileExistsError:
                return False
            except (ConnectionError, TimeoutError, OSError) as e:
                if attempt == attempts - 1:
                    raise ShardError(f"{self.url}/{LOG_DIR}/{seq:012d}.json",
                                     f"commit failed after {attempts} attempts: {e!r}") from e
        return False

    def publish(self, info: ShardInfo, fields=()) -> int:
        """Commit one uploaded shard; ``fields``: the sample fields written so far (the index lists them)."""
        check_shard_name(info.name, self.url)
        record = dict(info.__dict__)
        if fields:
            record["fields"] = list(fields)
        return self.commit(record, f"shard {info.name}", info.name)

    def end_stream(self) -> int:
        return self.commit({"kind": END}, "the end of the stream")


class RemoteAppender:
    """Append samples to a growing dataset at ``url``: shards are written in a
    local staging folder, uploaded when full and committed to the remote log.

    >>> with RemoteAppender("s3://bucket/ds", storage_options, max_shard_samples=1000) as w:
    ...     w.write({"__key__": "a", "cls": 1})
    """

    def __init__(self, url: str, storage_options: dict | None = None, stage_dir: str | None = None,
                 prefix: str = "shard", **writer_kwargs):
        import time

        from shardfeed.formats.writer import ShardWriter

        self.log = RemoteLog(url, storage_options)
        self._stage = tempfile.mkdtemp(prefix=".remote-append-", dir=stage_dir)
        # a unique prefix per writer: two hosts must never upload to one shard name
        tag = f"{prefix}-{time.time_ns():x}-{os.getpid()}-{os.urandom(3).hex()}"
        self.writer = ShardWriter(self._stage, prefix=tag, **writer_kwargs)
        self.published: list[tuple[int, ShardInfo]] = []
        self._closed = False

    @property
    def format(self) -> str:
        return self.writer.format

    def _upload_finished(self) -> None:
        while len(self.published) < len(self.writer.shards):
            info = self.writer.shards[len(self.published)]
            local = os.path.join(self._stage, info.name)
            remote = f"{self.log.path}/{info.name}"
            self.log.check_new(info.name)  # before any upload: a committed shard's objects are never replaced
            if os.path.exists(local + SIDECAR_SUFFIX):  # the sidecar first: a committed shard has both
                self._upload_new(local + SIDECAR_SUFFIX, remote + SIDECAR_SUFFIX)
            self._upload_new(local, remote)
            self.published.append((self.log.publish(info, self.writer.fields), info))
            for suffix in (SIDECAR_SUFFIX, ""):
                if os.path.exists(local + suffix):
                    os.unlink(local + suffix)

    def _upload_new(self, local: str, remote: str) -> None:
        """Put ``local`` at ``remote`` only if no object is there (a conditional put): an object already
        there is refused unless it holds these very bytes (our own put whose response was lost)."""
        try:
            self.log.fs.put_file(local, remote, mode="create")
        except FileExistsError:
            if not _same_bytes(self.log.fs, remote, local):
                raise ShardError(f"{self.log.url}/{remote[len(self.log.path) + 1:]}",
                                 "another object is already stored under this name (uncommitted, or committed "
                                 "by another writer); refusing to write over it") from None

    def write(self, sample: dict) -> None:
        self.writer.write(sample)
        self._upload_finished()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.writer.close()  # finishes the last shard (and a local index nobody reads)
            self._upload_finished()
        finally:
            shutil.rmtree(self._stage, ignore_errors=True)

    def end_stream(self) -> int:
        self.close()
        return self.log.end_stream()

    def abort(self) -> None:
        self._closed = True
        self.writer.abort()
        shutil.rmtree(self._stage, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
        else:
            self.close()


def _same_bytes(fs, remote: str, local: str, chunk: int = 8 << 20) -> bool:
    if fs.info(remote, refresh=True)["size"] != os.path.getsize(local):
        return False
    with fs.open(remote, "rb", cache_type="none") as r, open(local, "rb") as f:
        while True:
            a = f.read(chunk)
            if a != r.read(len(a) or 1):
                return False
            if not a:
                return True
