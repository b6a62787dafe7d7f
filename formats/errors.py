"""The one error type for bad input: every message names the shard and the reason.

ShardError is raised; ReadError is its record when damaged data is skipped
instead (``on_error="skip"``): a value listed in ``RawBatch.errors`` and in a
batch's info, counted and logged by the loader's ErrorPolicy.
"""

from __future__ import annotations

from shardfeed.formats.base.records import FrozenSlotRecord


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


class ReadError(FrozenSlotRecord):
    """Samples left out of a batch: ``samples`` of them, from the shard at
    ``shard`` (path or URL), for ``reason``. Travels from worker processes to
    the main process as a value (it pickles)."""

    # a frozen slot record, not a dataclass: the same fields, repr, ==, hash and immutability, without
    # compiling generated methods at import (issue #24)
    __slots__ = __match_args__ = ("shard", "reason", "samples")

    def __init__(self, shard: str, reason: str, samples: int):
        self._set("shard", shard)
        self._set("reason", reason)
        self._set("samples", samples)

    @classmethod
    def of(cls, error: ShardError, samples: int) -> ReadError:
        """The record of ``samples`` left out because of ``error``."""
        return cls(error.shard, error.reason, samples)

    # Read as the (shard, reason, samples) tuple it replaces, for callers that unpack it.
    def __iter__(self):
        return iter((self.shard, self.reason, self.samples))

    def __getitem__(self, i):
        return (self.shard, self.reason, self.samples)[i]
