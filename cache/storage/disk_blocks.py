"""What a file holds of the disk: the block accounting of the cache's budget (budget.py).

A file takes whole blocks of its filesystem (``statvfs`` ``f_frsize``): a
170-byte log entry holds 4 KiB. The budget charges each file its allocated
blocks (``st_blocks``), never less than its size rounded up to a block (a
file written but not yet allocated, a reservation); a sparse partial copy
(ranges.py) only the blocks it holds. An extended attribute may take a block
of its own where inodes are small: a temporary that will carry one is named
with ATTR_MARK and charged that block until it is renamed into place.
"""

from __future__ import annotations

import os

_block_sizes: dict[str, int] = {}


def block_size(folder: str) -> int:
    """The allocation unit of the filesystem holding ``folder`` (4096 when it does not say)."""
    got = _block_sizes.get(folder)
    if got is None:
        try:
            st = os.statvfs(folder)
            got = int(st.f_frsize or st.f_bsize or 4096)
        except OSError:
            got = 4096
        _block_sizes[folder] = got
    return got


def rounded(size: int, block: int) -> int:
    """``size`` bytes rounded up to whole blocks of ``block`` bytes."""
    return -(-int(size) // block) * block


def on_disk(size: int, blocks: int, block: int, sparse: bool = False) -> int:
    """What a file holds of the disk: its allocated blocks (``st_blocks``), never less than its
    size in whole blocks (delayed allocation, a reservation not yet written); ``sparse``: a partial
    copy, its allocated blocks alone (its holes hold nothing)."""
    return blocks * 512 if sparse else max(blocks * 512, rounded(size, block))


def empty_cache_bytes(block: int = 4096) -> int:
    """What a cache folder holds before it holds anything: its folders (itself, ``data/``,
    ``locks/``), a block each while they list few entries."""
    return 3 * block


ATTR_MARK = ".a"  # ends the name of a temporary that will carry an attribute: charged a block more


def temp_bytes(name: str, size: int, blocks: int, block: int) -> int:
    """A temporary's charge: its size in blocks (preallocated, or a reservation), and the block its
    attribute may take once set (where the filesystem keeps attributes outside the inode)."""
    return on_disk(size, blocks, block) + (block if name.endswith(ATTR_MARK) else 0)
