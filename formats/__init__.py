"""Shard formats, dataset index, writers and codecs (no torch here)."""

from shardfeed.formats.codecs import codec_of, decode_field, encode_field
from shardfeed.formats.errors import ReadError, ShardError
from shardfeed.formats.index import (
                                     DatasetIndex,
                                     ShardInfo,
                                     compact,
                                     format_of,
                                     open_index,
                                     publish,
                                     read_log,
                                     write_index,
)
from shardfeed.formats.readers import ColumnarShardReader, TarShardReader, hash_file, open_shard, verify_shard
from shardfeed.formats.sidecar import SampleTable, read_sidecar, scan_tar
from shardfeed.formats.sources import expand_braces, expand_source
from shardfeed.formats.writer import ShardWriter

__all__ = [
    "ColumnarShardReader", "DatasetIndex", "ReadError", "SampleTable", "ShardError", "ShardInfo", "ShardWriter",
    "TarShardReader", "codec_of", "compact", "decode_field", "encode_field", "expand_braces", "expand_source",
    "format_of", "hash_file", "open_index", "open_shard", "publish", "read_log", "read_sidecar", "scan_tar",
    "verify_shard", "write_index",
]
