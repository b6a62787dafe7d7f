"""Byte counts for humans: parse ``256MB`` / ``1GiB`` and print them back.

One parser and one wording for every size the project takes, in the API
(``cache_limit_bytes="50GB"``) and on every command line (``--cache-limit``,
``--max-shard-bytes``): a bad size reads the same wherever it was given.
"""

from __future__ import annotations

import re

# Decimal units are powers of 1000 and binary ones (``KiB`` or a bare ``K``)
# powers of 1024, as in `ls -h`, `du` and most shard tools.
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE_RE = re.compile(r"^\s*([-+]?\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int) -> int:
    """``"256MB"`` -> 256_000_000, ``"1GiB"`` -> 2**30, ``"4096"`` or ``4096`` -> 4096."""
    if isinstance(text, bool):
        text = repr(text)  # True is not a size of 1 byte
    m = _SIZE_RE.match(str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"size {text!r} is not a number with an optional unit "
                         "(B, KB, MB, GB, TB = powers of 1000; KiB, MiB, GiB, TiB or K, M, G, T = powers of 1024)")
    value = float(m.group(1)) * _UNITS[unit]
    if not value < 2**62:  # inf, nan and sizes no disk holds (an int64 of bytes must still add up)
        raise ValueError(f"size {text!r} is larger than {2**62} bytes")
    value = int(value)
    if value <= 0:
        raise ValueError(f"size {text!r} must be positive")
    return value


def parse_limit(value, name: str, folder) -> int:
    """A byte limit given as an int, a size string (``"50GB"``) or a float in (0, 1]: that share of
    the size of the disk holding ``folder()`` (called only then). Errors start with ``name``."""
    import os
    import shutil

    if isinstance(value, float) and 0 < value <= 1:
        path = folder()
        os.makedirs(path, exist_ok=True)
        return max(1, int(shutil.disk_usage(path).total * value))
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"{name}={value!r} must be a number of bytes, a size such as '50GB', or a float in (0, 1] "
                        "(that share of the disk)")
    try:
        return parse_size(value)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


def human_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
