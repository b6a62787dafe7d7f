"""Permutations, epoch plans and shuffle-quality metrics (no torch here).

Which samples each rank (and each worker of a rank) reads, in which order,
every epoch: a pure function of (shard counts, order, seed, epoch,
topology), evaluated lazily in chunks.
"""

from shardfeed.shuffling.elastic import replan
from shardfeed.shuffling.ids import offsets_of, shard_of
from shardfeed.shuffling.keys import derive_key, epoch_key
from shardfeed.shuffling.orders import Order
from shardfeed.shuffling.permutation import Permutation
from shardfeed.shuffling.plan import EpochPlan, make_plan
from shardfeed.shuffling.topology import Topology

__all__ = [
    "EpochPlan",
    "Order",
    "Permutation",
    "Topology",
    "derive_key",
    "epoch_key",
    "make_plan",
    "offsets_of",
    "replan",
    "shard_of",
]
