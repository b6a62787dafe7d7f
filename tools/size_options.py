"""Sizes on the command line: the argparse type of every size option (``--cache-limit``,
``--max-shard-bytes``), so a bad size reads the same in every command; the parser is
formats/base/byte_sizes.py, which the API uses too."""

from __future__ import annotations

import argparse
import re

from shardfeed.formats.base.byte_sizes import human_bytes, parse_size

__all__ = ["human_bytes", "join_negative_values", "parse_size", "size_option"]


def size_option(text: str) -> int:
    """``type=`` of a size option: argparse prints ``argument --cache-limit: size '-5MB' must be positive``."""
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


_NEGATIVE = re.compile(r"^-\d")


def join_negative_values(argv: list[str]) -> list[str]:
    """``--cache-limit -5MB`` -> ``--cache-limit=-5MB``: argparse takes a value that starts with
    ``-`` and is not a plain number for an option and reports a missing argument; joined, it
    reaches the option's own check, which says what is wrong with it."""
    out: list[str] = []
    for tok in argv:
        prev = out[-1] if out else ""
        if _NEGATIVE.match(tok) and prev.startswith("--") and "=" not in prev and prev != "--":
            out[-1] = f"{prev}={tok}"
        else:
            out.append(tok)
    return out
