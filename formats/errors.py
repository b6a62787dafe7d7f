"""The one error type for bad input: every message names the shard and the reason."""

from __future__ import annotations


class ShardError(Exception):
    """A shard, index or URL could not be read as data.

    ``shard`` is the path or URL of the offending file (or dataset root) and
    ``reason`` says what was wrong with it, so a user can find and fix it.
    """

    def __init__(self, shard: str, reason: str):
        self.shard = str(shard)
        self.reason = reason
        super().__init__(f"{self.shard}: {reason}")

    def __reduce__(self):
        # Travels from worker processes to the main process intact.
        return (type(self), (self.shard, self.reason))
