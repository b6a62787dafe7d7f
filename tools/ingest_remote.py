"""`shardfeed ingest SRC s3://bucket/prefix`: the writer behind an object-store DST.

Shards are written in a local staging folder and uploaded when full by
formats.remote_log.RemoteAppender (the sidecar, the shard, then the
create-if-absent commit), so followers on any host see each at once and
several ingests may append to one prefix. Credentials and the endpoint come
from the usual environment (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, ...), as
for `verify` and `inspect`.

Before the first sample, the store is asked to prove it honours a
conditional put (``If-None-Match: *``): a probe object is created, created
again (which must be refused) and removed. A store that lets the second put
overwrite the first (some S3-compatible servers ignore the header) would let
two writers take one commit number, so it is refused with the reason,
before anything is written.
"""

from __future__ import annotations

import os

from shardfeed.formats import ShardError

_PROBE = ".shardfeed-conditional-put-probe"


class RemoteIngestWriter:
    """What ingest asks of its writer (write, close, end_stream, abort, shards, fields,
    format, bytes_written, root), over a RemoteAppender at ``url``."""

    def __init__(self, url: str, prefix: str, storage_options: dict | None = None, **writer_kwargs):
        from shardfeed.cache.fetching.url_schemes import check_url
        from shardfeed.formats.remote_log import RemoteAppender

        check_url(url)  # shell URLs and unknown schemes, named
        self.url = str(url).rstrip("/")
        # a filesystem of its own: one fsspec cached earlier in the process may hold another endpoint
        opts = dict(storage_options or {}, skip_instance_cache=True)
        self.appender = RemoteAppender(self.url, opts, prefix=prefix, **writer_kwargs)
        try:
            check_conditional_put(self.appender.log)
        except BaseException:
            self.appender.abort()
            raise

    @property
    def root(self) -> str:
        return self.appender._stage  # a local folder (ingest stages shuffles beside it)

    @property
    def shards(self) -> list:
        return [info for _, info in self.appender.published]

    @property
    def fields(self) -> list:
        return self.appender.writer.fields

    @property
    def format(self) -> str:
        return self.appender.format

    @property
    def bytes_written(self) -> int:
        return sum(info.bytes for info in self.shards)

    def write(self, sample: dict) -> None:
        self.appender.write(sample)

    def close(self) -> None:
        self.appender.close()

    def end_stream(self) -> int:
        return self.appender.end_stream()

    def abort(self) -> None:
        self.appender.abort()


def check_conditional_put(log) -> None:
    """ShardError unless the store refuses a second create of one object (see the module docstring)."""
    probe = f"{log.path}/{_PROBE}-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        log.fs.pipe_file(probe, b"1", mode="create")
        try:
            log.fs.pipe_file(probe, b"2", mode="create")
        except FileExistsError:
            return
        raise ShardError(log.url, "this store accepted a second create-if-absent put of one object (it ignores "
                                  "If-None-Match: *), so two writers could take the same commit number and one "
                                  "commit would be lost; use a store with conditional writes (AWS S3, recent "
                                  "MinIO) or ingest into a local folder")
    except (OSError, ValueError) as e:
        if isinstance(e, FileExistsError):
            raise ShardError(log.url, f"the probe object {probe} already exists; remove it and retry") from e
        raise ShardError(log.url, f"cannot write to this prefix: {type(e).__name__}: {e}") from e
    finally:
        try:
            log.fs.rm_file(probe)
        except (OSError, ValueError):
            pass
