"""Shuffle quality of each library's default shuffle, for `shardfeed bench compare`.

The worst case for a shuffle is a dataset written class by class: a batch
can only mix the classes its source window holds. Each library writes the
same class-ordered samples (``ClassOrderedSpec``: ``classes`` classes of
``per_class`` samples, in shards of ``per_shard``) with its own writer and
reads one epoch with its shuffle turned on and everything else at its
default, at 0 workers; the pass is content-checked like every other pass.
Per library, over the delivered batches of full size:

- classes per batch: distinct classes, averaged; the ideal is what a
  uniform random batch of that size drawn without replacement holds,
  computed exactly (``ideal_classes``);
- Spearman: rank correlation of read position with written position (0 for
  a perfect shuffle; near 0 is necessary, not sufficient: a buffer over
  shuffled shards scores near 0 and still mixes few classes);
- displacement: mean |read position - written position| / n (1/3 for a
  perfect shuffle, 0 for stored order).
"""

from __future__ import annotations

import math

import numpy as np

from shardfeed.tools.bench.samples import SampleSpec

FULL = {"classes": 100, "per_class": 500, "per_shard": 1000, "size": 64}
QUICK = {"classes": 50, "per_class": 256, "per_shard": 512, "size": 64}


class ClassOrderedSpec(SampleSpec):
    """``count`` samples whose class rises with the index: sample i has class
    ``i * classes // count``, so the shards hold one or two classes each."""

    def __init__(self, count: int, size: int, classes: int, per_shard: int | None = None):
        super().__init__(count, size)
        if not 1 <= classes <= count:
            raise ValueError(f"class-ordered data: classes must be in 1..{count} (the sample count), got {classes}")
        self.classes = int(classes)
        self.per_shard = int(per_shard) if per_shard else None

    def cls(self, i: int) -> int:
        return i * self.classes // self.count


def job_fields(q: dict) -> dict:
    """The child-job fields that select the class-ordered samples of settings ``q``."""
    return {"count": q["classes"] * q["per_class"], "size": q["size"], "classes": q["classes"],
            "per_shard": q["per_shard"]}


def spec_for(q: dict) -> ClassOrderedSpec:
    f = job_fields(q)
    return ClassOrderedSpec(f["count"], f["size"], f["classes"], f["per_shard"])


def ideal_classes(class_sizes, batch: int) -> float:
    """Expected distinct classes in a uniform random ``batch`` of the samples
    (drawn without replacement): sum over classes of 1 - C(n - m, b) / C(n, b)."""
    sizes = np.asarray(class_sizes, dtype=np.int64)
    n = int(sizes.sum())
    batch = min(batch, n)

    def log_choose(a, b):
        return math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(a - b + 1)

    total = 0.0
    for m in sizes.tolist():
        absent = 0.0 if n - m < batch else math.exp(log_choose(n - m, batch) - log_choose(n, batch))
        total += 1.0 - absent
    return total


def measure(order, batch_sizes, spec: ClassOrderedSpec, batch: int) -> dict:
    """Quality figures of one pass: ``order`` is the keys (written positions)
    in read order, ``batch_sizes`` how the library cut them into batches."""
    from shardfeed.shuffling.plan_quality import distinct_per_row, spearman

    keys = np.asarray(order, dtype=np.int64)
    n = spec.count
    labels = keys * spec.classes // n
    ends = np.cumsum(batch_sizes)
    starts = ends - np.asarray(batch_sizes)
    full = [labels[a:b] for a, b in zip(starts, ends) if b - a == batch]
    distinct = distinct_per_row(np.stack(full)) if full else np.empty(0)
    largest = [np.bincount(row).max() / batch for row in full]
    return {
        "classes_per_batch": float(distinct.mean()) if full else None,
        "largest_class_share": float(np.mean(largest)) if full else None,
        "full_batches": len(full),
        "spearman": spearman(keys),
        "displacement": float(np.abs(keys - np.arange(keys.shape[0])).mean() / n),
    }


def ideal(spec: ClassOrderedSpec, batch: int) -> dict:
    sizes = np.bincount(np.arange(spec.count) * spec.classes // spec.count, minlength=spec.classes)
    return {"classes_per_batch": ideal_classes(sizes, batch), "spearman": 0.0, "displacement": 1 / 3}
