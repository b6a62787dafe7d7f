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
once; the total is replaced whole, so a scan outside the lock reads the old
one or the new one.
"""

from __future__ import annotations

import contextlib
import os

from shardfeed.cache.storage.disk_blocks import temp_bytes

LEDGER = ".charge"  # the total's file, beside its folder
LEDGERED = ("_log",)  # folders kept by a total once they hold a file: a mirrored commit log (formats' LOG_DIR)


def read(folder: str) -> int | None:
    """``folder``'s total, or None when it is not kept by one."""
    try:
        with open(folder + LEDGER, "rb") as f:
            return int(f.read(64).split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None


def _write(folder: str, total: int) -> None:
    tmp = folder + LEDGER + ".new"
    with open(tmp, "w") as f:
        f.write(f"{int(total)}\n")
    os.replace(tmp, folder + LEDGER)


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


def replace(tmp: str, dest: str, block: int) -> None:
    """Rename ``tmp`` to ``dest``, the total of ``dest``'s folder changed by what it holds more."""
    folder = os.path.dirname(dest)
    total = read(folder)
    before = file_charge(dest, block) if total is not None else 0
    os.replace(tmp, dest)
    if total is not None:
        _write(folder, total + file_charge(dest, block) - before)
    elif os.path.basename(folder) in LEDGERED:
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
