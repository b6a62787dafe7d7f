"""Shuffle quality and I/O cost of a plan, measured on a labelled dataset.

The worst case for a shuffle is a dataset written in class order: a batch
can only mix the classes its source window holds. For each rank's batches
(consecutive ``batch_size`` positions; a short last batch is left out):

- entropy_ratio: mean label entropy of a batch over that of a perfect
  shuffle (a uniform permutation of the same labels, same batch size);
  1.0 is perfect, 0 is single-class batches.
- distinct_classes, largest_class_share: per batch, averaged.
- distinct_shards: shards a batch draws from, averaged.
- spearman: rank correlation of read position with original position,
  averaged over ranks. Near 0 is necessary, not sufficient: a buffer over
  shuffled shards scores near 0 and still mixes only a few classes.
- shards_opened: over all ranks, shards a rank opens when it keeps each one
  from its first use to its last (so each rank opens a shard once).
- peak_resident: the most shards one rank keeps at once under that rule.
- remote_fraction: samples read by a rank on a node that does not own the
  sample's shard (owner: shard mod num_nodes); only with several nodes.
"""

from __future__ import annotations

import numpy as np

from shardfeed.shuffling.locality import owner_node


def _rows(values: np.ndarray, batch_size: int) -> np.ndarray:
    nb = values.shape[0] // batch_size
    return values[: nb * batch_size].reshape(nb, batch_size)


def batch_entropy(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Shannon entropy (nats) of each row of a (batches, batch_size) label array."""
    nb, bs = labels.shape
    if nb == 0:
        return np.empty(0)
    hist = np.bincount((np.arange(nb)[:, None] * num_classes + labels).ravel(),
                       minlength=nb * num_classes).reshape(nb, num_classes)
    p = hist / bs
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.where(p > 0, p * np.log(p), 0.0).sum(axis=1)


def distinct_per_row(values: np.ndarray) -> np.ndarray:
    if values.shape[0] == 0:
        return np.empty(0)
    s = np.sort(values, axis=1)
    return 1 + (np.diff(s, axis=1) != 0).sum(axis=1)


def perfect_entropy(labels: np.ndarray, batch_size: int, num_classes: int, seed: int = 0) -> float:
    """Mean batch entropy of a uniform random shuffle of the labels."""
    rng = np.random.default_rng(seed)
    return float(batch_entropy(_rows(rng.permutation(labels), batch_size), num_classes).mean())


def spearman(seq: np.ndarray) -> float:
    """Rank correlation between position in seq and the value (ties by position)."""
    n = seq.shape[0]
    if n < 2:
        return 0.0
    ranks = np.empty(n, dtype=np.float64)
    ranks[np.argsort(seq, kind="stable")] = np.arange(n)
    pos = np.arange(n, dtype=np.float64)
    return float(np.corrcoef(pos, ranks)[0, 1])


def residency(shards: np.ndarray) -> tuple[int, int]:
    """(shards opened, peak shards resident) of one rank's shard sequence,
    keeping each shard from its first use to its last."""
    n = shards.shape[0]
    if n == 0:
        return 0, 0
    uniq, first = np.unique(shards, return_index=True)
    _, last_rev = np.unique(shards[::-1], return_index=True)
    last = n - 1 - last_rev
    delta = np.zeros(n + 1, dtype=np.int64)
    np.add.at(delta, first, 1)
    np.add.at(delta, last + 1, -1)
    return int(uniq.shape[0]), int(np.cumsum(delta).max())


def plan_quality(plan, labels: np.ndarray, batch_size: int, perfect: float | None = None) -> dict:
    """Quality and I/O figures of a plan over all of its ranks (see module doc)."""
    labels = np.asarray(labels)
    num_classes = int(labels.max()) + 1 if labels.size else 1
    if perfect is None:
        perfect = perfect_entropy(labels, batch_size, num_classes)
    ent, classes, top, shards_pb, rho = [], [], [], [], []
    opened = peak = remote = total = 0
    topo = plan.topology
    for p in plan.all_ranks():
        ids = p.positions(0, p.num_samples)
        shard, _ = p.shard_of(ids)
        lab = _rows(labels[ids], batch_size)
        ent.append(batch_entropy(lab, num_classes))
        classes.append(distinct_per_row(lab))
        if lab.shape[0]:
            hist = np.apply_along_axis(np.bincount, 1, lab, minlength=num_classes)
            top.append(hist.max(axis=1) / batch_size)
        shards_pb.append(distinct_per_row(_rows(shard, batch_size)))
        rho.append(spearman(ids))
        o, k = residency(shard)
        opened += o
        peak = max(peak, k)
        if topo.num_nodes > 1:
            remote += int((owner_node(shard, topo.num_nodes) != topo.node_of(p.topology.rank)).sum())
            total += ids.shape[0]

    def mean(parts):
        parts = [x for x in parts if len(x)]
        return float(np.concatenate(parts).mean()) if parts else float("nan")

    return {
        "entropy_ratio": mean(ent) / perfect if perfect > 0 else float("nan"),
        "distinct_classes": mean(classes),
        "largest_class_share": mean(top),
        "distinct_shards": mean(shards_pb),
        "spearman": float(np.mean(rho)),
        "shards_opened": opened,
        "peak_resident": peak,
        "remote_fraction": remote / total if total else None,
    }
