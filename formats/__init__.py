"""Shard formats, dataset index, writers and codecs (no torch here)."""

from shardfeed.formats.errors import ShardError

__all__ = ["ShardError"]
