"""Torch-facing dataset, loader, workers, resumable state and streaming.

Public: ``ShardDataset``, ``Loader``, ``Mixture``, ``BatchSchedule``, ``Stage``, ``WorkerError``; for the
reference recipes ``Balancer`` (per-rank batch sizes), ``RandomResizedCropFlip`` (image crops) and
``write_token_windows`` (token windows), importable from here whatever module holds them.
"""

from typing import TYPE_CHECKING

from shardfeed.formats.base.lazy import exports

if TYPE_CHECKING:  # what the names are, for type checkers; at run time each is imported on first use
    from shardfeed.loader.balancer import Balancer
    from shardfeed.loader.dataset import ShardDataset
    from shardfeed.loader.error_policy import WorkerError
    from shardfeed.loader.image_crops import RandomResizedCropFlip
    from shardfeed.loader.loader import Loader
    from shardfeed.loader.mixture import Mixture
    from shardfeed.loader.schedule import BatchSchedule, Stage
    from shardfeed.loader.token_windows import write_token_windows

# public name -> the submodule that defines it (formats/base/lazy.py: nothing is imported until asked for)
_EXPORTS = {
    "ShardDataset": "dataset",
    "WorkerError": "error_policy",
    "Loader": "loader",
    "Mixture": "mixture",
    "BatchSchedule": "schedule",
    "Stage": "schedule",
    "Balancer": "balancer",
    "RandomResizedCropFlip": "image_crops",
    "write_token_windows": "token_windows",
}
__getattr__, __dir__ = exports(__name__, _EXPORTS)

__all__ = ["Balancer", "BatchSchedule", "Loader", "Mixture", "RandomResizedCropFlip", "ShardDataset", "Stage",
           "WorkerError", "write_token_windows"]
