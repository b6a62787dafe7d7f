"""torch datasets behind two of the peers in ``shardfeed bench read``: a
map-style dataset over one file per sample, and an iterable over Parquet row
groups. Module-level classes, so DataLoader workers can pickle them under any
start method."""

from __future__ import annotations

import os

import numpy as np
import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset, IterableDataset


class FileDataset(Dataset):
    """Map-style dataset over ``ROOT/CLS/KEY.bin``, the ImageFolder layout."""

    def __init__(self, folder):
        self.paths = []
        for cls_dir in sorted(os.scandir(folder), key=lambda e: e.name):
            if cls_dir.is_dir():
                self.paths += sorted(e.path for e in os.scandir(cls_dir.path))

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        path = self.paths[i]
        with open(path, "rb") as f:
            data = f.read()
        cls_name = os.path.basename(os.path.dirname(path))
        return os.path.basename(path)[:-4], data, int(cls_name)


class ParquetRowGroups(IterableDataset):
    """Iterable over (file, row group) pairs; each worker takes every n-th one."""

    def __init__(self, files, shuffle, batch_size):
        self.files, self.shuffle, self.batch_size = files, shuffle, batch_size
        self.groups = [(f, g) for f in files for g in range(pq.ParquetFile(f).num_row_groups)]

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        rng = np.random.default_rng(0)
        order = rng.permutation(len(self.groups)) if self.shuffle else range(len(self.groups))
        handles = {}
        for n, g in enumerate(order):
            if n % nw != wid:
                continue
            path, group = self.groups[g]
            if path not in handles:
                handles[path] = pq.ParquetFile(path)
            table = handles[path].read_row_group(group)
            if self.shuffle:
                table = table.take(rng.permutation(table.num_rows))
            for start in range(0, table.num_rows, self.batch_size):
                part = table.slice(start, self.batch_size)
                yield (part.column("key").to_pylist(), part.column("bin").to_pylist(),
                       torch.from_numpy(part.column("cls").to_numpy()))
