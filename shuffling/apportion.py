"""Apportionment: a whole number of samples split by weights, exactly.

``apportion`` is Hamilton's largest-remainder rule (a mixture's per-epoch or
per-batch counts); ``tail_shares`` is the same rule for the last short global
batch of a stream or mixed epoch, with two constraints of dealing: no rank
gets more than its batch size, and every rank gets at least one sample when
there are enough. Pure arithmetic: the same on every rank and run.
"""

from __future__ import annotations

from fractions import Fraction


def apportion(total: int, weights) -> list[int]:
    """``total`` split by ``weights`` exactly (Hamilton's largest remainder; ties to the lower index)."""
    w = [Fraction(x) for x in weights]
    s = sum(w)
    quotas = [total * x / s for x in w]
    out = [int(q) for q in quotas]
    order = sorted(range(len(w)), key=lambda i: (-(quotas[i] - out[i]), i))
    for i in order[:total - sum(out)]:
        out[i] += 1
    return out



def tail_shares(n: int, batch_sizes: tuple[int, ...]) -> list[tuple[int, int]]:
    """(offset, count) of each rank in a last global batch of ``n < G`` samples:
    proportional to the batch sizes (never above them), at least one each when
    n >= world size; contiguous, in rank order, covering [0, n) exactly once."""
    G, W = sum(batch_sizes), len(batch_sizes)
    q = [n * b // G for b in batch_sizes]
    left = n - sum(q)
    # the leftover goes to empty ranks first, then by largest remainder (Hamilton's rule)
    for r in sorted(range(W), key=lambda r: (q[r] > 0, -(n * batch_sizes[r] % G), r)):
        if left == 0:
            break
        if q[r] < batch_sizes[r]:
            q[r] += 1
            left -= 1
    if left:  # n < G always leaves room; a guard against a wrong split, never silent
        raise RuntimeError(f"tail split of {n} over {batch_sizes} left {left} samples")
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
