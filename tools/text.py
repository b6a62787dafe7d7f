"""Words and terminal output shared by the subcommands.

One place for the small things every command prints the same way: counted
nouns ("1 shard", "2 shards"), whether to draw a progress bar, and how
``--help`` shows defaults.
"""

from __future__ import annotations

import argparse
import sys


def plural(n: int, noun: str, many: str | None = None) -> str:
    """``plural(1, "shard") -> "1 shard"``, ``plural(1200, "sample") -> "1,200 samples"``.

    ``many`` is the plural form when adding "s" is wrong (``plural(n, "class", "classes")``).
    """
    return f"{n:,} {noun if n == 1 else many or noun + 's'}"


def show_progress(quiet: bool = False, stream=None) -> bool:
    """Draw a progress bar only for a person watching a terminal.

    Redirected to a file or a CI log, a bar becomes hundreds of carriage-return
    lines; there each long stage prints one summary line instead.
    """
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return not quiet and bool(isatty and isatty())


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's line breaks and appends "(default: X)" to each option.

    Unlike ``ArgumentDefaultsHelpFormatter`` it says nothing for flags (default
    False), for options without a default (None), and where the help text
    already states its default.
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        # identity, not ==: a default of 0 is worth showing, False (a flag) is not
        if (any(default is v for v in (None, False, argparse.SUPPRESS)) or not action.option_strings
                or "default" in text or "%(default)" in text):
            return text
        return f"{text} (default: %(default)s)".lstrip()
