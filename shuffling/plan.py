"""EpochPlan: which samples one rank reads in an epoch, in which order.

A plan is a pure function of (counts, order, seed, epoch, topology,
options) and holds O(shards) memory: the epoch sequence G of its order
(sequences.py), the part V of G still to deliver (pieces.py; all of G
unless re-planned), the deal of V to ranks (partition.py), and for `shard`
a per-rank buffer shuffle (buffer.py). Sample ids are produced on demand,
in chunks.

Layouts: `none`, `shard` and `block` deal V contiguously (each rank reads
its own run of shards or windows); `global` deals V round-robin, so a step
of all ranks reads a contiguous slice of the global permutation, which is
what locality-aware dealing and exact elastic resume build on.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from shardfeed.shuffling import locality as _loc
from shardfeed.shuffling.buffer import BufferShuffle
from shardfeed.shuffling.ids import check_counts, offsets_of
from shardfeed.shuffling.keys import STREAM_BUFFER, derive_key
from shardfeed.shuffling.orders import Order
from shardfeed.shuffling.partition import Deal
from shardfeed.shuffling.pieces import Pieces
from shardfeed.shuffling.remaining import remaining
from shardfeed.shuffling.sequences import (
    GlobalPermuted,
    InOrder,
    ShardsShuffled,
    Windows,
    strided_global_ids,
)
from shardfeed.shuffling.topology import Topology
from shardfeed.shuffling.worker_split import steps_of

DEFAULT_BLOCK_SHARDS = 16
DEFAULT_BUFFER_SIZE = 10_000
DEFAULT_CHUNK = 65_536


def _check_pos_int(name, value, minimum=1):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an int >= {minimum}")
    return int(value)


class EpochPlan:
    """One rank's order for one epoch. Build with :func:`make_plan`.

    Attributes: ``num_samples`` (this rank's positions this epoch, padding
    included), ``total_samples`` (samples the epoch covers before padding or
    dropping), ``padded`` / ``dropped`` (over all ranks), ``order``,
    ``topology``, ``seed``, ``epoch``.
    """

    def __init__(self, counts, order, seed, epoch, topology, *, drop_last, block_shards,
                 buffer_size, start, locality, batch_size, _seq=None, _pieces=None,
                 _generation=0, _history=(), _batch_rounds=None):
        self.order = Order(order)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int, got {seed!r}")
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ValueError(f"epoch={epoch!r} must be an int >= 0")
        if not isinstance(topology, Topology):
            raise TypeError(f"topology must be a shardfeed.shuffling.Topology, got {topology!r}")
        self.seed, self.epoch, self.topology = int(seed), int(epoch), topology
        self.drop_last = bool(drop_last)
        self.block_shards = _check_pos_int("block_shards", block_shards)
        self.buffer_size = _check_pos_int("buffer_size", buffer_size)
        self.counts = check_counts(counts)
        self.offsets = offsets_of(self.counts)
        ns = self.counts.shape[0]
        self.start = 0 if start is None else int(start)
        if not 0 <= self.start <= ns:
            raise ValueError(f"start={start!r} must be a shard index in 0..{ns} (the first shard of the plan)")
        self._id_base = int(self.offsets[self.start])
        self.locality = bool(locality)
        self.batch_size = batch_size
        self._rounds_per_batch = None
        if self.locality and _batch_rounds is not None:
            # Rebuilt from a description or a re-plan: one value for all ranks.
            self._rounds_per_batch = int(_batch_rounds)
            self.batch_size = self._rounds_per_batch * topology.unit_weights[topology.rank]
        elif self.locality:
            if self.order is not Order.GLOBAL:
                raise ValueError(f"locality-aware dealing needs order='global', got order={self.order.value!r}")
            if batch_size is None:
                raise ValueError("locality=True needs batch_size (this rank's batch size): the locality window is one global batch")
            w = topology.unit_weights[topology.rank]
            _check_pos_int("batch_size", batch_size)
            if batch_size % w:
                raise ValueError(f"batch_size={batch_size} must be a multiple of this rank's unit weight {w} "
                                 f"(weights {topology.weights} over their gcd): batch sizes must be proportional to weights")
            self._rounds_per_batch = batch_size // w
        if _seq is None:
            sub = self.counts[self.start:]
            if self.order is Order.NONE:
                _seq = InOrder(sub)
            elif self.order is Order.GLOBAL:
                _seq = GlobalPermuted(sub, self.seed, self.epoch)
            elif self.order is Order.SHARD:
                _seq = ShardsShuffled(sub, self.seed, self.epoch)
            else:
                _seq = Windows(sub, self.seed, self.epoch, self.block_shards)
        self._seq = _seq
        self._pieces = Pieces.whole(_seq.n) if _pieces is None else _pieces
        self.generation = _generation
        self.history = tuple(_history)
        self._deal = Deal(len(self._pieces), topology.unit_weights, self.drop_last, self.order is Order.GLOBAL)
        self._buffer = self._make_buffer(topology.rank)
        self._fast: tuple | None = None  # see _fast_path

    # -- sizes ---------------------------------------------------------------
    @property
    def num_samples(self) -> int:
        return self._deal.count(self.topology.rank)

    def __len__(self) -> int:
        return self.num_samples

    @property
    def total_samples(self) -> int:
        return len(self._pieces)

    @property
    def padded(self) -> int:
        return self._deal.padded

    @property
    def dropped(self) -> int:
        return self._deal.dropped

    @property
    def random_access(self) -> bool:
        """False for `shard` (positions replay the buffer from a checkpoint)."""
        return self._buffer is None

    def steps(self, batch_size: int, drop_last: bool = False) -> int:
        """Batches this rank takes: ceil (or floor) of num_samples / batch_size.

        With weights, pass batch sizes proportional to the weights (b[r] =
        c * unit_weights[r]); every rank then gets ceil(rounds / c) steps.
        """
        batch_size = _check_pos_int("batch_size", batch_size)
        return self.num_samples // batch_size if drop_last else -(-self.num_samples // batch_size)

    def __repr__(self):
        t = self.topology
        return (f"EpochPlan(order={self.order.value!r}, seed={self.seed}, epoch={self.epoch}, rank={t.rank}/"
                f"{t.world_size}, num_samples={self.num_samples}, total={self.total_samples}, generation={self.generation})")

    # -- ids -----------------------------------------------------------------
    def _make_buffer(self, rank):
        if self.order is not Order.SHARD:
            return None
        key = derive_key(self.seed, self.epoch, STREAM_BUFFER, self.generation, rank)
        return BufferShuffle(self._deal.count(rank), self.buffer_size, key)

    def _lane_ids(self, rank, lane: np.ndarray) -> np.ndarray:
        """Ids at lane positions of a rank (dealt order, before any buffer)."""
        v = self._deal.fold(self._deal.dealt(rank, lane))
        return self._seq.ids(self._pieces.to_g(v)) + self._id_base

    def _contiguous_ids(self, rank, a, b) -> np.ndarray:
        # Lane run [a, b) is a run of V', mostly a run of G: use ids_range.
        base = self._deal.rounds * self._deal.cum_weight(rank)
        lo, hi = base + a, base + b
        length = len(self._pieces)
        parts = []
        for is_range, s, n in self._pieces.runs(lo, min(hi, length)):
            if is_range:
                parts.append(self._seq.ids_range(s, s + n))
            else:
                parts.append(self._seq.ids(self._pieces.pool[s:s + n]))
        if hi > length:  # padding: the first samples of V again
            pad = np.arange(max(lo, length), hi, dtype=np.int64) % max(1, length)
            parts.append(self._seq.ids(self._pieces.to_g(pad)))
        out = np.concatenate(parts) if parts else np.empty(0, np.int64)
        return out + self._id_base if self._id_base else out

    def _fast_path(self) -> tuple:
        """(topology, num_samples, kind, *arguments) of this rank's common cases, so
        ``positions`` skips the generic machinery on every batch: kind 1, stored
        order over the whole epoch (a run of ids, ``arange``); kind 2, `global`
        over the whole epoch (strided_global_ids); kind 0, the general path.
        Kept per topology object (``for_rank`` gives a copy another one)."""
        t = self.topology
        rank = t.rank
        d = self._deal
        kind, args = 0, ()
        if not (self.locality and t.num_nodes > 1) and self._buffer is None and self._pieces.is_whole:
            if self.order is Order.GLOBAL:
                kind, args = 2, (d.weights[rank], d.round_size, d.cum_weight(rank), len(self._pieces))
            elif isinstance(self._seq, InOrder):
                # lane position p is V[base + p] = G[base + p] = id base + p while base + p < len(V) (no padding)
                kind, args = 1, (d.rounds * d.cum_weight(rank), len(self._pieces))
        self._fast = (t, d.count(rank), kind) + args
        return self._fast

    def positions(self, start: int, stop: int) -> np.ndarray:
        """Sample ids at this rank's positions [start, stop), as int64.

        Random access for every order; for `shard` it replays the buffer from
        the nearest checkpoint (see buffer.py), cheap when reads move forward.
        """
        fast = self._fast
        if fast is None or fast[0] is not self.topology:
            fast = self._fast_path()
        start, stop = int(start), int(stop)
        if not 0 <= start <= stop <= fast[1]:
            raise IndexError(f"positions [{start}, {stop}) outside this rank's 0..{self.num_samples} "
                             f"(rank {self.topology.rank} of {self.topology.world_size}, epoch {self.epoch})")
        if start == stop:
            return np.empty(0, np.int64)
        kind = fast[2]
        if kind == 1:
            base, length = fast[3], fast[4]
            if base + stop <= length:
                b = base + self._id_base
                return np.arange(b + start, b + stop, dtype=np.int64)
        elif kind == 2:
            out = strided_global_ids(self._seq, start, stop, *fast[3:])
            return out + self._id_base if self._id_base else out
        rank = self.topology.rank
        if self.locality and self.topology.num_nodes > 1:
            return self._locality_ids(start, stop)
        if self._buffer is not None:
            return self._lane_ids(rank, self._buffer.positions(start, stop))
        if self.order is Order.GLOBAL:
            if self._pieces.is_whole:
                d = self._deal
                out = strided_global_ids(self._seq, start, stop, d.weights[rank], d.round_size,
                                         d.cum_weight(rank), len(self._pieces))
                return out + self._id_base if self._id_base else out
            return self._lane_ids(rank, np.arange(start, stop, dtype=np.int64))
        return self._contiguous_ids(rank, start, stop)

    def __getitem__(self, i: int) -> int:
        i = int(i)
        return int(self.positions(i, i + 1)[0])

    def chunks(self, start_pos: int = 0, chunk: int = DEFAULT_CHUNK) -> Iterator[np.ndarray]:
        """This rank's ids from position start_pos to the end, chunk by chunk."""
        chunk = _check_pos_int("chunk", chunk)
        if not 0 <= start_pos <= self.num_samples:
            raise IndexError(f"start_pos={start_pos} outside 0..{self.num_samples} (this rank's samples this epoch)")
        for a in range(int(start_pos), self.num_samples, chunk):
            yield self.positions(a, min(self.num_samples, a + chunk))

    def __iter__(self):
        for c in self.chunks():
            yield from c.tolist()

    def batches(self, batch_size: int, start_batch: int = 0, drop_last: bool = False):
        """(batch index, ids) of this rank's batches from start_batch on."""
        return self.worker_slice(0, 1, batch_size, start_batch, drop_last)

    def worker_slice(self, worker_id: int, num_workers: int, batch_size: int, start_batch: int = 0,
                     drop_last: bool = False):
        """(batch index, ids) of the batches worker ``worker_id`` of ``num_workers`` reads.

        Batch b (positions b*batch_size .. (b+1)*batch_size-1 of this rank)
        goes to worker b % num_workers, so merging the workers' batches by
        index gives the same sequence for any num_workers. The last batch is
        short unless drop_last.
        """
        num_workers = _check_pos_int("num_workers", num_workers)
        if not 0 <= worker_id < num_workers:
            raise ValueError(f"worker_id={worker_id} out of range for num_workers={num_workers} (valid: 0..{num_workers - 1})")
        batch_size = _check_pos_int("batch_size", batch_size)
        for b in steps_of(worker_id, num_workers, int(start_batch), self.steps(batch_size, drop_last)):
            yield b, self.positions(b * batch_size, min(self.num_samples, (b + 1) * batch_size))

    def shard_of(self, ids) -> tuple[np.ndarray, np.ndarray]:
        """(shard, index in shard) of sample ids, with this plan's offsets."""
        from shardfeed.shuffling.ids import shard_of
        return shard_of(ids, offsets=self.offsets)

    def for_rank(self, rank: int) -> EpochPlan:
        """The same epoch seen by another rank (shares the sequence tables)."""
        other = copy.copy(self)
        other.topology = self.topology.with_rank(rank)
        other._buffer = self._make_buffer(rank)
        other._fast = None
        if self._rounds_per_batch is not None:
            other.batch_size = self._rounds_per_batch * other.topology.unit_weights[rank]
        return other

    def all_ranks(self) -> list[EpochPlan]:
        return [self.for_rank(r) for r in range(self.topology.world_size)]

    # -- locality ------------------------------------------------------------
    def _rank_nodes(self) -> np.ndarray:
        t = self.topology
        return np.array([t.node_of(r) for r in range(t.world_size)], dtype=np.int64)

    def _assign_windows(self, j0: int, j1: int):
        """(V' positions, sample ids, rank of each) for locality windows [j0, j1)."""
        d, k = self._deal, self._rounds_per_batch
        j1 = min(j1, -(-d.rounds // k))
        lo, hi = j0 * k * d.round_size, min(j1 * k, d.rounds) * d.round_size
        vp = np.arange(lo, hi, dtype=np.int64)
        ids = self._seq.ids(self._pieces.to_g(d.fold(vp))) + self._id_base
        shard = np.searchsorted(self.offsets, ids, side="right") - 1
        owner = _loc.owner_node(shard, self.topology.num_nodes)
        rounds = np.array([min(k, d.rounds - j * k) for j in range(j0, j1)], dtype=np.int64)
        sizes = rounds * d.round_size
        ranks = _loc.assign(owner, sizes, rounds, np.array(d.weights, np.int64), self._rank_nodes(),
                            self.topology.num_nodes)
        return vp, ids, ranks

    def _locality_ids(self, start, stop):
        rank = self.topology.rank
        q = self._rounds_per_batch * self._deal.weights[rank]  # this rank's share of a batch
        out = []
        j, pos = start // q, start
        last = (stop - 1) // q + 1
        group = max(1, (1 << 20) // (q * self._deal.world_size))  # bounds memory per call
        while pos < stop:
            _, ids, ranks = self._assign_windows(j, min(last, j + group))
            mine = ids[ranks == rank]
            base = j * q
            out.append(mine[pos - base: stop - base])
            pos = min(stop, base + mine.shape[0])
            j += group
        return np.concatenate(out)

    # -- elastic -------------------------------------------------------------
    def replan(self, consumed, topology: Topology, *, drop_last: bool | None = None,
               batch_size: int | None = None) -> EpochPlan:
        """The plan, for a new topology, of exactly what this epoch has left.

        ``consumed[r]`` is how many positions old rank r has taken (all ranks
        step together, so it is steps * that rank's batch size). Together the
        old ranks' consumed prefixes and the new plan over all new ranks hold
        every sample of the epoch at least once; samples the old plan
        dropped (drop_last) are delivered by the new one, and the new one
        pads or drops by its own rule.
        """
        d = self._deal
        consumed = [int(c) for c in consumed]
        if len(consumed) != d.world_size:
            raise ValueError(f"consumed has {len(consumed)} counts but the old plan has world_size={d.world_size}; give one per old rank")
        for r, c in enumerate(consumed):
            if not 0 <= c <= d.count(r):
                raise ValueError(f"consumed[{r}]={c} out of range: old rank {r} had 0..{d.count(r)} samples this epoch")
        items = remaining(self, consumed)
        pieces = self._pieces.select(items)
        return EpochPlan(
            self.counts, self.order, self.seed, self.epoch, topology,
            drop_last=self.drop_last if drop_last is None else drop_last,
            block_shards=self.block_shards, buffer_size=self.buffer_size, start=self.start,
            locality=self.locality, batch_size=batch_size,
            _seq=self._seq, _pieces=pieces, _generation=self.generation + 1,
            _batch_rounds=self._rounds_per_batch if batch_size is None else None,
            _history=self.history + (Resize(self.topology.with_rank(0), tuple(consumed), self.drop_last,
                                            self._rounds_per_batch),))

class Resize(NamedTuple):
    """One elastic re-plan in an epoch's history: the old job and how far it got."""

    topology: Topology
    consumed: tuple[int, ...]
    drop_last: bool
    batch_rounds: int | None  # locality window: rounds of the deal per global batch


def make_plan(counts, order="global", seed: int = 0, epoch: int = 0, topology: Topology | None = None, *,
              drop_last: bool = False, block_shards: int = DEFAULT_BLOCK_SHARDS,
              buffer_size: int = DEFAULT_BUFFER_SIZE, start: int | None = None,
              locality: bool = False, batch_size: int | None = None) -> EpochPlan:
    """This rank's plan for one epoch.

    counts: samples per shard (np.int64, zeros allowed). order: an
    :class:`Order` or its name. topology: this rank's place (default: one
    rank). drop_last: drop the epoch's last < S samples instead of padding.
    block_shards: shards per window for `block`. buffer_size: samples in the
    shuffle buffer for `shard`. start: first shard taking part (shards
    before it are left out; ids stay global), e.g. the first new shard of a
    growing dataset. locality / batch_size: locality-aware dealing for
    `global` (batch_size is this rank's batch size; a node is
    topology.ranks_per_node ranks).
    """
    return EpochPlan(counts, order, seed, epoch, topology or Topology(), drop_last=drop_last,
                     block_shards=block_shards, buffer_size=buffer_size, start=start,
                     locality=locality, batch_size=batch_size)
