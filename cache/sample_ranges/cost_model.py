"""What a fetch costs: ``requests x latency + bytes / bandwidth``.

The cache chooses between fetching a whole shard and fetching the byte
ranges of the samples the plan reads next (ranges.py) by this cost. Latency
and bandwidth are learned from the cache's own recent requests (an
exponential average per process), starting from defaults that fit an object
store reached over a data-centre network (20 ms, 100 MB/s):

- latency: the time of requests small enough (<= ``SMALL_BYTES``) that their
  transfer time is noise next to the round trip;
- bandwidth: bytes over (time - latency) of requests large enough
  (>= ``LARGE_BYTES``) that the round trip is a small part of them.

Two ranges of one shard are read as one when the gap between them costs less
to transfer than a request costs to start (``gap_bytes``: latency x
bandwidth), capped at ``max_gap_bytes`` so coalescing never moves much more
than the plan reads: the cache's first aim is the fewest bytes, time second.
"""

from __future__ import annotations

import threading

DEFAULT_LATENCY_S = 0.020
DEFAULT_BANDWIDTH = 100e6  # bytes per second
SMALL_BYTES = 64 << 10
LARGE_BYTES = 1 << 20
MAX_GAP_BYTES = 4 << 10  # a tar header and padding between two samples: adjacent samples merge
_WEIGHT = 0.2  # weight of the newest request in the averages


class CostModel:
    def __init__(self, latency_s: float = DEFAULT_LATENCY_S, bandwidth: float = DEFAULT_BANDWIDTH,
                 max_gap_bytes: int = MAX_GAP_BYTES):
        if latency_s < 0 or bandwidth <= 0 or max_gap_bytes < 0:
            raise ValueError(f"CostModel needs latency_s >= 0, bandwidth > 0 and max_gap_bytes >= 0, got "
                             f"{latency_s}, {bandwidth}, {max_gap_bytes}")
        self.latency_s = float(latency_s)
        self.bandwidth = float(bandwidth)
        self.max_gap_bytes = int(max_gap_bytes)
        self.samples = 0  # requests observed
        self._mu = threading.Lock()

    def observe(self, nbytes: int, seconds: float) -> None:
        """One request that moved ``nbytes`` in ``seconds`` (first byte asked to last byte in)."""
        if seconds <= 0:
            return
        with self._mu:
            self.samples += 1
            if nbytes <= SMALL_BYTES:
                self.latency_s += _WEIGHT * (seconds - self.latency_s)
            elif nbytes >= LARGE_BYTES:
                transfer = max(seconds - self.latency_s, seconds * 0.1)
                self.bandwidth += _WEIGHT * (nbytes / transfer - self.bandwidth)

    def cost(self, requests: float, nbytes: float) -> float:
        """Seconds to move ``nbytes`` in ``requests`` requests."""
        return requests * self.latency_s + nbytes / self.bandwidth

    def gap_bytes(self) -> int:
        """Largest gap between two ranges that is cheaper to read through than to skip."""
        return int(min(self.max_gap_bytes, self.latency_s * self.bandwidth))

    def describe(self) -> dict:
        return {"latency_s": round(self.latency_s, 6), "bandwidth_Bps": round(self.bandwidth),
                "gap_bytes": self.gap_bytes(), "requests_observed": self.samples}


def range_reserve(limit_bytes: int, total_bytes: int, sidecar_share: float, samples: int, batch: int,
                  batches_held: int, worst_bytes: int = 0, fixed_bytes: int = 0, headroom_bytes: int = 0) -> int:
    """Bytes of the budget kept free of whole shards when the data does not fit
    (ranged_reads.py): what the node's ranges hold on average, never less than
    what they pin at worst (``range_working``), beside what eviction cannot free
    (``fixed_bytes``: the mirrored index, the plans). Whole shards a reader keeps
    open are pinned, so they must never hold room a waiting reader needs.

    On average the ranges hold the sidecars of the shards not held whole (each
    partial copy keeps its own) and ``batches_held`` batches of ``batch``
    samples (``expected_working``), only the share of them read from those
    shards, beside the ``headroom_bytes`` every prefetch leaves free (without
    it the prefetchers would have no room); the shards held whole depend on
    the reserve, so the share is solved for (a few rounds of a monotone fixed point)."""
    kept = max(1.0, total_bytes * (1 + sidecar_share))
    reserve = worst_bytes + fixed_bytes
    for _ in range(4):
        outside = min(1.0, max(0.0, 1.0 - (limit_bytes - reserve) / kept))
        usual = (total_bytes * sidecar_share * outside + fixed_bytes + headroom_bytes
                 + expected_working(total_bytes, samples, batch, batches_held, outside))
        reserve = max(usual, worst_bytes + fixed_bytes)
    return int(reserve)


TAR_EDGES = 768  # bytes of a tar sample no range reads: its first header, its last member's padding (mean)


def mean_span(total_bytes: int, samples: int) -> float:
    """Bytes a sample's range reads, on average: the mean sample less the tar framing outside it."""
    mean = total_bytes / max(1, samples)
    return max(mean - TAR_EDGES, mean / 2)


def expected_working(total_bytes: int, samples: int, batch: int, batches_held: int, outside: float) -> int:
    """Bytes ``batches_held`` batches of ``batch`` samples hold as ranges at once, on average,
    ``outside`` being the share of samples read from shards not held whole: each such
    sample in the disk blocks its range touches (its span plus one block, on average)."""
    return int(batches_held * batch * outside * (mean_span(total_bytes, samples) + BLOCK))


def window_held(limit_bytes: int, total_bytes: int, sidecar_share: float, samples: int, batch: int,
                batches_held: int, reserve_bytes: int) -> int:
    """What the prefetchers' windows hold on average (``expected_working``) beside whole shards
    that leave ``reserve_bytes`` free: the part of the reserve neither dense reuse nor the cost
    model's whole shards may take (ranged_reads.RangePolicy.slack, simulate.simulate_ranged)."""
    outside = min(1.0, max(0.0, 1 - (limit_bytes - reserve_bytes) / max(1.0, total_bytes * (1 + sidecar_share))))
    return expected_working(total_bytes, samples, batch, batches_held, outside)


def batches_held(ranks: int, readers: int, near_steps: int) -> int:
    """Batches the node's prefetchers hold beyond the readers' own (which the headroom
    holds, ``range_working(batch_only=True)``): each rank's prefetcher brings ``near_steps``
    steps, the first its reader's. ``readers``: unused, as the headroom counts each one."""
    return max(1, int(ranks)) * max(0, int(near_steps) - 1)


BLOCK = 4096  # the disk block a sparse partial copy holds whole (ranges.py); the budget counts blocks


def rounded_blocks(nbytes: int) -> int:
    """``nbytes`` in whole disk blocks (what the budget charges a file of that size)."""
    return -(-int(nbytes) // BLOCK) * BLOCK


def rounded_blocks_array(nbytes):
    """``rounded_blocks`` of each of an int64 array."""
    return -(-nbytes // BLOCK) * BLOCK


def whole_charge(sizes, sidecar_share: float):
    """Budget bytes each shard of ``sizes`` (an int64 array) holds once admitted whole: the shard
    and its sidecar (``sidecar_share`` of its bytes), each in whole disk blocks. The room a whole
    admission claims (admission.claim) and what the simulator charges it (simulate.simulate_ranged)."""
    import numpy as np

    sizes = np.asarray(sizes, np.int64)
    return rounded_blocks_array(sizes) + rounded_blocks_array((sizes * float(sidecar_share)).astype(np.int64))


DIRENT_BYTES = 64  # a name in a folder (ext4: 8 bytes and the name, 4-aligned; a key's name is ~40 characters)


def folder_growth(shards: int) -> int:
    """Budget bytes the cache's own folders grow by once they hold ``shards`` shards whole: four
    names each (the shard and its sidecar in data/, its fetch and pin locks in locks/), in whole
    blocks of each folder. Beside the data, the mirrored index and the folders at the start
    (Budget.fixed_bytes), this is what a cache that holds the whole dataset needs."""
    return 2 * rounded_blocks(int(shards) * 2 * DIRENT_BYTES)


RANGE_MIN_SAMPLE_BYTES = BLOCK  # below this a sample's range costs more disk (its blocks) than its bytes


def range_blocks(nbytes: int) -> int:
    """Most budget bytes a range of ``nbytes`` takes in a partial copy: the blocks it can touch."""
    return 0 if nbytes <= 0 else ((int(nbytes) - 1) // BLOCK + 2) * BLOCK


def range_working(sizes, counts, side_bytes: int, batch: int, readers: int, kept_open: int = 0,
                  batch_only: bool = False) -> int:
    """Most budget bytes the node's readers hold pinned as sample ranges while each waits for
    room (the start check, and the reserve every other fetch leaves free: whole shards and
    the prefetchers' ranges are admitted only beyond it, so no reader waits on pins alone).

    Each of ``readers`` pins the batch it reads (``batch`` samples, each in the disk blocks
    its range can touch, never more than the shards' own blocks) and the sidecar of every
    partial copy it has open (its batch's, and ``kept_open`` between reads; a ranged reader
    closes its partial copies after each read, so 0), counted by size as the budget does;
    the room asked for is one range, at most the samples of one shard a batch holds. Ranges
    in flight are not counted: each is dropped once its request ends, whoever waits.

    ``batch_only``: what the batches still need beside what the cache holds (their
    ranges, their sidecars and one range asked), the headroom a prefetch leaves free.
    A partial copy is pinned whole while a reader reads it, with whatever the prefetchers
    brought into it for later steps, so prefetched ranges can be pinned too: a prefetch
    must leave this free, or readers could wait on pins alone."""
    import numpy as np

    sizes, counts = np.asarray(sizes, np.int64), np.asarray(counts, np.int64)
    shards = len(sizes)
    if shards == 0 or batch <= 0:
        return 0
    stride = int(np.max(np.where(counts > 0, -(-sizes // np.maximum(counts, 1)), 0)))
    per_step = min(batch, shards)
    ask = min(int(sizes.max()), (batch - per_step + 1) * stride)
    content = min(readers * batch * range_blocks(stride), int(np.sum(rounded_blocks_array(sizes))))
    sidecars = min(shards, readers * (per_step + (0 if batch_only else kept_open))) * int(side_bytes)
    return int(content + sidecars + ask)
