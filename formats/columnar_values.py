"""Samples bound for a Parquet or Arrow shard: int and text payloads as typed values.

A tar sample carries every field as bytes; a columnar shard stores ``cls``
as an int column and ``txt`` as a string column, so writers that copy tar
samples into columnar shards (``convert``, ``ingest``, the Ray datasink)
decode those two codecs first.
"""

from __future__ import annotations

from shardfeed.formats.codecs import codec_of, decode_field
from shardfeed.formats.errors import ShardError


def typed_for_columnar(sample: dict, where: str) -> dict:
    """Tar payloads of int and text fields become typed columns in Parquet/Arrow."""
    out = {}
    for ext, value in sample.items():
        if isinstance(value, bytes) and not ext.startswith("__") and codec_of(ext) in ("int", "text"):
            try:
                value = decode_field(ext, value)
            except (ValueError, UnicodeDecodeError) as e:
                raise ShardError(where, f"sample {sample.get('__key__')!r} field {ext!r}: {e}") from None
        out[ext] = value
    return out
