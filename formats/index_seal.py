"""index.arrow's seal: the file's own xxh3-128, kept in its metadata.

The index's digest covers the table's values and metadata, not the bytes
that hold them: of 1,946 bytes of a small index.arrow, 775 could be flipped
unnoticed (the schema message before the batches, padding, flatbuffer
fields pyarrow reads past). The file's hash is written into its metadata in
place of a placeholder of the same length (so no offset moves) and checked
with the placeholder put back.
"""

from __future__ import annotations

import xxhash

from shardfeed.formats.errors import ShardError

UNSEALED = "0" * 32


def _token(value: str) -> bytes:
    return f'"file_digest": "{value}"'.encode()


def seal(raw: bytes) -> bytes:
    digest = xxhash.xxh3_128(raw).hexdigest()
    return raw.replace(_token(UNSEALED), _token(digest))


def check_seal(raw: bytes, meta: dict, path: str) -> None:
    value = meta.get("file_digest")
    if value is None:
        return  # an index written before the seal: its digest still covers the values
    if not (isinstance(value, str) and len(value) == 32 and all(c in "0123456789abcdef" for c in value)) \
            or raw.count(_token(value)) != 2:
        raise ShardError(path, f"index file_digest {value!r} is malformed (corrupt index)")
    if xxhash.xxh3_128(raw.replace(_token(value), _token(UNSEALED))).hexdigest() != value:
        raise ShardError(path, "index fails its file checksum (bytes damaged on disk: corrupt index); restore "
                               "it or rebuild it with `shardfeed convert`")
