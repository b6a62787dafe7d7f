"""`shardfeed compact DST`: fold a growing dataset's commit log into index.arrow.

Safe while writers append and readers follow: index.arrow is replaced in one
rename and records the last commit it holds (``log_seq``); the log entries
stay, so a reader that listed the log before sees the same stream after
(sample ids are positions in commit order, which compaction keeps). A
commit published during the compaction stays in the log after ``log_seq``.
Opening the dataset then reads one table instead of one file per commit.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from shardfeed.tools.text import plural


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = __doc__.strip()
    p.add_argument("dst", metavar="DST", help="a growing dataset folder (one with a _log/ commit log)")


def main(args) -> int:
    from shardfeed.formats import ShardError, compact
    from shardfeed.formats.commit_log import base_log_seq, read_commits
    from shardfeed.formats.index import LOG_DIR

    if not os.path.isdir(os.path.join(args.dst, LOG_DIR)):
        print(f"shardfeed compact: error: {args.dst} has no {LOG_DIR}/ commit log; only a dataset written "
              "with ShardWriter(append=True) or `shardfeed ingest` has one to fold", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        before = base_log_seq(args.dst)
        idx = compact(args.dst)
        end = read_commits(args.dst, after=0).end
    except ShardError as e:
        print(f"shardfeed compact: error: {e}", file=sys.stderr)
        return 2
    seq = int(idx.meta.get("log_seq", 0))
    ended = f"; the stream ended at commit {end}" if end is not None else "; the stream is open"
    print(f"compacted {args.dst}: {plural(len(idx), 'shard')}, {plural(idx.num_samples, 'sample')} in index.arrow "
          f"through commit {seq} ({plural(seq - before, 'commit')} folded this time) in "
          f"{time.perf_counter() - t0:.2f} s{ended}")
    return 0
