"""``shardfeed train --audit``: each rank's coverage record beside the checkpoint.

Every rank saves ``Loader.audit_state()`` (shardfeed.loader.audit) into
``CHECKPOINT.audit/steps-<from>-<to>-rank<r>-of-<w>.json``: the batches this
run delivered from step ``from`` (where it started or resumed) to step ``to``
(the checkpoint the record belongs to). ``shardfeed audit CHECKPOINT.audit/*``
then merges a run and its resumed runs, at any world sizes, into whole epochs.

Why the step range in the name: a record must describe exactly the batches
the checkpoint says were consumed, or the audit reports repeats or misses
that never happened. A crash can land between a rank writing its record and
rank 0 writing the checkpoint, so the records are written first, the
previous ones are deleted only once the checkpoint is on disk, and a run
that starts at step k deletes every record reaching past k (their batches
after k are delivered again by this run).
"""

from __future__ import annotations

import os
import re

from shardfeed.loader import audit

_NAME = re.compile(r"^steps-(\d+)-(\d+)-rank\d+-of-\d+\.json$")


def folder_of(checkpoint: str) -> str:
    return checkpoint + ".audit"


def _records(folder: str) -> list[tuple[int, int, str]]:
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        m = _NAME.match(name)
        if m:
            found.append((int(m[1]), int(m[2]), os.path.join(folder, name)))
    return found


class AuditRecords:
    """One rank's records of one run (started at ``start_step``)."""

    def __init__(self, checkpoint: str, rank: int, world: int, start_step: int):
        self.folder, self.rank, self.world, self.start = folder_of(checkpoint), rank, world, start_step

    def discard_future(self) -> None:
        """Rank 0, before training: drop records of batches after this run's start."""
        for _, end, path in _records(self.folder):
            if end > self.start:
                os.unlink(path)

    def write(self, loader, step: int) -> str:
        os.makedirs(self.folder, exist_ok=True)
        name = f"steps-{self.start:07d}-{step:07d}-rank{self.rank}-of-{self.world}.json"
        return audit.save(loader.audit_state(), os.path.join(self.folder, name))

    def drop_older(self, step: int) -> None:
        """After the checkpoint of ``step`` is on disk: this rank's earlier records of this run."""
        suffix = f"-rank{self.rank}-of-{self.world}.json"
        for start, end, path in _records(self.folder):
            if start == self.start and end < step and path.endswith(suffix):
                os.unlink(path)
