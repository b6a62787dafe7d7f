"""Shard formats, dataset index, writers and codecs (no torch here)."""

from typing import TYPE_CHECKING

from shardfeed.formats.base.lazy import exports

if TYPE_CHECKING:  # what the names are, for type checkers; at run time each is imported on first use
    from shardfeed.formats.codecs import codec_of, decode_field, encode_field
    from shardfeed.formats.commit_log import publish, read_log
    from shardfeed.formats.errors import ReadError, ShardError
    from shardfeed.formats.index import DatasetIndex, ShardInfo, format_of, write_index
    from shardfeed.formats.open_dataset import compact, open_index
    from shardfeed.formats.own_tables import read_sidecar
    from shardfeed.formats.readers import ColumnarShardReader, TarShardReader, hash_file, open_shard, verify_shard
    from shardfeed.formats.shard_patterns import expand_braces, expand_source
    from shardfeed.formats.sidecar import SampleTable, scan_tar
    from shardfeed.formats.writer import ShardWriter

# public name -> the submodule that defines it (formats/base/lazy.py: nothing is imported until asked for)
_EXPORTS = {
    "codec_of": "codecs",
    "decode_field": "codecs",
    "encode_field": "codecs",
    "ReadError": "errors",
    "ShardError": "errors",
    "DatasetIndex": "index",
    "ShardInfo": "index",
    "compact": "open_dataset",
    "format_of": "index",
    "open_index": "open_dataset",
    "publish": "commit_log",
    "read_log": "commit_log",
    "write_index": "index",
    "ColumnarShardReader": "readers",
    "TarShardReader": "readers",
    "hash_file": "readers",
    "open_shard": "readers",
    "verify_shard": "readers",
    "SampleTable": "sidecar",
    "read_sidecar": "own_tables",
    "scan_tar": "sidecar",
    "expand_braces": "shard_patterns",
    "expand_source": "shard_patterns",
    "ShardWriter": "writer",
}
__getattr__, __dir__ = exports(__name__, _EXPORTS)

__all__ = [
    "ColumnarShardReader", "DatasetIndex", "ReadError", "SampleTable", "ShardError", "ShardInfo", "ShardWriter",
    "TarShardReader", "codec_of", "compact", "decode_field", "encode_field", "expand_braces", "expand_source",
    "format_of", "hash_file", "open_index", "open_shard", "publish", "read_log", "read_sidecar", "scan_tar",
    "verify_shard", "write_index",
]
