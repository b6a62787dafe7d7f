"""Where a rank sits in the job: a frozen value, validated, pure arithmetic.

Reading torch.distributed or the environment is the loader's job
(``Topology.detect`` lives there); here a topology is just numbers, so every
plan can be tested for any world size without a cluster.
"""

from __future__ import annotations

import math

from shardfeed.formats.base.records import FrozenSlotRecord


class Topology(FrozenSlotRecord):
    """rank, world_size, optional per-rank weights and ranks per node.

    ``weights``: one positive int per rank, e.g. the per-rank batch sizes of
    dual-batch training; a rank's share of the epoch is proportional to its
    weight. Weights are used divided by their gcd (``unit_weights``), so
    (64, 64) behaves exactly like no weights.

    ``ranks_per_node``: ranks rank//ranks_per_node share a node (and its
    cache); only locality-aware dealing uses it. The last node may be
    smaller when it does not divide world_size.
    """

    # a frozen slot record, not a dataclass: the same fields, repr, ==, hash and immutability, without
    # compiling generated methods at import (issue #24)
    __slots__ = __match_args__ = ("rank", "world_size", "weights", "ranks_per_node")

    def __init__(self, rank: int = 0, world_size: int = 1, weights: tuple[int, ...] | None = None,
                 ranks_per_node: int | None = None):
        self._set("rank", rank)
        self._set("world_size", world_size)
        self._set("weights", weights)
        self._set("ranks_per_node", ranks_per_node)
        for name in ("rank", "world_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"Topology.{name} must be an int, got {v!r}")
        if self.world_size < 1:
            raise ValueError(f"world_size={self.world_size} must be >= 1")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank={self.rank} out of range for world_size={self.world_size} (valid: 0..{self.world_size - 1})")
        if self.weights is not None:
            w = tuple(self.weights)
            if len(w) != self.world_size:
                raise ValueError(f"weights has {len(w)} entries but world_size={self.world_size}; give one positive int per rank")
            for i, x in enumerate(w):
                if isinstance(x, bool) or not isinstance(x, int) or x < 1:
                    raise ValueError(f"weights[{i}]={x!r} must be a positive int (e.g. that rank's batch size)")
            self._set("weights", w)
        if self.ranks_per_node is not None:
            rpn = self.ranks_per_node
            if isinstance(rpn, bool) or not isinstance(rpn, int) or not 1 <= rpn <= self.world_size:
                raise ValueError(f"ranks_per_node={rpn!r} must be an int in 1..world_size={self.world_size}")

    @property
    def unit_weights(self) -> tuple[int, ...]:
        """Weights divided by their gcd; all ones when no weights were given."""
        if self.weights is None:
            return (1,) * self.world_size
        g = math.gcd(*self.weights)
        return tuple(x // g for x in self.weights)

    @property
    def node(self) -> int:
        return self.rank // (self.ranks_per_node or self.world_size)

    @property
    def num_nodes(self) -> int:
        return -(-self.world_size // (self.ranks_per_node or self.world_size))

    def node_of(self, rank: int) -> int:
        return rank // (self.ranks_per_node or self.world_size)

    def with_rank(self, rank: int) -> Topology:
        """The same job seen from another rank."""
        return Topology(rank, self.world_size, self.weights, self.ranks_per_node)

    def all_ranks(self) -> list[Topology]:
        return [self.with_rank(r) for r in range(self.world_size)]
