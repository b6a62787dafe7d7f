"""Per-rank batch sizes from measured rank speed: the balancer's proposal, a pure function.

Every rank gathers the same measurements (per rank, (batch size, compute
seconds) of recent steps) and calls ``propose_batch_sizes`` with the same
arguments, so every rank computes the same sizes without another message.

Model: a rank's compute time of a step is ``t = a * b + c`` in its batch size
b (a: seconds per sample, c: seconds per step whatever the batch, such as an
optimizer step), fitted per rank to the median time at each batch size it
ran (a median, so one slow step does not move it). With one batch size seen
the rank is taken as proportional (c = 0); once a rank has run two sizes
the fit separates a and c. The sizes minimise the predicted step time of
the job, the slowest rank's ``max(a_r * b_r + c_r)``, with the sizes summing
to the global batch, inside per-rank limits, each a multiple of
``multiple``. Hysteresis: the current sizes stay unless the predicted step
time improves by more than ``threshold`` (a share), so noise does not move
them back and forth.

Plain Python floats in a fixed order of operations: the same inputs give the
same sizes on every rank and machine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

DEFAULT_THRESHOLD = 0.02  # a predicted step time this much shorter is worth a re-deal
SLOPE_TRUST = 0.25  # a fitted a with a larger relative standard error is not used (proportional instead)


class Proposal(NamedTuple):
    """What ``propose_batch_sizes`` decided and why."""

    batch_sizes: tuple[int, ...]  # the sizes to use (the current ones when ``changed`` is False)
    changed: bool
    step_s: float  # predicted step time with ``batch_sizes``
    current_s: float  # predicted step time with the current sizes (inf where they no longer fit)
    models: tuple[tuple[float, float], ...]  # per rank (a: s per sample, c: s per step)

    def as_dict(self) -> dict:
        """Plain JSON data (a state or stats entry)."""
        return {"batch_sizes": list(self.batch_sizes), "changed": self.changed,
                "step_s": _finite(self.step_s), "current_s": _finite(self.current_s),
                "models": [[a, c] for a, c in self.models]}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def fit_rank(points: Sequence[tuple[int, float]], rank: int = 0) -> tuple[float, float]:
    """(a, c) of ``t = a * b + c`` for one rank's (batch size, seconds) measurements: least
    squares over the median time at each batch size, weighted by how many steps ran it; a
    rank seen at one batch size, or a fit that would make a or c negative, is proportional."""
    groups: dict[int, list[float]] = {}
    for b, t in points:
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(f"rank {rank}: batch size {b!r} in a measurement must be an int >= 1")
        t = float(t)
        if not math.isfinite(t) or t < 0:
            raise ValueError(f"rank {rank}: compute time {t!r} must be a finite number of seconds >= 0")
        groups.setdefault(b, []).append(t)
    if not groups:
        raise ValueError(f"rank {rank} has no measurement: every rank measures at least one step before a proposal")
    xs = sorted(groups)
    ys = [_median(groups[x]) for x in xs]
    ws = [float(len(groups[x])) for x in xs]
    a = c = -1.0
    if len(xs) > 1:
        sw = sum(ws)
        xm = sum(w * x for w, x in zip(ws, xs)) / sw
        ym = sum(w * y for w, y in zip(ws, ys)) / sw
        sxx = sum(w * (x - xm) * (x - xm) for w, x in zip(ws, xs))
        a = sum(w * (x - xm) * (y - ym) for w, x, y in zip(ws, xs, ys)) / sxx
        c = ym - a * xm
        # the slope's standard error from each median's: sizes close together under noise give
        # a slope (and so c) of noise, and extrapolating it overshoots
        a_se = math.sqrt(sum((w * (x - xm)) ** 2 * _se(groups[x]) ** 2 for w, x in zip(ws, xs))) / sxx
        if a_se > SLOPE_TRUST * abs(a):
            a = -1.0
    if a <= 0 or c < 0:  # one size, a slope not known well enough, or noise: through the origin
        c = 0.0
        a = sum(w * x * y for w, x, y in zip(ws, xs, ys)) / sum(w * x * x for w, x in zip(ws, xs))
    return max(a, 1e-12), c


def _se(ts: list[float]) -> float:
    """Standard error of the median of ``ts`` (1.25 x that of the mean; 0 for one value)."""
    n = len(ts)
    if n < 2:
        return 0.0
    mean = sum(ts) / n
    return 1.25 * math.sqrt(sum((t - mean) * (t - mean) for t in ts) / (n - 1) / n)


def _median(v: list[float]) -> float:
    s = sorted(v)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def recent_points(intervals: Sequence[Sequence[tuple[int, float]]], sizes: int = 3,
                  changed: float = 0.25) -> list[tuple[int, float]]:
    """The measurements of one rank to fit, from its intervals (oldest first; each a list of
    (batch size, seconds), at one batch size but for a short last batch of an epoch): the newest interval at each of the last ``sizes``
    batch sizes it ran, so the fit sees sizes apart (a and c apart) once the rank has run
    several. A change of the rank's speed drops everything before the newest interval: an
    older size whose median time no cost model ``a*b + c`` (a, c >= 0) joins to the newest
    one's, within ``changed`` (a share): a smaller batch took longer, or a larger one more than
    proportionally longer."""
    newest = [p for p in intervals[-1]] if intervals else []
    if not newest:
        return []
    b_new = _size_of(newest)
    kept: dict[int, list] = {b_new: newest}
    for iv in reversed(intervals[:-1]):
        if iv and _size_of(iv) not in kept and len(kept) < sizes:
            kept[_size_of(iv)] = list(iv)
    t_new = _median([t for _, t in newest])
    for b, pts in kept.items():
        t = _median([x for _, x in pts])
        r = b_new / b
        if not t * min(1.0, r) / (1 + changed) <= t_new <= t * max(1.0, r) * (1 + changed):
            return newest
    return [p for pts in kept.values() for p in pts]


def _size_of(interval) -> int:
    """The batch size an interval ran at: its most frequent (an epoch's last batch may be short)."""
    counts: dict[int, int] = {}
    for b, _ in interval:
        counts[b] = counts.get(b, 0) + 1
    return max(counts, key=lambda b: (counts[b], b))


def _noise(points) -> float:
    """Relative standard error of the median time at the batch size most measured."""
    groups: dict[int, list[float]] = {}
    for b, t in points:
        groups.setdefault(b, []).append(float(t))
    ts = max(groups.values(), key=lambda v: (len(v), v))
    mean = sum(ts) / len(ts)
    return _se(ts) / mean if mean > 0 else 0.0


def _per_rank(value, world: int, name: str, default: int) -> list[int]:
    if value is None:
        return [default] * world
    vals = [value] * world if isinstance(value, int) and not isinstance(value, bool) else list(value)
    if len(vals) != world or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in vals):
        raise ValueError(f"{name}={value!r} must be an int >= 1 or one per rank ({world} ranks)")
    return vals


def propose_batch_sizes(measurements: Sequence[Sequence[tuple[int, float]]], global_batch: int,
                        current: Sequence[int] | None = None, *, min_batch=1, max_batch=None,
                        multiple: int = 1, threshold: float = DEFAULT_THRESHOLD) -> Proposal:
    """Per-rank batch sizes summing to ``global_batch`` that minimise the predicted step time.

    measurements: per rank, its (batch size, compute seconds) of recent steps (gathered, the
    same list on every rank). current: the sizes in use (None: none yet, always propose).
    min_batch / max_batch: an int for every rank or one per rank (a memory cap); max None:
    the global batch. multiple: every size a multiple of it (the rounding rule; the global
    batch and the limits must allow it). threshold: the share the predicted step time must
    improve by before the current sizes change.
    """
    world = len(measurements)
    if world < 1:
        raise ValueError("measurements must hold one list per rank (got none)")
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
        raise ValueError(f"multiple={multiple!r} must be an int >= 1")
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch % multiple \
            or global_batch < world * multiple:
        raise ValueError(f"global_batch={global_batch!r} must be an int multiple of multiple={multiple} with at "
                         f"least {multiple} per rank ({world} ranks)")
    if not 0 <= threshold < 1:
        raise ValueError(f"threshold={threshold!r} must be a share in [0, 1)")
    lo = [-(-v // multiple) for v in _per_rank(min_batch, world, "min_batch", 1)]
    hi = [v // multiple for v in _per_rank(max_batch, world, "max_batch", global_batch)]
    units = global_batch // multiple
    if any(lo_r > hi_r for lo_r, hi_r in zip(lo, hi)) or sum(lo) > units or sum(hi) < units:
        raise ValueError(f"no per-rank sizes in multiples of {multiple} between min_batch={min_batch!r} and "
                         f"max_batch={max_batch!r} sum to global_batch={global_batch}; widen the limits or change "
                         "the global batch")
    models = tuple(fit_rank(m, r) for r, m in enumerate(measurements))
    step = [(a * multiple, c) for a, c in models]  # seconds per unit of ``multiple`` samples
    sizes = _minimise(step, lo, hi, units)
    new = tuple(u * multiple for u in sizes)
    new_s = _predict(models, new)
    fits = (current is not None and len(current) == world and sum(current) == global_batch
            and all(b % multiple == 0 and lo_r * multiple <= b <= hi_r * multiple
                    for b, lo_r, hi_r in zip(current, lo, hi)))
    cur_s = _predict(models, current) if fits else math.inf
    # a gain inside the measurements' own noise is no gain: the bar rises by twice the
    # largest standard error of a rank's median time
    bar = threshold + 2 * max(_noise(m) for m in measurements)
    if fits and (tuple(current) == new or new_s >= cur_s * (1 - bar)):
        return Proposal(tuple(current), False, cur_s, cur_s, models)
    return Proposal(new, True, new_s, cur_s, models)


def _predict(models, sizes) -> float:
    return max(a * b + c for (a, c), b in zip(models, sizes))


def _minimise(step, lo: list[int], hi: list[int], units: int) -> list[int]:
    """Units per rank in [lo, hi] summing to ``units`` with the least max(a * u + c): the
    continuous optimum (equal finish times, found by bisection) rounded down, then the
    units left one at a time to the rank that would finish first with one more."""
    def at(t: float) -> list[float]:
        return [min(max((t - c) / a, lo_r), hi_r) for (a, c), lo_r, hi_r in zip(step, lo, hi)]

    t_lo = min(a * lo_r + c for (a, c), lo_r in zip(step, lo))
    t_hi = max(a * hi_r + c for (a, c), hi_r in zip(step, hi))
    for _ in range(200):
        mid = (t_lo + t_hi) / 2
        if sum(at(mid)) < units:
            t_lo = mid
        else:
            t_hi = mid
    out = [max(lo_r, min(int(math.floor(u)), hi_r)) for u, lo_r, hi_r in zip(at(t_lo), lo, hi)]
    while sum(out) > units:  # rounding never overshoots by much: take from the slowest that can give
        r = max((r for r in range(len(out)) if out[r] > lo[r]), key=lambda r: (step[r][0] * out[r] + step[r][1], -r))
        out[r] -= 1
    while sum(out) < units:
        r = min((r for r in range(len(out)) if out[r] < hi[r]),
                key=lambda r: (step[r][0] * (out[r] + 1) + step[r][1], r))
        out[r] += 1
    return out
