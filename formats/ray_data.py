"""Ray Data: write shardfeed shards from any ``ray.data.Dataset``, and read a dataset back.

    from shardfeed.formats.ray_data import ShardDatasink, ShardDatasource
    ds.write_datasink(ShardDatasink("data/out", max_shard_samples=10_000))
    ds = ray.data.read_datasource(ShardDatasource("data/out"))

Ray is imported when one of these is first used, never by importing
shardfeed (from a clone: ``pip install -e '.[ray]'``). ``shardfeed convert
--engine ray`` is built on the same import (tools/convert/ray_engine.py).

The datasink's life: each write task writes its rows as shards into its own
folder of one stage beside the dataset (``.<name>.convert-<key>/task-...``;
a retried task writes a fresh folder, only returned results count). When
every task has finished, the driver renames the shards ``shard-NNNNNN`` in
task order, writes one index and publishes the stage with one rename: a
reader sees the whole dataset or nothing. A failed job publishes nothing and
removes the stage. With ``append=True`` the shards join a growing dataset
instead: moved in under names unique to the job, then committed to its log
one by one by the driver (each commit atomic; followers may see the first
shards of the job before its last). The stage must lie on a file system all
Ray nodes share (one machine, NFS, a mounted bucket).

The datasource splits the shard list into contiguous runs of about equal
sample counts, one per read task; each task yields one Arrow table per
shard, fields undecoded (tar payloads as bytes).
"""

from __future__ import annotations

import os
import shutil
import uuid

from shardfeed.formats.commit_log import publish
from shardfeed.formats.index import ShardInfo, write_index
from shardfeed.formats.open_dataset import open_index
from shardfeed.formats.readers import open_shard
from shardfeed.formats.writer import ShardWriter

__all__ = ["ShardDatasink", "ShardDatasource"]  # noqa: F822 (built on first use)

_classes: dict = {}


def __getattr__(name):
    if name in ("ShardDatasink", "ShardDatasource"):
        if not _classes:
            _build()
        return _classes[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _import_ray():
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise ImportError("shardfeed's Ray Data support needs Ray: pip install 'ray[data]' "
                          "(from a shardfeed clone: pip install -e '.[ray]')") from None
    return ray


def _shard_rows(reader) -> list[dict]:
    return [dict(s) for s in reader]


def _build() -> None:
    import pyarrow as pa

    ray = _import_ray()
    from ray.data import Datasink, Datasource, ReadTask
    from ray.data.block import BlockAccessor, BlockMetadata

    from shardfeed.formats.columnar_values import typed_for_columnar
    from shardfeed.formats.sidecar import SIDECAR_SUFFIX
    from shardfeed.formats.staging import check_destination, publish_stage, stage_path

    class ShardDatasink(Datasink):
        """``ds.write_datasink(ShardDatasink(root, format="tar", max_shard_bytes=..., ...))``.

        Rows are samples: a ``__key__`` column (str) and one column per field
        (values as ``ShardWriter.write`` takes them). See the module docstring
        for how the shards are staged and published.
        """

        def __init__(self, root: str, format: str = "tar", max_shard_bytes: int = 256 << 20,
                     max_shard_samples: int | None = None, compression: str | None = None,
                     overwrite: bool = False, append: bool = False):
            self.root = os.path.abspath(root)
            self.format, self.compression = format, compression
            self.max_shard_bytes, self.max_shard_samples = max_shard_bytes, max_shard_samples
            self.overwrite, self.append = overwrite, append
            self.job = uuid.uuid4().hex[:16]
            # fixed here, not in on_write_start: the tasks get a copy of this object
            self.stage = stage_path(self.root, self.job)
            if not append:
                check_destination(self.root, overwrite)
            self.result = None

        def on_write_start(self, schema=None) -> None:
            os.makedirs(self.stage, exist_ok=True)

        def write(self, blocks, ctx) -> dict:
            folder = os.path.join(self.stage, f"task-{ctx.task_idx:06d}-{uuid.uuid4().hex[:8]}")
            with ShardWriter(folder, format=self.format, max_shard_bytes=self.max_shard_bytes,
                             max_shard_samples=self.max_shard_samples, compression=self.compression) as w:
                for block in blocks:
                    for row in BlockAccessor.for_block(block).to_arrow().to_pylist():
                        sample = {k: v for k, v in row.items() if v is not None}
                        if self.format != "tar":
                            sample = typed_for_columnar(sample, self.root)
                        w.write(sample)
            return {"task": ctx.task_idx, "folder": os.path.basename(folder),
                    "shards": [dict(s.__dict__) for s in w.shards], "fields": list(w.fields)}

        def on_write_complete(self, write_result) -> None:
            results = getattr(write_result, "write_returns", write_result)
            results = sorted((r for r in results if r and r["shards"]), key=lambda r: r["task"])
            try:
                self.result = self._publish(results)
            except BaseException:
                shutil.rmtree(self.stage, ignore_errors=True)
                raise

        def _publish(self, results) -> dict:
            shards, fields = [], []
            os.makedirs(self.stage, exist_ok=True)
            tag = f"{self.job}-" if self.append else ""
            target = self.root if self.append else self.stage
            if self.append:
                os.makedirs(self.root, exist_ok=True)
            for r in results:
                for rec in r["shards"]:
                    info = ShardInfo(**rec)
                    name = f"shard-{tag}{len(shards):06d}{info.name[len('shard-000000'):]}"
                    for suffix in (SIDECAR_SUFFIX, ""):
                        src = os.path.join(self.stage, r["folder"], info.name + suffix)
                        if os.path.exists(src):
                            os.replace(src, os.path.join(target, name + suffix))
                    shards.append(ShardInfo(name, info.format, info.samples, info.bytes, info.hash))
                fields += [f for f in r["fields"] if f not in fields]
            if self.append:
                for info in shards:
                    publish(self.root, info, fields)  # as local append does: train/inspect need the fields
                shutil.rmtree(self.stage, ignore_errors=True)
            else:
                for name in os.listdir(self.stage):
                    if name.startswith("task-"):
                        shutil.rmtree(os.path.join(self.stage, name))
                write_index(self.stage, shards, fields, extra={"convert": {"engine": "ray-data"}})
                publish_stage(self.stage, self.root, self.overwrite)
            return {"shards": len(shards), "samples": sum(s.samples for s in shards), "fields": fields}

        def on_write_failed(self, error: Exception) -> None:
            shutil.rmtree(self.stage, ignore_errors=True)

    class ShardDatasource(Datasource):
        """``ray.data.read_datasource(ShardDatasource(root))``: a row per sample, fields undecoded."""

        def __init__(self, root: str):
            super().__init__()
            self.root = root
            self.index = open_index(root)

        def estimate_inmemory_data_size(self):
            return self.index.num_bytes

        def get_read_tasks(self, parallelism: int, per_task_row_limit=None, data_context=None) -> list:
            idx = self.index
            n = len(idx)
            if n == 0:
                return []
            groups = max(1, min(parallelism, n))
            total = max(1, idx.num_samples)
            # contiguous runs of shards cut at about equal sample counts
            cuts = [0] + [int(((idx.offsets[1:] * groups) < total * g).sum()) for g in range(1, groups)] + [n]
            tasks = []
            for a, b in zip(cuts, cuts[1:]):
                if b <= a:
                    continue
                shards = list(range(a, b))
                meta = _metadata(BlockMetadata, int(idx.counts[a:b].sum()), int(idx.sizes[a:b].sum()),
                                 [idx.path(i) for i in shards])
                tasks.append(ReadTask(lambda shards=shards, idx=idx: _read_shards(idx, shards, pa), meta))
            return tasks

    _classes.update(ShardDatasink=ShardDatasink, ShardDatasource=ShardDatasource)
    _classes["ray"] = ray


def _metadata(cls, rows: int, size: int, files: list[str]):
    # BlockMetadata's fields changed across Ray releases: pass the ones this one has
    import inspect

    want = {"num_rows": rows, "size_bytes": size, "input_files": files, "exec_stats": None, "schema": None}
    params = inspect.signature(cls).parameters
    return cls(**{k: v for k, v in want.items() if k in params})


def _read_shards(idx, shards: list[int], pa):
    for i in shards:
        with open_shard(idx, i) as reader:
            rows = _shard_rows(reader)
        names = ["__key__"] + sorted({k for r in rows for k in r} - {"__key__"})
        yield pa.table({k: [r.get(k) for r in rows] for k in names})
