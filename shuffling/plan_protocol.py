"""The one shape every plan has: this rank's positions -> sample ids.

EpochPlan (an epoch of a fixed dataset), StreamPlan and IdsPlan (a followed
stream), MixturePlan and StreamMixPlan (mixtures) all follow it, so a feed's
work item, a worker and the audit read any of them alike. A plan is plain
data: it is pickled once to each worker, which computes its steps' ids from it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Plan(Protocol):
    def positions(self, start: int, stop: int) -> np.ndarray:
        """Sample ids of this rank's positions ``[start, stop)``, in delivery order (int64)."""
        ...
