"""MixtureFeed: this rank's steps over the epochs of several fixed datasets mixed with exact counts.

The contract of base.Feed; the arithmetic (interleave, MixturePlan) is in
shuffling/mixture_plans.py, the counts in shuffling/mixture_counts.py. Everything
is a pure function of (sources, counts, seed, epoch, job), so ranks agree
without messages and resume is exact:

- Epoch ``e`` takes ``counts[i]`` samples of source ``i`` (loader/mixture.py
  apportions them). Source ``i`` is read as an endless stream: its own
  permutation of source-epoch 0, then of source-epoch 1, ... (the source's
  PlanSpec at world size 1); mixture epoch ``e`` takes the stream's
  positions ``[C_i(e), C_i(e) + counts[i])`` where ``C_i(e)`` sums the
  counts of the earlier epochs. A source with fewer samples than its count
  is repeated (the next source-epoch has a fresh permutation); one with more
  is sub-sampled, and the next epoch continues where this one stopped, so
  every sample comes before any repeats.
- The counts and start positions are the feed's own: computed for its job
  (with ``epoch_steps`` an epoch's length depends on the global batch) and
  remembered here, or pinned from a saved state whose job had another
  global batch, so the rest of that epoch is exactly the saving job's rest.
  The Mixture's ``MixtureCounts`` is a frozen value every feed reads alike.
- The epoch's global stream interleaves the sources by Webster / Sainte-Lague
  apportionment, every prefix within +-1 item per source of its share, each
  position in closed form (shuffling/mixture_plans.py says how).
- The stream is dealt to ranks like the follow feed's global batches:
  global batch ``g`` is positions ``[g*G, (g+1)*G)`` with ``G`` the sum of
  the batch sizes, rank ``r`` takes its slice; the last short batch is split
  in proportion to the batch sizes (ranks past a tail smaller than the world
  size repeat one tail sample: padding of at most world_size-1), dropped
  with ``drop_last``. All ranks take the same steps.
- Elastic resume: the ranks step together, so after ``s`` steps the job has
  consumed the first ``s * G`` positions; another world size deals the rest
  from there.

Sample ids handed to the worker are ids of the Mixture's combined index (the
sources' shards one after another), so one BatchMaker reads every source:
no per-batch encoding or regrouping.
"""

from __future__ import annotations

from shardfeed.loader.audit import ID_CHUNK, distinct
from shardfeed.loader.feeds.base import AuditSources, Feed, Upcoming, WorkItem, check_epoch, first_uses
from shardfeed.loader.schedule import BatchSchedule
from shardfeed.loader.state_checks import VERSION as STATE_VERSION
from shardfeed.loader.state_checks import (
    check_batch_sizes,
    check_header,
    check_ints,
    check_same_content,
    check_same_data,
    out_of_range,
)
from shardfeed.shuffling.mixture_counts import starts_from
from shardfeed.shuffling.mixture_plans import MixturePlan
from shardfeed.shuffling.stream_plans import StreamPlan

_LOOKAHEAD_STEPS = 4096
_COUNTS_KEPT = 16  # epochs whose counts a feed remembers (a resumed or stepping feed asks about two or three)


class MixtureFeed(Feed):
    """This rank's steps over a Mixture (see the module docstring)."""

    kind = "mixture"

    def __init__(self, mixture, schedule: BatchSchedule, rank: int, world_size: int,
                 ranks_per_node: int | None = None, epoch: int = 0):
        super().__init__(schedule, rank, world_size, ranks_per_node)
        self.mixture = mixture
        self.fingerprint = mixture.fingerprint()
        self.identity = mixture.identity()
        self.drop_last = mixture.drop_last
        self.epoch, self.step, self.base, self.base_step = int(epoch), 0, 0, 0
        self._plan: tuple | None = None
        # (epoch, counts, starts) taken from a saved state whose job's global batch sized that epoch
        # otherwise (epoch_steps); later epochs' starts follow from it
        self._pinned: tuple[int, list[int], list[int]] | None = None
        self._counts: dict[int, tuple[list[int], list[int]]] = {}  # epoch -> (counts, starts), this feed's
        self.job(self.epoch)
        self.counts(self.epoch)  # a bad weight or length fails when the Loader is made

    # -- counts -------------------------------------------------------------
    def _global_batch(self, epoch: int) -> int | None:
        return sum(self.job(epoch).batch_sizes) if self.mixture.mixing.epoch_steps is not None else None

    def _count_of(self, epoch: int) -> list[int]:
        return self.mixture.mixing.at(epoch, self._global_batch(epoch))

    def counts(self, epoch: int | None = None) -> tuple[list[int], list[int]]:
        """(samples of each source in ``epoch``, each source's stream position at its start) for
        this feed's job: the pinned ones for a pinned epoch, later epochs counted on from them."""
        epoch = self.epoch if epoch is None else epoch
        got = self._counts.get(epoch)
        if got is None:
            known = dict(self._counts)
            if self._pinned is not None:
                known[self._pinned[0]] = (self._pinned[1], self._pinned[2])
            if epoch in known:
                got = known[epoch]
            else:
                below = max((e for e in known if e < epoch), default=None)
                since, starts = (0, [0] * len(self.mixture.names)) if below is None else (
                    below + 1, [a + c for a, c in zip(known[below][1], known[below][0])])
                got = (self._count_of(epoch), starts_from(self._count_of, epoch, since, starts))
            if len(self._counts) >= _COUNTS_KEPT:
                del self._counts[next(iter(self._counts))]
            self._counts[epoch] = got
        return got

    def _total(self, epoch: int) -> int:
        return sum(self.counts(epoch)[0])

    def _pin(self, pinned: tuple[int, list[int], list[int]] | None) -> None:
        if pinned != self._pinned:
            self._pinned, self._counts, self._plan = pinned, {}, None

    # -- plans ------------------------------------------------------------
    def _split(self, epoch: int, base: int, sizes) -> tuple[int, int]:
        """(full global batches, tail samples) of the rest of ``epoch`` after ``base``."""
        left = self._total(epoch) - base
        G = sum(sizes)
        full, tail = divmod(left, G)
        return full, (0 if self.drop_last else tail)

    def plan(self, epoch: int | None = None, base: int | None = None) -> MixturePlan:
        epoch = self.epoch if epoch is None else epoch
        base = self.base if base is None else base
        sizes = self.job(epoch).batch_sizes
        key = (epoch, base, sizes)
        if self._plan is None or self._plan[0] != key:
            full, tail = self._split(epoch, base, sizes)
            deal = StreamPlan(base, sizes, self.rank, 0, False, full, tail)
            mx = self.mixture
            counts, starts = self.counts(epoch)
            self._plan = (key, MixturePlan(mx.specs(), mx.offsets(), counts, starts, deal))
        return self._plan[1]

    def steps(self, epoch: int | None = None, history=None) -> int:
        """Steps of ``epoch`` from its start (history=()) or of what is left of the current job, plus the steps taken."""
        epoch = self.epoch if epoch is None else epoch
        if history == () or epoch != self.epoch:
            full, tail = self._split(epoch, 0, self.job(epoch).batch_sizes)
            return full + (tail > 0)
        full, tail = self._split(epoch, self.base, self.job(epoch).batch_sizes)
        return self.base_step + full + (tail > 0)

    def padded(self, epoch: int | None = None) -> int:
        """Positions repeated as padding in ``epoch`` (the current job's tail)."""
        epoch = self.epoch if epoch is None else epoch
        base = self.base if epoch == self.epoch else 0
        _, tail = self._split(epoch, base, self.job(epoch).batch_sizes)
        return max(0, self.world_size - tail) if tail else 0

    # -- the contract ------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        epoch = check_epoch(epoch)
        if epoch != self.epoch:
            self.epoch, self.step, self.base, self.base_step = epoch, 0, 0, 0

    def next_epoch(self) -> None:
        self.epoch, self.step, self.base, self.base_step = self.epoch + 1, 0, 0, 0

    def next(self) -> WorkItem:
        plan = self.plan()
        deal, bs = plan.deal, self.batch_size()
        g = self.step - self.base_step
        if g < deal.full:
            start, stop = g * bs, (g + 1) * bs
        elif g == deal.full and deal.tail:
            _, n = deal.shares[self.rank]
            start, stop = g * bs, g * bs + max(n, 1)
        else:
            raise StopIteration
        self.step += 1
        return WorkItem(self.epoch, self.step - 1, plan, start, stop, self.stage(), self.get_state())

    def consumed(self) -> int:
        """Positions of the epoch's stream all ranks have taken."""
        G = sum(self.job().batch_sizes)
        return min(self._total(self.epoch), self.base + (self.step - self.base_step) * G)

    def get_state(self) -> dict:
        job = self.job()
        counts, starts = self.counts(self.epoch)
        return {"version": STATE_VERSION, "kind": self.kind, "epoch": self.epoch, "step": self.step,
                "base": self.base, "base_step": self.base_step, "world_size": job.world_size,
                "batch_sizes": list(job.batch_sizes), "counts": list(counts), "starts": list(starts),
                "dataset": dict(self.fingerprint), "data": dict(self.identity)}

    def _start(self) -> None:
        self.step, self.base, self.base_step = 0, 0, 0

    def _checked(self, state: dict) -> dict:
        s = check_state(state, self.fingerprint, self.identity, len(self.mixture.sources))
        epoch = s["epoch"]
        mixing = self.mixture.mixing
        pinned, (counts, starts) = self._pinned, self.counts(epoch)
        if mixing.epoch_steps is not None and "starts" in s and [s["counts"], s["starts"]] != [counts, starts]:
            # epoch_steps: the saving job's global batch sized this epoch (or an earlier one its
            # starts count on from); keep its counts and positions (checked against the weights), so
            # the rest of the epoch is exactly its rest. Only this feed takes them: another feed
            # over the same Mixture counts for its own job.
            counts = self._count_of(epoch)
            if [s["counts"], s["starts"]] == [counts, starts_from(self._count_of, epoch, 0, [0] * len(counts))]:
                pinned = None
            else:
                if mixing.counts is None and s["counts"] != mixing.split_of(epoch, sum(s["counts"])):
                    raise ValueError(f"state's epoch {epoch} mixes counts {s['counts']}, not the weights' split of "
                                     f"{sum(s['counts'])} samples; resume with the same weights")
                pinned, counts = (epoch, list(s["counts"]), list(s["starts"])), list(s["counts"])
        if s["counts"] != counts:
            raise ValueError(f"state's epoch {epoch} mixes counts {s['counts']} but this Mixture gives {counts} "
                             "(weights, counts or epoch_samples changed); resume with the same mixture settings")
        total, G_old = sum(counts), sum(s["batch_sizes"])
        if s["base"] > total:
            raise out_of_range("base", s["base"], 0, total, f"epoch {epoch}'s {total} mixed samples")
        full, tail = divmod(total - s["base"], G_old)
        hi = s["base_step"] + full + (1 if tail and not self.drop_last else 0)
        if not s["base_step"] <= s["step"] <= hi:
            raise out_of_range("step", s["step"], s["base_step"], hi, f"epoch {epoch} of the saved job "
                               f"({total} mixed samples, global batch {G_old}, from position {s['base']})")
        self._pin(pinned)  # a refused state leaves the feed as it was
        return s

    def _restore(self, s: dict) -> None:
        self.epoch, self.step, self.base, self.base_step = s["epoch"], s["step"], s["base"], s["base_step"]

    def _rejob(self, s: dict) -> None:
        """Another job: it deals what the saved one had not consumed."""
        epoch, G_old = s["epoch"], sum(s["batch_sizes"])
        consumed = min(self._total(epoch), s["base"] + (s["step"] - s["base_step"]) * G_old)
        self.epoch, self.step, self.base, self.base_step = epoch, s["step"], consumed, s["step"]

    def lookahead(self, k: int, epochs: int = 2) -> list[Upcoming]:
        """Up to ``k`` shards of the combined index in order of next use (bounded scan)."""
        out: list[Upcoming] = []
        seen: set[int] = set()
        offsets = self.mixture.index.offsets
        epoch, step, base, base_step = self.epoch, self.step, self.base, self.base_step
        budget = _LOOKAHEAD_STEPS
        for _ in range(max(1, epochs)):
            plan, bs = self.plan(epoch, base), self.batch_size(epoch)
            deal = plan.deal
            g0 = step - base_step
            g1 = min(deal.full + (deal.tail > 0), g0 + max(0, budget))
            steps = ((epoch, base_step + g, plan.positions(
                g * bs, (g + 1) * bs if g < deal.full else g * bs + max(deal.shares[self.rank][1], 1)))
                for g in range(g0, g1))
            if first_uses(steps, offsets, k, out, seen):
                return out
            budget -= max(0, g1 - g0)
            if budget <= 0:
                break
            epoch, step, base, base_step = epoch + 1, 0, 0, 0
        return out

    # -- the audit ----------------------------------------------------------------
    def audit_sources(self) -> AuditSources:
        mx = self.mixture
        return AuditSources(list(mx.names), list(mx.sizes), mx.source_of)

    def audit_expect(self, item: WorkItem) -> dict:
        """The epoch's deliveries per source and its distinct samples: a source that
        repeats (count > size) or continues a sub-sampled permutation is counted from
        its ids (one pass over the epoch's ids of that source)."""
        plan, uniq = item.plan, []
        for i, n in enumerate(self.mixture.sizes):
            c, start = plan.counts[i], plan.starts[i]
            if c >= 2 * n or (c >= n and start % n == 0):
                uniq.append(n)
                continue
            uniq.append(distinct(n, (plan.source_ids(i, p, min(start + c, p + ID_CHUNK))
                                     for p in range(start, start + c, ID_CHUNK))))
        return {"delivered": list(plan.counts), "unique": uniq, "padded": self.padded(item.epoch)}

    def __repr__(self) -> str:
        return f"MixtureFeed(rank={self.rank}/{self.world_size}, epoch={self.epoch}, step={self.step}, base={self.base})"



def check_state(state: dict, fingerprint: dict, identity: dict | None = None, sources: int | None = None) -> dict:
    """Validate a mixture feed's state; ValueError naming the mismatch and the fix."""
    check_header(state, MixtureFeed.kind, "resume a Mixture from a Mixture Loader's state")
    check_ints(state, {"epoch": 0, "step": 0, "base": 0, "base_step": 0, "world_size": 1})
    check_batch_sizes(state)
    for key in ("counts", "starts"):
        v = state.get(key)
        if key in state or key == "counts":
            if not isinstance(v, list) or (sources is not None and len(v) != sources) or not all(
                    isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
                raise ValueError(f"state[{key!r}]={v!r} must list the epoch's int >= 0 per source")
    check_same_data(state, fingerprint, "open the same sources with the same seed, shuffle and drop_last")
    check_same_content(state, identity or {}, "this Mixture's sources", "open the same sources to resume")
    return state
