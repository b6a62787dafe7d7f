"""Elastic re-plan: the rest of an epoch on a new world size.

All ranks step together, so where a job stands in an epoch is one count per
old rank (steps * that rank's batch size); no list of consumed samples is
kept anywhere. ``EpochPlan.replan`` does the work; this module rebuilds the
old plan from plain inputs, the way a loader restarting with a different
world size has them.
"""

from __future__ import annotations

from collections.abc import Iterable

from shardfeed.shuffling.plan import EpochPlan, make_plan
from shardfeed.shuffling.topology import Topology


def _as_topology(t) -> Topology:
    if isinstance(t, Topology):
        return t.with_rank(0)
    if isinstance(t, int) and not isinstance(t, bool):
        return Topology(0, t)
    raise TypeError(f"expected a Topology or a world size (int), got {t!r}")


def replan(counts, order, seed: int, epoch: int, old_topology, consumed, topology: Topology, *,
           history: Iterable = (), **options) -> EpochPlan:
    """The plan for ``topology`` of what the epoch has left.

    old_topology: the old job (a Topology, or just its world size).
    consumed: samples each old rank had taken this epoch.
    history: earlier resizes in the same epoch, oldest first, as
    (topology or world size, consumed) pairs: the first is the job the
    epoch started on. options: make_plan's keywords (drop_last,
    block_shards, buffer_size, start, locality, batch_size), the same as the
    old plan's. Equal to ``plan.replan(consumed, topology)`` on the old plan.
    """
    steps = list(history) + [(old_topology, consumed)]
    plan = make_plan(counts, order, seed, epoch, _as_topology(steps[0][0]), **options)
    for i, (_, used) in enumerate(steps):
        nxt = topology if i + 1 == len(steps) else _as_topology(steps[i + 1][0])
        plan = plan.replan(used, nxt)
    return plan
