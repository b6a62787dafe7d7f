"""Torch-facing dataset, loader, workers, resumable state and streaming.

Public: ``ShardDataset``, ``Loader``, ``Mixture``, ``BatchSchedule``, ``Stage``, ``WorkerError``.
"""

from typing import TYPE_CHECKING

from shardfeed.formats.base.lazy import exports

if TYPE_CHECKING:  # what the names are, for type checkers; at run time each is imported on first use
    from shardfeed.loader.dataset import ShardDataset
    from shardfeed.loader.error_policy import WorkerError
    from shardfeed.loader.loader import Loader
    from shardfeed.loader.mixture import Mixture
    from shardfeed.loader.schedule import BatchSchedule, Stage

# public name -> the submodule that defines it (formats/base/lazy.py: nothing is imported until asked for)
_EXPORTS = {
    "ShardDataset": "dataset",
    "WorkerError": "error_policy",
    "Loader": "loader",
    "Mixture": "mixture",
    "BatchSchedule": "schedule",
    "Stage": "schedule",
}
__getattr__, __dir__ = exports(__name__, _EXPORTS)

__all__ = ["BatchSchedule", "Loader", "Mixture", "ShardDataset", "Stage", "WorkerError"]
