"""Permutations, epoch plans and shuffle-quality metrics (no torch here).

Which samples each rank (and each worker of a rank) reads, in which order,
every epoch: a pure function of (shard counts, order, seed, epoch,
topology), evaluated lazily in chunks.
"""

from typing import TYPE_CHECKING

from shardfeed.formats.base.lazy import exports

if TYPE_CHECKING:  # what the names are, for type checkers; at run time each is imported on first use
    from shardfeed.shuffling.balance_proposal import propose_batch_sizes
    from shardfeed.shuffling.elastic import replan
    from shardfeed.shuffling.ids import offsets_of, shard_of
    from shardfeed.shuffling.keys import derive_key, epoch_key
    from shardfeed.shuffling.orders import Order
    from shardfeed.shuffling.permutation import Permutation
    from shardfeed.shuffling.plan import EpochPlan, make_plan
    from shardfeed.shuffling.topology import Topology

# public name -> the submodule that defines it (formats/base/lazy.py: nothing is imported until asked for)
_EXPORTS = {
    "propose_batch_sizes": "balance_proposal",
    "replan": "elastic",
    "offsets_of": "ids",
    "shard_of": "ids",
    "derive_key": "keys",
    "epoch_key": "keys",
    "Order": "orders",
    "Permutation": "permutation",
    "EpochPlan": "plan",
    "make_plan": "plan",
    "Topology": "topology",
}
__getattr__, __dir__ = exports(__name__, _EXPORTS)

__all__ = [
    "propose_batch_sizes",
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
