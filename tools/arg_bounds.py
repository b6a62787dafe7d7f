"""Bounds of the CLI's numeric arguments and the SRC/DST overlap rule.

Every check returns an error line naming the argument and the range it must
lie in (the subcommand prints it and exits 2), or None. Why bounds at all:
argparse takes any int or float, and a value past what the command can do
(``--epochs 10**9``, ``--idle-exit-s nan``) ran for hours or forever, or
died in a traceback deep inside numpy, instead of saying what was wrong.
"""

from __future__ import annotations

import math
import os

DAY_S = 86400.0
MAX_DURATION_S = 365 * DAY_S


def duration(name: str, value, lo: float = 0.0, hi: float = MAX_DURATION_S, above: bool = False) -> str | None:
    """A finite number of seconds in [lo, hi] (``above``: > lo)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and (value > lo if above else value >= lo) and value <= hi
    if ok:
        return None
    return f"{name} {value!r} must be a finite number of seconds in {'(' if above else '['}{lo:g}, {hi:g}]"


def count(name: str, value, lo: int, hi: int) -> str | None:
    """An integer in [lo, hi]."""
    if isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi:
        return None
    return f"{name} {value!r} must be an integer in [{lo}, {hi}]"


def first(*errors: str | None) -> str | None:
    return next((e for e in errors if e), None)


def _url_key(url: str) -> str:
    scheme, rest = url.split("://", 1)
    scheme = scheme.lower()
    scheme = {"s3a": "s3", "https": "http"}.get(scheme, scheme)
    return f"{scheme}://{rest.rstrip('/')}/"


def _fixed_part(path: str) -> str:
    """The folder a glob or brace pattern reads from (its part before the first wildcard)."""
    cut = min((i for i, c in enumerate(path) if c in "*?[{"), default=len(path))
    if cut == len(path):
        return path
    head = path[:cut]
    return head if head.endswith(os.sep) else os.path.dirname(head) or "."


def overlap(src: str, dst: str) -> str | None:
    """SRC and DST must not overlap: the same path or URL, or one inside the
    other (a follow-src ingest into its own folder ingests its output forever;
    a conversion into its input reads what it writes)."""
    src, dst = os.fspath(src), os.fspath(dst)
    if src.startswith("file://"):
        src = src[len("file://"):]
    if dst.startswith("file://"):
        dst = dst[len("file://"):]
    if ("://" in src) != ("://" in dst):
        return None
    # a pattern reads files of its fixed folder: DST below that folder is safe unless it recurses (**)
    pattern = "://" not in src and not os.path.exists(src) and any(c in src for c in "*?[{")
    if "://" in src:
        s, d = _url_key(src), _url_key(dst)
    else:
        s = os.path.realpath(_fixed_part(src) if pattern else src).rstrip(os.sep) + os.sep
        d = os.path.realpath(dst).rstrip(os.sep) + os.sep
    if s == d:
        return f"SRC {src} and DST {dst} are the same place; write to another folder"
    if s.startswith(d):
        return f"SRC {src} lies inside DST {dst}; the output would be read back as input. Use another folder"
    if d.startswith(s) and (not pattern or "**" in src):
        return f"DST {dst} lies inside SRC {src}; the output would be read back as input. Use another folder"
    return None
