"""Torch-facing dataset, loader, workers, resumable state and streaming.

Public: ``ShardDataset``, ``Loader``, ``Mixture``, ``BatchSchedule``, ``Stage``, ``WorkerError``.
"""

from shardfeed.loader.dataset import ShardDataset
from shardfeed.loader.errors import WorkerError
from shardfeed.loader.loader import Loader
from shardfeed.loader.mixture import Mixture
from shardfeed.loader.schedule import BatchSchedule, Stage

__all__ = ["BatchSchedule", "Loader", "Mixture", "ShardDataset", "Stage", "WorkerError"]
