"""Apportionment: a whole number of samples split by weights, exactly.

``apportion`` is Hamilton's largest-remainder rule (a mixture's per-epoch or
per-batch counts); ``tail_shares`` is the same rule for the last short global
batch of a stream or mixed epoch, with two constraints of dealing: no rank
gets more than its batch size, and every rank gets at least one sample when
there are enough. Pure arithmetic: the same on every rank and run.
"""

from __future__ import annotations

from fractions import Fraction


def largest_remainder(total: int, weights, caps=None, empty_first: bool = False) -> list[int]:
    """``total`` split in proportion to ``weights`` (Hamilton's rule): each gets the
    floor of its quota, the leftover goes one each by largest remainder (ties to
    the lower index); ``empty_first``: to those whose floor is 0 before the rest;
    ``caps``: never above them (RuntimeError if they leave samples over)."""
    w = [Fraction(x) for x in weights]
    s = sum(w)
    quotas = [total * x / s for x in w]
    out = [int(q) for q in quotas]
    left = total - sum(out)
    for i in sorted(range(len(w)), key=lambda i: (empty_first and out[i] > 0, -(quotas[i] - out[i]), i)):
        if left == 0:
            break
        if caps is None or out[i] < caps[i]:
            out[i] += 1
            left -= 1
    if left:  # the caller's caps always leave room; a guard against a wrong split, never silent
        raise RuntimeError(f"split of {total} over {list(weights)} (caps {caps}) left {left} samples")
    return out


def apportion(total: int, weights) -> list[int]:
    """``total`` split by ``weights`` exactly (Hamilton's largest remainder; ties to the lower index)."""
    return largest_remainder(total, weights)


def tail_shares(n: int, batch_sizes: tuple[int, ...]) -> list[tuple[int, int]]:
    """(offset, count) of each rank in a last global batch of ``n < G`` samples:
    proportional to the batch sizes (never above them), at least one each when
    n >= world size; contiguous, in rank order, covering [0, n) exactly once."""
    W = len(batch_sizes)
    # the leftover goes to empty ranks first, then by largest remainder
    q = largest_remainder(n, batch_sizes, caps=batch_sizes, empty_first=True)
    for r in range(W):  # move one sample to each still-empty rank from the largest share
        if q[r] == 0:
            s = max(range(W), key=lambda i: q[i])
            if q[s] <= 1:
                break
            q[s] -= 1
            q[r] += 1
    out, off = [], 0
    for c in q:
        out.append((off, c))
        off += c
    return out
