"""`shardfeed verify DST`: check every shard of a dataset against its index.

Per shard: present, size and content hash as the index says, sample count,
the sidecar's offsets against a fresh scan of the tar headers, and every
sample's checksum (Parquet/Arrow: every row group read and validated).
Prints ``BAD <shard>: <reason>`` for each bad shard. DST may also be a glob
or brace pattern of shards (quote it); a foreign tar that cannot even be
scanned is a bad shard, named like the others, not the end of the check.
Exit codes: 0 all good; 1 one or more bad shards; 2 the dataset (its index)
cannot be opened at all.

DST may be a URL (http(s)://, s3://, gs://; credentials and endpoints from
the usual environment, e.g. AWS_ENDPOINT_URL): its index is mirrored into the
node-local cache at --cache-dir and each shard is fetched through it (checked
against the index hash on arrival), then checked as above from the cached
copy. A copy that was already cached and fails is dropped and fetched once
more, so local damage is told apart from damage at the source.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from shardfeed.cache.fetching.url_schemes import is_remote
from shardfeed.tools.size_options import human_bytes
from shardfeed.tools.text import plural

_SHARD_SUFFIXES = (".tar", ".tgz", ".tar.gz", ".tar.zst", ".parquet", ".arrow")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = __doc__.splitlines()[0]
    p.add_argument("dst", metavar="DST", help="dataset folder, tar file, folder of WebDataset tars, or a glob "
                                              "or brace pattern of shards (quote it)")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="check N shards at a time (threads; 1)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    add_cache_arguments(p)


def add_cache_arguments(p: argparse.ArgumentParser) -> None:
    from shardfeed.tools.size_options import size_option

    p.add_argument("--cache-dir", default=None, metavar="DIR",
                   help="node-local cache for a URL DST ($SHARDFEED_CACHE_DIR, else <tmp>/shardfeed-cache-<uid>)")
    p.add_argument("--cache-limit", type=size_option, default=None, metavar="BYTES",
                   help="bytes of shards the cache may hold, e.g. 2GB (80%% of its disk)")


def open_dataset(dst: str, args, prog: str):
    """The index of DST: a local one from open_index, a URL's through the cache
    (open_remote_index, saying on stderr which cache folder it uses)."""
    from shardfeed.formats import open_index

    if not is_remote(dst):
        return open_index(dst, on_error="skip")
    from shardfeed.cache import open_remote_index

    index = open_remote_index(dst, args.cache_dir, args.cache_limit)
    if args.cache_dir is None:
        print(f"{prog}: note: caching {dst} in {index.cache.cache_dir} (choose with --cache-dir)", file=sys.stderr)
    return index


def shard_name(index, i: int) -> str:
    """What a message calls shard ``i``: its URL for a remote dataset, else its path."""
    return index.url_of(i)


def _sidecar_matches_scan(index, i: int) -> str | None:
    """The sidecar's offsets must be the ones the tar's own headers give."""
    from shardfeed.formats.own_tables import read_sidecar
    from shardfeed.formats.sidecar import SIDECAR_SUFFIX, scan_tar
    from shardfeed.formats.tar_stream import load_tar_stream

    path = index.path(i)
    if not os.path.exists(path + SIDECAR_SUFFIX):
        return (f"sidecar {os.path.basename(path)}{SIDECAR_SUFFIX} is missing: readers fall back to scanning "
                "and lose the per-sample checksums (re-create it with `shardfeed convert`)")
    stored, meta = read_sidecar(path + SIDECAR_SUFFIX, path)
    if meta.get("shard_hash") not in (None, index.hashes[i]):
        return f"sidecar was written for another version of the shard (hash {meta.get('shard_hash')})"
    data = load_tar_stream(path, index.formats[i])
    try:
        fresh = scan_tar(data, path)
    finally:
        if hasattr(data, "close"):
            data.close()
    if stored.keys != fresh.keys:
        bad = next((k for k, (a, b) in enumerate(zip(stored.keys, fresh.keys)) if a != b),
                   min(len(stored.keys), len(fresh.keys)))
        return f"sidecar keys disagree with the tar's members from sample {bad}"
    fields_fresh = np.asarray([fresh.fields.index(f) if f in fresh.fields else -1 for f in stored.fields])
    same = (np.array_equal(stored.member_start, fresh.member_start) and np.array_equal(stored.offset, fresh.offset)
            and np.array_equal(stored.size, fresh.size)
            and np.array_equal(fields_fresh[stored.member_field], fresh.member_field)
            and np.array_equal(stored.checksum, fresh.checksum))
    return None if same else "sidecar offsets, sizes or checksums disagree with the tar's headers"


def _first_bad_sample(index, i: int) -> str | None:
    """After a hash mismatch: which sample the damage hit, when a checksum shows it."""
    from shardfeed.formats import ShardError, open_shard

    try:
        with open_shard(index, i) as reader:
            for j in range(len(reader)):
                reader.read(j)
    except ShardError as e:
        return e.reason
    except Exception:
        return None
    return "every sample's payload checksum still holds (damage is in headers or padding)"


def check_shard(index, i: int) -> str | None:
    """None when shard ``i`` is good, else the reason it is not."""
    from shardfeed.formats import ShardError, verify_shard

    path = index.path(i)
    try:
        if os.path.exists(path) and os.path.getsize(path) != index.sizes[i]:
            return (f"shard has {os.path.getsize(path):,} bytes but the index says {int(index.sizes[i]):,} "
                    "(truncated, grown or replaced)")
        verify_shard(index, i)
        if index.formats[i].startswith("tar") and i not in index.tables:
            return _sidecar_matches_scan(index, i)
    except ShardError as e:
        if e.reason.startswith("content hash"):
            where = _first_bad_sample(index, i)
            return f"{e.reason}; {where}" if where else e.reason
        return e.reason
    except Exception as e:  # damaged bytes must be reported, whatever they break
        return f"unreadable ({type(e).__name__}: {e})"
    return None


def check_remote_shard(index, i: int) -> str | None:
    """check_shard on the cached copy of a URL dataset's shard i. Fetching
    checks the index hash, so a failure of a copy cached before this run may
    be damage on the local disk: that copy is dropped and fetched again."""
    from shardfeed.formats import ShardError

    for attempt in range(2):
        was_cached = index.is_cached(i)
        try:
            with index.hold(i):  # pinned: check_shard's index.path(i) finds this copy
                reason = check_shard(index, i)
        except ShardError as e:
            return e.reason  # not found, retries ran out, or damaged at the source
        if reason is None or not was_cached or attempt:
            return reason
        index.discard(i)
    return reason


def unlisted_files(index) -> list[str]:
    """Shard-like files in the dataset folder that the index does not name."""
    from shardfeed.formats.index import INDEX_NAME

    if not os.path.isdir(index.root):
        return []
    listed = set(index.names) | {os.path.basename(p) for p, _ in index.skipped}  # skipped: named BAD already
    return sorted(n for n in os.listdir(index.root)
                  if n.endswith(_SHARD_SUFFIXES) and n not in listed and n != INDEX_NAME and not n.startswith("."))


def _open(dst: str, args):
    """(index, shard numbers to check). A shard file inside an indexed dataset
    is checked against that dataset's index (open_index takes its row); foreign
    tars that cannot be scanned land in ``index.skipped``, to be reported."""
    index = open_dataset(dst, args, "shardfeed verify")
    return index, list(range(len(index)))


def main(args) -> int:
    from tqdm import tqdm

    from shardfeed.formats import ShardError

    if args.jobs < 1:
        print(f"shardfeed verify: error: --jobs {args.jobs} must be 1 or more", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        index, shards = _open(args.dst, args)
    except ShardError as e:
        print(f"shardfeed verify: error: {e}", file=sys.stderr)
        return 2
    # scanning happened on open, so these come first, in the order scanned
    for path, reason in index.skipped:
        print(f"BAD {path}: {reason}")
    for e in index.left_out:  # a sample of a readable tar left out on open (a name that is not UTF-8)
        print(f"BAD {e.shard}: {e.reason}")
    bad = []
    total = int(index.sizes[shards].sum()) if shards else 0
    with tqdm(total=total, unit="B", unit_scale=True, desc="verify", file=sys.stderr,
              disable=args.quiet or None) as bar, ThreadPoolExecutor(args.jobs) as pool:
        # map keeps shard order, so the BAD lines come out in index order for any --jobs
        check = check_remote_shard if is_remote(args.dst) else check_shard
        for i, reason in zip(shards, pool.map(lambda i: check(index, i), shards)):
            bar.update(int(index.sizes[i]))
            if reason is not None:
                bad.append(i)
                bar.write(f"BAD {shard_name(index, i)}: {reason}", file=sys.stdout)
    for name in unlisted_files(index) if os.path.isdir(args.dst) else ():
        print(f"note: {os.path.join(index.root, name)} is not in the index (ignored by readers)")
    if index.meta.get("scanned"):
        print("note: no index here; the tars were scanned now, so hashes were not checked against a record")
    secs = time.perf_counter() - t0
    mb_s = total / 1e6 / max(secs, 1e-9)
    n_bad = len(bad) + len(index.skipped) + len({e.shard for e in index.left_out})
    verdict = plural(n_bad, "bad shard") if n_bad else "all good"
    samples = int(index.counts[shards].sum()) if shards else 0
    print(f"verified {plural(len(shards) + len(index.skipped), 'shard')}, {plural(samples, 'sample')}, {human_bytes(total)} "
          f"in {secs:.2f} s ({mb_s:.1f} MB/s): {verdict}")
    if is_remote(args.dst):
        fetched = index.cache.stats()["bytes_fetched"]
        print(f"fetched {human_bytes(fetched)} into the cache at {index.cache.cache_dir}")
    return 1 if n_bad else 0
