"""Shard patterns: a source written the WebDataset way (brace patterns, globs, lists) expanded to shard paths.

``shards-{000000..000099}.tar``, ``{train,val}/*.tar`` or ``[a.tar, b.tar]``
name shard files; ``expand_source`` turns any of them into paths, in order.
Patterns come from users and config files, so they are untrusted: no shell is
involved, a brace pattern is counted before it is expanded (a pattern that
would name more than ``MAX_NAMES`` paths is refused without building them),
and globs are non-recursive and stop at the same bound.

Brace syntax (as bash and the ``braceexpand`` package): ``{a,b,c}`` lists,
``{1..10}`` / ``{000..099}`` numeric ranges (zero padding kept when an end
has a leading zero), ``{a..e}`` letter ranges, an optional step
``{0..10..2}``, nesting. A brace with neither a comma nor a range (``{x}``)
or without a partner stays literal (braceexpand raises there), and a
backslash is an ordinary character, not an escape.
"""

from __future__ import annotations

import glob
import os
import re

from shardfeed.formats.errors import ShardError

MAX_NAMES = 1_000_000
MAX_PATTERN_CHARS = 1 << 20
MAX_NESTING = 32
SHARD_SUFFIXES = (".tar", ".tgz", ".tar.gz", ".tar.zst", ".parquet", ".arrow")

_GLOB_MAGIC = re.compile(r"[*?[]")
_NUM_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.(-?\d+))?$")
_CHAR_RANGE = re.compile(r"^([A-Za-z])\.\.([A-Za-z])(?:\.\.(-?\d+))?$")
_MAX_RANGE_TEXT = 64  # a range's text is short: longer groups are never tested against the regexes


class _Range:
    # plain classes, not dataclasses: building a dataclass compiles its methods at import (issue #24)
    __slots__ = ("start", "stop", "step", "width", "letters")

    def __init__(self, start: int, stop: int, step: int, width: int, letters: bool):
        self.start = start
        self.stop = stop  # inclusive
        self.step = step  # signed, never 0
        self.width = width  # zero padding; 0 for none
        self.letters = letters

    @property
    def count(self) -> int:  # not __len__: a range may count past sys.maxsize before it is refused
        return (self.stop - self.start) // self.step + 1

    def values(self) -> list[str]:
        vals = range(self.start, self.stop + (1 if self.step > 0 else -1), self.step)
        if self.letters:
            return [chr(v) for v in vals]
        return [f"{v:0{self.width}d}" for v in vals]


class _Alt:
    __slots__ = ("options",)

    def __init__(self, options: tuple):
        self.options = options  # of part lists


def is_pattern(text: str) -> bool:
    """True when ``text`` holds glob magic or a brace group that expands."""
    if _GLOB_MAGIC.search(text):
        return True
    return "{" in text and any(not isinstance(p, str) for p in _Parser(text).parse())


def count_braces(pattern: str) -> int:
    """How many names ``pattern`` expands to, computed without expanding it."""
    return _count(_Parser(pattern).parse())


def expand_braces(pattern: str, limit: int = MAX_NAMES) -> list[str]:
    """Every name the brace pattern stands for, in order; refuses more than ``limit``."""
    parts = _Parser(pattern).parse()
    n = _count(parts)
    if n > limit:
        raise ShardError(pattern, f"brace pattern expands to {n:,} names, more than the limit of {limit:,}; "
                                  "split it into smaller patterns")
    return _expand(parts)


class _Parser:
    """One pass pairs the braces and finds each group's top-level commas, so
    parsing stays linear in the pattern's length however it is nested."""

    def __init__(self, pattern: str):
        if len(pattern) > MAX_PATTERN_CHARS:
            raise ShardError(pattern[:80] + "...", f"pattern of {len(pattern):,} characters is longer than "
                                                   f"{MAX_PATTERN_CHARS:,}")
        self.s = pattern
        self.close: dict[int, int] = {}  # '{' position -> its '}'
        self.commas: dict[int, list[int]] = {}  # '{' position -> its top-level commas
        stack: list[int] = []
        for i, c in enumerate(pattern):
            if c == "{":
                stack.append(i)
            elif c == "}" and stack:
                self.close[stack.pop()] = i
            elif c == "," and stack:
                self.commas.setdefault(stack[-1], []).append(i)
        # a comma seen while an unpaired '{' was innermost belongs to no group
        for i in [i for i in self.commas if i not in self.close]:
            del self.commas[i]

    def parse(self, lo: int = 0, hi: int | None = None, depth: int = 0) -> list:
        if depth > MAX_NESTING:
            raise ShardError(self.s, f"brace groups nested deeper than {MAX_NESTING}")
        hi = len(self.s) if hi is None else hi
        parts: list = []
        text: list[str] = []
        i = lo
        while i < hi:
            group = self._group(i, depth) if self.s[i] == "{" and i in self.close else None
            if group is None:
                text.append(self.s[i])
                i += 1
                continue
            if text:
                parts.append("".join(text))
                text = []
            parts.append(group)
            i = self.close[i] + 1
        if text:
            parts.append("".join(text))
        return parts

    def _group(self, i: int, depth: int):
        j = self.close[i]
        commas = self.commas.get(i)
        if commas:
            bounds = [i, *commas, j]
            return _Alt(tuple(self.parse(a + 1, b, depth + 1) for a, b in zip(bounds, bounds[1:])))
        if j - i - 1 > _MAX_RANGE_TEXT:
            return None
        return self._range(self.s[i + 1:j])

    def _range(self, inner: str) -> _Range | None:
        m = _NUM_RANGE.match(inner)
        letters = m is None
        m = m or _CHAR_RANGE.match(inner)
        if m is None:
            return None
        a, b, step_text = m.groups()
        step = abs(int(step_text)) if step_text else 1
        step = step or 1  # as bash and braceexpand: a step of 0 counts as 1
        if letters:
            if a.isupper() != b.isupper():  # {Z..a} would run through [ \\ ] ^ _ `
                return None
            start, stop, width = ord(a), ord(b), 0
        else:
            start, stop = int(a), int(b)
            padded = any(len(t.lstrip("-")) > 1 and t.lstrip("-")[0] == "0" for t in (a, b))
            width = max(len(a), len(b)) if padded else 0
        return _Range(start, stop, step if stop >= start else -step, width, letters)


def _count(parts: list) -> int:
    n = 1
    for p in parts:
        if isinstance(p, _Range):
            n *= p.count
        elif isinstance(p, _Alt):
            n *= sum(_count(o) for o in p.options)
    return n


def _expand(parts: list) -> list[str]:
    out = [""]
    for p in parts:
        if isinstance(p, str):
            out = [o + p for o in out]
            continue
        tails = p.values() if isinstance(p, _Range) else [t for o in p.options for t in _expand(o)]
        out = [o + t for o in out for t in tails]
    return out


def _is_shard(path: str) -> bool:
    return path.endswith(SHARD_SUFFIXES) and not os.path.basename(path).startswith(".")


class ShardPath:
    __slots__ = ("path", "explicit", "named_by")

    def __init__(self, path: str, explicit: bool, named_by: str = ""):
        self.path = path
        self.explicit = explicit  # named outright (a list entry or a brace name), not found by a glob
        self.named_by = named_by  # the list entry or pattern it came from, for error messages

    def __repr__(self) -> str:
        return f"ShardPath(path={self.path!r}, explicit={self.explicit!r}, named_by={self.named_by!r})"


def expand_source(source, limit: int = MAX_NAMES) -> list[ShardPath]:
    """The shard files a pattern, or a list/tuple of paths and patterns, names.

    Order is kept (glob matches sorted); a file named twice is listed once.
    A glob keeps only shard files (``*.tar``, ...; dotfiles and sidecars are
    left out); a name given outright must exist and be a shard file. Raises
    ShardError naming the pattern or file when something names nothing.
    """
    if isinstance(source, (list, tuple)):
        items = list(source)
        if not items:
            raise ShardError("[]", "the list of shards is empty")
    else:
        items = [source]
    out: list[ShardPath] = []
    seen: set[str] = set()
    for item in items:
        for sp in _expand_item(_as_path(item), limit):
            key = os.path.normpath(os.path.abspath(sp.path))
            if key not in seen:
                seen.add(key)
                out.append(sp)
        if len(out) > limit:
            raise ShardError(str(item), f"the source names more than {limit:,} shard files; split it")
    return out


def _as_path(item) -> str:
    try:
        text = os.fspath(item)
    except TypeError:
        raise TypeError(f"a shard source is a path, a pattern or a list of them, got {type(item).__name__} "
                        f"{item!r}") from None
    if not isinstance(text, str):
        raise TypeError(f"shard paths are str, got bytes {text!r}")
    if text.startswith("file://"):
        text = text[len("file://"):]
    if "://" in text:
        raise ShardError(text, "remote shards need shardfeed.cache (scheme not readable by formats)")
    if not text:
        raise ShardError(repr(text), "an empty path names no shard")
    return text


def _expand_item(item: str, limit: int) -> list[ShardPath]:
    if os.path.exists(item):  # an existing name is never a pattern, whatever it contains
        return [_explicit(item, item)]
    names = expand_braces(item, limit)
    out: list[ShardPath] = []
    for name in names:
        if _GLOB_MAGIC.search(name):
            out.extend(_glob(name, item, limit, len(out)))
        elif os.path.exists(name):
            out.append(_explicit(name, item))
        else:
            named = "" if name == item else f" (named by {item!r})"
            raise ShardError(name, f"no such file{named}")
    if not out:
        raise ShardError(item, "pattern matches no shard file (expected names ending in "
                               f"{' '.join(SHARD_SUFFIXES)})")
    return out


def _explicit(path: str, item: str) -> ShardPath:
    named = "" if path == item else f" (named by {item!r})"
    if os.path.isdir(path):
        raise ShardError(path, f"is a folder{named}: a list or pattern names shard files; pass a dataset "
                               "folder on its own")
    if not _is_shard(path):
        raise ShardError(path, f"is not a shard file{named} (expected a name ending in "
                               f"{' '.join(SHARD_SUFFIXES)})")
    return ShardPath(path, True, item)


def _glob(pattern: str, item: str, limit: int, before: int) -> list[ShardPath]:
    found = []
    for p in glob.iglob(pattern):  # no recursive '**': a pattern cannot walk a whole tree
        if _is_shard(p) and os.path.isfile(p):
            if before + len(found) >= limit:
                raise ShardError(item, f"pattern matches more than {limit:,} shard files; split it")
            found.append(p)
    return [ShardPath(p, False, item) for p in sorted(found)]
