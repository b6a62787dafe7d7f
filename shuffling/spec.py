"""The one plan builder: (what is shuffled, the job, its elastic history) -> plan.

``PlanSpec`` holds what does not change inside a run (shard counts, order,
seed and options); ``Job`` is who reads it in an epoch (world size, the
per-rank batch sizes, ranks per node). A job's batch sizes are the single
representation of batch size: topology weights and the locality window are
derived from them here and nowhere else. An epoch that changed world size
midway carries its history: the earlier jobs, oldest first, each with the
samples every one of its ranks had consumed.

    spec.plan(epoch, job, rank)                       # a plain epoch
    spec.plan(epoch, job, rank, history=((old, consumed),))   # after a resize
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shardfeed.formats.base.records import FrozenSlotRecord, SlotRecord
from shardfeed.shuffling.ids import check_counts
from shardfeed.shuffling.orders import Order
from shardfeed.shuffling.plan import DEFAULT_BLOCK_SHARDS, DEFAULT_BUFFER_SIZE, EpochPlan, make_plan
from shardfeed.shuffling.topology import Topology

# Largest batch of one rank: far past any memory, and it keeps step * batch size
# (and its sum over ranks) exact in int64 positions.
MAX_BATCH_SIZE = (1 << 31) - 1


class Job(SlotRecord):
    """World size and batch sizes of one job.

    batch_sizes: one int per rank, or None for unbatched reading (a plain
    torch DataLoader over the dataset: no locality window). Equal batch
    sizes deal exactly like no weights.
    """

    # a SlotRecord, not a dataclass: a dataclass compiles its methods at import (issue #24); not frozen: nothing assigns to it
    __slots__ = ("world_size", "batch_sizes", "ranks_per_node")

    def __init__(self, world_size: int, batch_sizes: tuple[int, ...] | None = None, ranks_per_node: int | None = None):
        self.world_size = world_size
        self.batch_sizes = batch_sizes
        self.ranks_per_node = ranks_per_node
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"Job.world_size={self.world_size!r} must be an int >= 1")
        if self.batch_sizes is not None:
            sizes = tuple(self.batch_sizes)
            if len(sizes) != self.world_size:
                raise ValueError(f"Job.batch_sizes lists {len(sizes)} sizes for world_size={self.world_size}; "
                                 "give one batch size per rank")
            for r, b in enumerate(sizes):
                if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not 1 <= b <= MAX_BATCH_SIZE:
                    raise ValueError(f"Job.batch_sizes[{r}]={b!r} must be an int in [1, {MAX_BATCH_SIZE}]")
            self.batch_sizes = tuple(int(b) for b in sizes)
        rpn = self.ranks_per_node
        if rpn is not None and not 1 <= rpn <= self.world_size:
            # a node cannot hold more ranks than the job has (a smaller job after a resize)
            self.ranks_per_node = None

    @property
    def weights(self) -> tuple[int, ...] | None:
        """Per-rank dealing weights: None when every rank has the same batch size."""
        b = self.batch_sizes
        return None if b is None or len(set(b)) == 1 else b

    def batch_size(self, rank: int) -> int | None:
        return None if self.batch_sizes is None else self.batch_sizes[rank]

    def topology(self, rank: int) -> Topology:
        return Topology(rank, self.world_size, self.weights, self.ranks_per_node)

    def as_list(self) -> list:
        """[world_size, batch_sizes] as plain JSON data (state dicts)."""
        return [self.world_size, list(self.batch_sizes) if self.batch_sizes is not None else None]


class PlanSpec(FrozenSlotRecord):
    """What a run shuffles and how: the inputs of every plan except the job and epoch."""

    # a frozen slot record, not a dataclass (issue #24); counts are left out of repr, == and hash, as the
    # dataclass's field(repr=False, compare=False) did
    __slots__ = __match_args__ = ("counts", "order", "seed", "drop_last", "locality", "block_shards", "buffer_size",
                                  "start")
    _hidden = ("counts",)

    def __init__(self, counts: np.ndarray, order: Order = Order.GLOBAL, seed: int = 0, drop_last: bool = False,
                 locality: bool = False, block_shards: int = DEFAULT_BLOCK_SHARDS,
                 buffer_size: int = DEFAULT_BUFFER_SIZE, start: int | None = None):
        self._set("counts", check_counts(counts))
        self._set("order", Order(order))
        for name, value in (("seed", seed), ("drop_last", drop_last), ("locality", locality),
                            ("block_shards", block_shards), ("buffer_size", buffer_size), ("start", start)):
            self._set(name, value)
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)):
            raise TypeError(f"seed must be an int, got {self.seed!r}")
        if self.locality and self.order is not Order.GLOBAL:
            raise ValueError(f"locality-aware dealing needs order='global', got order={self.order.value!r}")

    @property
    def num_samples(self) -> int:
        return int(self.counts.sum())

    def _options(self, job: Job, rank: int) -> dict:
        opts = {"drop_last": self.drop_last, "block_shards": self.block_shards,
                "buffer_size": self.buffer_size, "start": self.start}
        # The locality window is one global batch, so it exists only for batched reading.
        if self.locality and job.batch_sizes is not None:
            opts.update(locality=True, batch_size=job.batch_size(rank))
        return opts

    def plan(self, epoch: int, job: Job, rank: int,
             history: Sequence[tuple[Job, Sequence[int]]] = ()) -> EpochPlan:
        """``rank``'s plan of ``epoch`` for ``job``, after the resizes in ``history``."""
        if not history:
            return make_plan(self.counts, self.order, self.seed, epoch, job.topology(rank), **self._options(job, rank))
        first = history[0][0]
        plan = make_plan(self.counts, self.order, self.seed, epoch, first.topology(0), **self._options(first, 0))
        for i, (_, consumed) in enumerate(history):
            nxt, r = (job, rank) if i + 1 == len(history) else (history[i + 1][0], 0)
            opts = self._options(nxt, r)
            plan = plan.replan(consumed, nxt.topology(r), drop_last=self.drop_last, batch_size=opts.get("batch_size"))
        return plan

    def consumed(self, epoch: int, job: Job, steps: int, history=()) -> tuple[int, ...]:
        """Samples each rank of ``job`` had taken after ``steps`` steps (all ranks step together)."""
        counts = [p.num_samples for p in self.plan(epoch, job, 0, history).all_ranks()]
        sizes = job.batch_sizes or (1,) * job.world_size
        return tuple(min(steps * b, c) for b, c in zip(sizes, counts))
