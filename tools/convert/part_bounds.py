"""Where a conversion's parts start: at the shard boundaries a 1-process run has.

A ShardWriter closes a shard after the sample that brings it to its byte
limit (formats.writer.approx_sample_bytes: a tar's uncompressed members, a
columnar shard's values) or its sample limit, and starts the next one empty:
its boundaries depend only on each sample's measure. So before N processes
write, one pass (in N processes, writing nothing) measures every sample at
its output position; the 1-process boundaries follow, and the parts are cut
at the boundaries nearest to equal sample counts. Each process then starts a
shard where the 1-process run starts one and ends where it ends one: the
shards, their bytes and names are those of 1 process. The plan is kept in
the stage (``plan.json``), so a resumed run cuts its parts where the killed
one did without measuring again.
"""

from __future__ import annotations

import json
import os

import numpy as np

from shardfeed.formats import ShardError
from shardfeed.formats.columnar_values import typed_for_columnar
from shardfeed.formats.writer import approx_sample_bytes

PLAN = "plan.json"


def measure(source, batches, fmt: str) -> np.ndarray:
    """Each sample's measure, in output order, over ``batches`` (lists of samples as write_part gets them)."""
    out = []
    for batch in batches:
        for sample in batch:
            where = sample.pop("__src__", None) or source.describe()
            if fmt != "tar":
                sample = typed_for_columnar(sample, where)
            try:
                out.append(approx_sample_bytes(fmt, sample))
            except (ValueError, TypeError, KeyError) as e:
                raise ShardError(where, str(e)) from None
    return np.asarray(out, np.int64)


def shard_ends(sizes: np.ndarray, max_bytes: int, max_samples: int | None) -> np.ndarray:
    """End positions (exclusive) of the shards a ShardWriter cuts from samples of these measures."""
    n = len(sizes)
    cum = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    ends, start = [], 0
    while start < n:
        # the writer cuts after the first sample that brings the shard to max_bytes (cum is non-decreasing)
        end = max(start + 1, int(np.searchsorted(cum, cum[start] + max_bytes, side="left")))
        if max_samples:
            end = min(end, start + max_samples)
        start = min(end, n)
        ends.append(start)
    return np.asarray(ends, np.int64)


def parts_at(ends: np.ndarray, processes: int) -> list[tuple[int, int]]:
    """Contiguous runs of whole shards, one per process, of about equal sample counts."""
    n = int(ends[-1]) if len(ends) else 0
    parts = max(1, min(processes, len(ends)))
    cuts = [0]
    for p in range(1, parts):
        target = n * p / parts
        i = int(np.searchsorted(ends, target))
        if i > 0 and (i == len(ends) or target - ends[i - 1] <= ends[i] - target):
            i -= 1  # the boundary nearer the target
        cut = int(ends[min(i, len(ends) - 1)])
        if cuts[-1] < cut < n:
            cuts.append(cut)
    cuts.append(n)
    return [(a, b) for a, b in zip(cuts, cuts[1:])] or [(0, 0)]


def load_plan(stage: str) -> list[tuple[int, int]] | None:
    try:
        with open(os.path.join(stage, PLAN), encoding="utf-8") as f:
            return [(int(a), int(b)) for a, b in json.load(f)["parts"]]
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as e:
        raise ShardError(os.path.join(stage, PLAN), f"the stage's part plan is unreadable ({e}); delete the "
                                                    "stage folder and convert again") from None


def save_plan(stage: str, parts: list[tuple[int, int]]) -> None:
    os.makedirs(stage, exist_ok=True)
    tmp = os.path.join(stage, PLAN + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"parts": [list(p) for p in parts]}, f)
    os.replace(tmp, os.path.join(stage, PLAN))
