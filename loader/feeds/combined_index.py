"""A mixture's combined index: its sources' shards one after another.

One BatchMaker in each worker then reads every source (ids are offsets in
this index), with no per-batch encoding or regrouping.
"""

from __future__ import annotations

import os

from shardfeed.cache.fetching.url_schemes import is_remote
from shardfeed.formats.index import DatasetIndex


def combined_index(sources, layout, grown: dict | None = None) -> DatasetIndex:
    """One index over ``sources`` (ShardDatasets), their shards in ``layout`` order, named
    relative to the sources' common folder; ``grown``: a newer index of some sources."""
    roots = [os.path.abspath(s.index.root.removeprefix("file://")) for s in sources]
    root = os.path.commonpath(roots) if len(set(roots)) > 1 else roots[0]
    names, formats, counts, sizes, hashes, fields, tables = [], [], [], [], [], [], {}
    for i in layout:
        s, r = sources[i], roots[i]
        index = (grown or {}).get(i, s.index)
        if is_remote(s.index.root):
            raise NotImplementedError(f"{s.index.root}: remote sources are not mixed yet")
        rel = os.path.relpath(r, root)
        prefix = "" if rel in ("", ".") else rel.replace(os.sep, "/") + "/"
        for row, table in index.tables.items():
            tables[len(names) + row] = table
        names += [prefix + n for n in index.names]
        formats += index.formats
        counts += index.counts.tolist()
        sizes += index.sizes.tolist()
        hashes += index.hashes
        fields += [f for f in index.fields if f not in fields]
    idx = DatasetIndex(root, names, formats, counts, sizes, hashes, fields, {"mixture": True})
    idx.tables = tables
    return idx
