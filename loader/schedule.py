"""Batch size (per rank) and image size over epochs: progressive and cyclic training.

A stage is a batch size (one int for every rank, or one per rank: dual-batch
training on mixed hardware) and an optional image size handed to decoding
(JPEG draft mode) and to a transform that takes ``image_size``. Stages change
only at epoch boundaries; a change does not restart the loader's workers or
close the shards they hold open.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from shardfeed.formats.base.records import FrozenSlotRecord


def _check_bs(value, where: str):
    if isinstance(value, bool):
        raise TypeError(f"{where}: batch size must be an int or a list of ints, got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"{where}: batch size {value} must be >= 1")
        return value
    if isinstance(value, (list, tuple)) and value:
        out = tuple(value)
        for i, v in enumerate(out):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{where}: batch size of rank {i} is {v!r}; every rank needs an int >= 1")
        return out
    raise TypeError(f"{where}: batch size must be an int or a non-empty list of ints (one per rank), got {value!r}")


class Stage(FrozenSlotRecord):
    """``batch_size``: int or tuple (one per rank); ``image_size``: decode/transform
    target or None; ``epochs``: how long the stage lasts in a BatchSchedule."""

    # a frozen slot record, not a dataclass: the same fields, repr, ==, hash and immutability, without
    # compiling generated methods at import (issue #24)
    __slots__ = __match_args__ = ("batch_size", "image_size", "epochs")

    def __init__(self, batch_size: int | tuple, image_size: int | None = None, epochs: int = 1):
        self._set("batch_size", _check_bs(batch_size, "Stage"))
        self._set("image_size", image_size)
        self._set("epochs", epochs)
        if self.image_size is not None and (isinstance(self.image_size, bool) or not isinstance(self.image_size, int)
                                            or self.image_size < 1):
            raise ValueError(f"Stage.image_size={self.image_size!r} must be None or an int >= 1")
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, int) or self.epochs < 1:
            raise ValueError(f"Stage.epochs={self.epochs!r} must be an int >= 1")

    def rank_batch(self, rank: int, world_size: int) -> int:
        if isinstance(self.batch_size, int):
            return self.batch_size
        if len(self.batch_size) != world_size:
            raise ValueError(f"batch_size lists {len(self.batch_size)} per-rank sizes but world_size={world_size}; "
                             "pass one batch size per rank (the same list on every rank)")
        return self.batch_size[rank]

    def weights(self, world_size: int) -> tuple[int, ...] | None:
        if isinstance(self.batch_size, int):
            return None
        self.rank_batch(0, world_size)
        return self.batch_size


class BatchSchedule:
    """Stages over epochs. ``BatchSchedule([Stage(256, 128, epochs=2), Stage(64, 224)], cycle=True)``
    runs 2 epochs at 128 px with batch 256, then one at 224 px with batch 64, and
    starts over (cyclic progressive learning); without ``cycle`` the last stage
    lasts forever. ``BatchSchedule(fn)`` asks ``fn(epoch)`` for an int, a list or
    a Stage."""

    def __init__(self, stages: Sequence[Stage] | Callable, cycle: bool = False):
        if callable(stages):
            self._fn, self.stages = stages, ()
        else:
            self._fn = None
            self.stages = tuple(stages)
            if not self.stages or not all(isinstance(s, Stage) for s in self.stages):
                raise ValueError(f"BatchSchedule needs a non-empty list of Stage, got {stages!r}")
        self.cycle = cycle

    @classmethod
    def of(cls, batch_size) -> BatchSchedule:
        """The schedule for a Loader's ``batch_size`` argument."""
        if isinstance(batch_size, BatchSchedule):
            return batch_size
        if isinstance(batch_size, Stage):
            return cls([batch_size])
        if callable(batch_size):
            return cls(batch_size)
        return cls([Stage(_check_bs(batch_size, f"Loader(batch_size={batch_size!r})"))])

    def at(self, epoch: int) -> Stage:
        if self._fn is not None:
            got = self._fn(epoch)
            return got if isinstance(got, Stage) else Stage(_check_bs(got, f"BatchSchedule's function at epoch {epoch}"))
        total = sum(s.epochs for s in self.stages)
        e = epoch % total if self.cycle else min(epoch, total - 1)
        for s in self.stages:
            if e < s.epochs:
                return s
            e -= s.epochs
        return self.stages[-1]

    def __repr__(self) -> str:
        return f"BatchSchedule({self._fn or list(self.stages)!r}, cycle={self.cycle})"
