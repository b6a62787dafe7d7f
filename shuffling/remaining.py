"""What an epoch has left after an elastic stop: the positions of the old deal not yet consumed.

``EpochPlan.replan`` turns these items into the pieces of the new plan. Kept
apart from plan.py because it is the one part of a plan that reads another
plan's state (its deal, buffers and locality windows) rather than its own.
"""

from __future__ import annotations

import numpy as np

from shardfeed.shuffling.orders import Order

MAX_EXPLICIT = 1 << 26  # positions an elastic re-plan may list one by one (512 MB)


def remaining(plan, consumed) -> list[tuple]:
    """Items ``("range", a, b)`` / ``("array", positions)`` of the old plan's deal that
    ``consumed[r]`` (positions taken by old rank r) leaves to deliver."""
    d = plan._deal
    length, s = d.length, d.round_size
    items = []
    if not d.strided:
        for r, c in enumerate(consumed):
            base, m = d.rounds * d.cum_weight(r), d.count(r)
            tail = c
            if plan.order is Order.SHARD and c:
                pend, tail = plan._make_buffer(r).pending(c)
                pend = pend + base
                pend = pend[pend < length]
                if pend.size:
                    items.append(("array", pend))
            if base + tail < min(base + m, length):
                items.append(("range", base + tail, min(base + m, length)))
        if d.dropped:
            items.append(("range", d.rounds * s, length))
        return items
    if plan.locality and plan.topology.num_nodes > 1:
        k = plan._rounds_per_batch
        share = [k * w for w in d.weights]
        nwin = -(-d.rounds // k)
        lo = min(c // q if c < d.count(r) else nwin for r, (c, q) in enumerate(zip(consumed, share)))
        hi = max((c - 1) // q + 1 if c else 0 for c, q in zip(consumed, share))
        if hi > lo:
            vp, _, ranks = plan._assign_windows(lo, hi)
            pos = np.empty_like(ranks)
            for r in range(d.world_size):
                mine = np.flatnonzero(ranks == r)
                pos[mine] = lo * share[r] + np.arange(mine.shape[0])
            left = pos >= np.asarray(consumed, np.int64)[ranks]
            band = vp[left & (vp < length)]
            if band.size:
                items.append(("array", band))
        edge = min(max(hi, lo) * k, d.rounds) * s
        if edge < length:
            items.append(("range", edge, length))
        return items
    w = np.asarray(d.weights, np.int64)
    c = np.asarray(consumed, np.int64)
    lo = int((c // w).min())
    hi = int((-(-c // w)).max())
    if hi > lo:
        if (hi - lo) * s > MAX_EXPLICIT:
            raise ValueError(f"consumed counts {consumed} are {hi - lo} rounds apart; ranks step together, "
                             f"so pass steps * batch size for every rank")
        j = np.arange(lo, hi, dtype=np.int64)
        cw = np.concatenate([[0], np.cumsum(w)])
        band = []
        for r in range(d.world_size):
            slots = np.arange(w[r], dtype=np.int64)
            p = (j[:, None] * w[r] + slots[None, :]).reshape(-1)
            v = (j[:, None] * s + cw[r] + slots[None, :]).reshape(-1)
            band.append(v[(p >= c[r]) & (v < length)])
        band = np.sort(np.concatenate(band))
        if band.size:
            items.append(("array", band))
    if hi * s < length:
        items.append(("range", hi * s, length))
    return items
