"""How tar shards on disk are read: ``read_mode`` "pread" (default) or "mmap".

"pread" keeps RSS flat however much is read; "mmap" copies from mappings
kept while a shard is open: faster for small samples, but the mapped pages
count in RSS. The measurements behind the choice follow.
"""

from __future__ import annotations

# Tar shards on disk are read with preadv (native.py) straight from the page
# cache into the batch buffer: one copy, no page faults, and no mapped file
# pages in RSS however large the dataset. Measured on the 2-core dev VM, 2 KiB
# samples in global order over 0.5 GiB: copying from a fully mapped shard
# is fastest (~250k samples/s end to end) but maps the whole dataset into RSS
# (+450 MB); bounding that by dropping the mapping (MADV_DONTNEED) every
# 64-256 MiB costs a re-fault per sample (45-147k/s); preadv ran at 163k/s
# with RSS flat. Where preadv is missing the gather copies from the mapping
# and drops it past MAPPED_BUDGET_BYTES (estimated as bytes + FAULT_AROUND per
# sample: a read fault maps up to 64 KiB around the byte asked for).
#
# read_mode="mmap" (opt-in) trades that flat RSS for speed: the gather copies
# from a mapping kept for the shard's open life (~1.6x the samples/s of preadv
# for 2 KiB global-order reads from page cache: no ~1.5 us syscall per run of
# bytes). The mapped page-cache pages count in
# RSS and grow with the shards touched; only closing a shard (the LRU of
# max_open shards) unmaps them. No MADV_RANDOM for global order: measured
# no gain with the shards in page cache, and from a cold cache it disables
# the readahead that makes mmap mode fast (2 KiB, global, first epoch of a
# 0.5 GiB dataset: ~10k samples/s with it, ~100k without, ~12-25k pread).
READ_MODES = ("pread", "mmap")
MAPPED_BUDGET_BYTES = 64 << 20
FAULT_AROUND = 64 << 10


def check_read_mode(read_mode) -> str:
    """``read_mode`` if it is one of READ_MODES, else ValueError naming it and the valid ones."""
    if read_mode not in READ_MODES:
        raise ValueError(f"read_mode={read_mode!r} is not one of {', '.join(map(repr, READ_MODES))}: 'pread' "
                         "keeps RSS flat, 'mmap' copies from mapped shards (faster for small samples, mapped "
                         "pages count in RSS)")
    return read_mode
