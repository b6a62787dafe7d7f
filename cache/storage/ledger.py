"""A metadata folder's running total: the budget charge of its files, kept beside it.

A mirrored commit log gains an entry (a block) per commit and keeps them all:
listing it at every budget scan made each entry mirrored cost O(entries)
under the node lock (a 10,000-commit log took minutes to open). Its finished
files' charge is kept in ``<folder>.charge`` instead, changed by every rename
into the folder and every removal from it (``replace``, ``remove``) and
counted afresh from a listing when a mirror opens (``count``); a folder
named in LEDGERED gets one at its first file. Temporaries are made in the
folder above it (listed as usual), so the folder holds finished files only.
``count``, ``replace`` and ``remove`` are called with the node's budget lock
held (``with budget.locked(): ...``), so two writers never change a total at
once. The total's file is written in place once it exists (a fixed width, no
temporary: a temporary beside it took a block the budget had not made room
for, one block over a tiny limit at every commit), the figure twice, so a
scan outside the lock that reads a half-written one sees two figures apart
and counts the folder from a listing instead. Its first block is made room for
with the log's entry that makes it (``needs_total``), given back under the lock
as the total's file takes it.
"""

from __future__ import annotations

import contextlib
import os

from shardfeed.cache.storage.disk_blocks import temp_bytes

LEDGER = ".charge"  # the total's file, beside its folder
LEDGERED = ("_log",)  # folders kept by a total once they hold a file: a mirrored commit log (formats' LOG_DIR)


def read(folder: str) -> int | None:
    """``folder``'s total, or None when it is not kept by one (or is being written this moment)."""
    try:
        with open(folder + LEDGER, "rb") as f:
            a, b = f.read(64).split()[:2]
        return int(a) if a == b else None
    except (FileNotFoundError, ValueError):
        return None


def _write(folder: str, total: int) -> None:
    data = f"{int(total):020d} {int(total):020d}\n".encode()
    path = folder + LEDGER
    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        with open(path + ".new", "wb") as f:
            f.write(data)
        os.replace(path + ".new", path)
        return
    try:
        os.pwrite(fd, data, 0)
    finally:
        os.close(fd)


def file_charge(path: str, block: int) -> int:
    """What the budget charges the file at ``path`` (0 when there is none)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0
    return temp_bytes(os.path.basename(path), st.st_size, st.st_blocks, block)


def count(folder: str, block: int) -> int:
    """``folder``'s files' charge from a listing, kept as its total while it holds any (an empty
    one, a dataset written whole's log, holds no total's block); returns the charge."""
    total, files = 0, 0
    with os.scandir(folder) as it:
        for e in it:
            if not e.is_dir(follow_symlinks=False):
                total += file_charge(e.path, block)
                files += 1
    if files:
        _write(folder, total)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(folder + LEDGER)
    return total


def needs_total(folder: str) -> bool:
    """Whether a file renamed into ``folder`` now would make its total's file (a block more)."""
    return os.path.basename(folder) in LEDGERED and not os.path.exists(folder + LEDGER)


def replace(tmp: str, dest: str, block: int) -> None:
    """Rename ``tmp`` to ``dest``, the total of ``dest``'s folder changed by what it holds more."""
    folder = os.path.dirname(dest)
    total = read(folder)
    if total is not None:
        # the total first: a scan outside the lock may count the entry twice for a moment, never not at all
        st = os.lstat(tmp)
        _write(folder, total + temp_bytes(os.path.basename(dest), st.st_size, st.st_blocks, block)
               - file_charge(dest, block))
        os.replace(tmp, dest)
        return
    os.replace(tmp, dest)
    if os.path.basename(folder) in LEDGERED:
        count(folder, block)  # its first file: counted once, kept from now on


def remove(path: str, block: int) -> bool:
    """Remove the file at ``path``, its folder's total changed with it; whether it went."""
    charge = file_charge(path, block)
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    total = read(os.path.dirname(path))
    if total is not None:
        _write(os.path.dirname(path), max(0, total - charge))
    return True


def tree_bytes(folder: str, folder_bytes) -> int:
    """The charge of ``folder`` and every folder below it, ``folder_bytes(path)`` being a listed
    folder's own (Budget's); one kept by a total is its own blocks and its total, not listed."""
    total = read(folder) if os.path.exists(folder + LEDGER) else None
    if total is not None:
        try:
            return os.lstat(folder).st_blocks * 512 + total
        except FileNotFoundError:
            return 0
    total = folder_bytes(folder)
    try:
        with os.scandir(folder) as it:
            subs = [e.path for e in it if e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return total
    return total + sum(tree_bytes(d, folder_bytes) for d in subs)
