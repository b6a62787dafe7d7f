"""Helpers for the loader tests: loaders over small datasets, the one
save/restore checker (STYLE.md), a per-rank simulator for topologies, and a
wait for the cache's sample prefetcher to settle."""

from __future__ import annotations

from shardfeed.loader import Loader, ShardDataset


def keys_of(batches) -> list[str]:
    return [k for b in batches for k in b["__key__"]]


def run_epochs(loader, epochs: int = 1) -> list[list[dict]]:
    out = []
    for _ in range(epochs):
        out.append(list(loader))
    return out


def check_save_restore(make_loader, points, epochs: int = 2) -> None:
    """Save mid-epoch, restore into a new loader, compare the rest of the
    epoch and the next one with an uninterrupted run (pytorch/data's
    run_test_save_load_state). ``points`` are steps into the first epoch."""
    with make_loader() as ref:
        epochs_seen = [[keys_of([b]) for b in ref] for _ in range(epochs)]
    expected = [b for ep in epochs_seen for b in ep]
    per_epoch = len(epochs_seen[0])
    for k in points:
        with make_loader() as a:
            it = iter(a)
            got_before = [keys_of([next(it)]) for _ in range(k)]
            state = a.state_dict()
        assert got_before == expected[:k]
        with make_loader() as b:
            b.load_state_dict(state)
            rest = [keys_of([x]) for x in b]
            following = [keys_of([x]) for ep in range(epochs - 1) for x in b]
        assert rest == expected[k:per_epoch], f"resume at step {k}: rest of epoch differs"
        assert following == expected[per_epoch:], f"resume at step {k}: the next epoch differs"


def rows_until(loader, row, state=None, stop=None) -> tuple[list, dict | None]:
    """The two halves of a resume test over one epoch. Enters ``loader``, loads ``state`` if
    given, and returns ``[row(batch) for each batch]`` with None, or, once ``stop`` batches are
    in, those rows and the loader's state after them (the loader is closed either way)."""
    with loader as ld:
        if state is not None:
            ld.load_state_dict(state)
        out = []
        for b in ld:
            out.append(row(b))
            if stop is not None and len(out) == stop:
                return out, ld.state_dict()
        return out, None


def rank_loaders(root, world_size, batch_size, num_workers=0, **ds_kwargs):
    return [Loader(ShardDataset(root, rank=r, world_size=world_size, **ds_kwargs), batch_size,
                   num_workers=num_workers) for r in range(world_size)]


def step_together(loaders, steps=None):
    """Iterate all ranks' loaders in lock step (as DDP would); returns per-rank key lists
    and the number of steps each took."""
    its = [iter(L) for L in loaders]
    keys = [[] for _ in loaders]
    taken = [0] * len(loaders)
    done = [False] * len(loaders)
    s = 0
    while not all(done) and (steps is None or s < steps):
        for r, it in enumerate(its):
            if done[r]:
                continue
            try:
                b = next(it)
            except StopIteration:
                done[r] = True
                continue
            keys[r] += b["__key__"]
            taken[r] += 1
        s += 1
    return keys, taken


def prefetch_settled(prefetcher, timeout_s: float = 20.0) -> None:
    """Wait until the sample prefetcher has planned the latest position and fetches nothing."""
    import time

    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        with prefetcher._cv:
            now = (prefetcher.passes, prefetcher.fetched_samples, len(prefetcher._inflight))
        if now == last and now[2] == 0:
            return
        last = now
        time.sleep(0.3)
    raise AssertionError(f"the prefetcher did not settle in {timeout_s} s: {last}")
