"""The error policy (``on_error``) and the error a dead worker raises.

``"raise"``: a corrupt sample or shard raises ShardError naming the shard and
the reason. ``"skip"``: it is left out of its batch, counted in ``stats()``
and logged once per shard (a shard with a thousand bad samples logs one line,
not a thousand).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from shardfeed.formats.errors import ReadError, ShardError

log = logging.getLogger("shardfeed.loader")

POLICIES = ("raise", "skip")


class WorkerError(RuntimeError):
    """A loader worker died or failed with a non-data error; the message names
    the worker, its pid, the batch it was making and its traceback."""


SKIP_HINT = ("to read on past damaged data, pass on_error=\"skip\" to ShardDataset: it leaves a damaged sample or "
             "shard out, counts it in Loader.stats() (errors_skipped) and logs it once per shard; `shardfeed verify "
             "DATASET` lists every damaged shard")


# what an object store's client raises when it found no credentials anywhere (botocore's names)
_NO_CREDENTIALS = ("NoCredentialsError", "PartialCredentialsError")
CREDENTIALS_HINT = ("no AWS credentials were found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE "
                    "for ~/.aws/credentials), and AWS_ENDPOINT_URL for a store other than AWS; or pass "
                    "storage_options={'key': ..., 'secret': ...} ({'anon': True} for a public bucket)")


def with_credentials_hint(e: ShardError) -> ShardError:
    """``e`` itself, or, when an object store found no credentials, the same error saying where they go."""
    cause, seen = e.__cause__ or e.__context__, 0
    while cause is not None and seen < 16:
        if type(cause).__name__ in _NO_CREDENTIALS:
            better = ShardError(e.shard, f"{e.reason}; {CREDENTIALS_HINT}")
            better.__cause__ = e
            return better
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    return e


class ErrorPolicy:
    def __init__(self, on_error: str = "raise"):
        if on_error not in POLICIES:
            raise ValueError(f"on_error={on_error!r} is not one of {POLICIES}; use 'raise' to stop at the "
                             "first corrupt sample or 'skip' to leave it out and count it")
        self.name = on_error
        self.skip = on_error == "skip"
        self._logged: set[str] = set()
        # found when the index was made, before any read: added to errors_skipped at each epoch's start
        self.left_out = 0

    def explain(self, e: BaseException) -> None:
        """Under ``"raise"``: add to a data error what ``"skip"`` would do (once)."""
        # __notes__ (Python's, on an exception) exists only once a note was added
        if not self.skip and isinstance(e, ShardError) and SKIP_HINT not in getattr(e, "__notes__", ()):
            e.add_note(SKIP_HINT)

    def report(self, errors: Iterable[ReadError]) -> int:
        """Log (once per shard) the ReadError records ``errors``; returns the samples they left out."""
        n = 0
        for e in errors:
            n += e.samples
            if e.shard not in self._logged:
                self._logged.add(e.shard)
                log.warning("skipping corrupt data in %s: %s (further errors in this shard are counted, "
                            "not logged)", e.shard, e.reason)
        return n

    def leave_out(self, errors: Iterable[ReadError]) -> None:
        """Data left out when the index was made (a foreign shard that cannot be scanned, a
        sample whose name is not UTF-8): logged now, once per shard, and counted in every
        epoch's errors_skipped (the Loader adds it as an epoch starts), as a damaged shard
        read from an index is. A shard left out whole counts once: its samples are unknown."""
        errors = list(errors)
        self.left_out += sum(max(1, e.samples) for e in errors)
        self.report(errors)

    def __repr__(self) -> str:
        return f"ErrorPolicy({self.name!r})"
