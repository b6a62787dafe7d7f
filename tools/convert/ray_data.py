"""Moved: the Ray Data datasink and datasource live in shardfeed.formats.ray_data (this name keeps working)."""

from shardfeed.formats.ray_data import __getattr__  # noqa: F401  (ShardDatasink, ShardDatasource, built on first use)
