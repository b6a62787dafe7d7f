"""`shardfeed ingest SRC DST`: append samples to a live dataset, one commit per shard filled.

SRC is anything `shardfeed convert` reads (JSONL, CSV, Parquet, image folders,
tars, a dataset). Each shard is published through DST's commit log the moment
it is full, so a `Loader(ShardDataset(DST, follow=True))` sees it while the
ingest still runs; the last, partly filled shard is published at the end.
Several ingests (on several hosts) may append to one DST at once: each shard
is one create-if-absent commit, none is lost. ``--end`` publishes the commit
that ends the stream (followers stop there, all at the same step);
``shardfeed ingest --end DATASET``, with no SRC, ends the stream of a dataset
whose writer is gone (it crashed, or never passed --end) and writes nothing
else.
DST may be an ``s3://`` prefix (tools/ingest_remote.py): shards are staged
locally and uploaded, each committed with a conditional put; a store that
does not honour conditional puts, or a URL of another scheme, is refused.
``--follow-src FOLDER`` keeps polling a folder that files land in (a producer
should write each under a dot-name or elsewhere and rename it in: files are
taken by name, once) until ``--idle-exit-s`` passes without a new file.
``--shuffle-seed S`` writes each source (SRC, or each file of --follow-src) in
a random order fixed by S, as convert does; a stream cannot be shuffled
across sources, so a class-ordered producer should be shuffled upstream or
per file. At the end the shards this run published are checked as `inspect`
does, with a warning when they are class-ordered (each holds few classes).

Exit codes: 0 done; 2 bad input or options; 130/143 stopped by SIGINT/SIGTERM
(the shard in progress is dropped, every shard published before stays).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

from shardfeed.tools.size_options import human_bytes, parse_size
from shardfeed.tools.text import plural, show_progress

BATCH = 256  # samples read from a source at a time


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = __doc__.strip()
    p.add_argument("src", metavar="SRC", help="input: file, folder or glob pattern (quote it), as for convert")
    p.add_argument("dst", metavar="DST", nargs="?", help="the live dataset folder (created if absent; may already be growing), "
                                              "or an s3:// prefix (credentials and endpoint from the environment)")
    p.add_argument("--source-type", choices=("images", "jsonl", "csv", "parquet", "tar", "dataset"),
                   help="override the detected input kind")
    p.add_argument("--format", choices=("tar", "parquet", "arrow"), default="tar", help="shard format")
    p.add_argument("--max-shard-bytes", default="64MiB", metavar="SIZE", help="publish a shard past this size")
    p.add_argument("--max-shard-samples", type=int, metavar="N", help="publish a shard every N samples")
    p.add_argument("--compression", metavar="CODEC", help="tar: zstd; parquet: a Parquet codec; arrow: none")
    p.add_argument("--field", action="append", metavar="COL=EXT[:file|:base64]",
                   help="map a table column to a sample field (repeatable; see convert --help)")
    p.add_argument("--key-column", metavar="COL", help="table column holding each sample's key")
    p.add_argument("--prefix", default="ingest", help="shard name prefix (names are unique per writer anyway)")
    p.add_argument("--shuffle-seed", type=int, metavar="SEED",
                   help="write each source's samples in a random order fixed by SEED (as convert does; "
                        "each --follow-src file is shuffled within itself)")
    p.add_argument("--follow-src", action="store_true",
                   help="SRC is a folder: after its files, keep ingesting files that appear in it")
    p.add_argument("--poll-s", type=float, default=1.0, help="--follow-src: seconds between looks at SRC")
    p.add_argument("--idle-exit-s", type=float, default=60.0,
                   help="--follow-src: stop after this many seconds without a new file")
    p.add_argument("--end", action="store_true",
                   help="publish the end-of-stream commit when done; `ingest --end DATASET` alone ends the stream "
                        "of a dataset whose writer is gone")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def _check(args) -> dict:
    from shardfeed.tools import arg_bounds as B

    err = B.first(B.overlap(args.src, args.dst), B.duration("--poll-s", args.poll_s, above=True, hi=B.DAY_S),
                  B.duration("--idle-exit-s", args.idle_exit_s))
    if err:
        raise ValueError(err)
    try:
        max_bytes = parse_size(args.max_shard_bytes)
    except ValueError as e:
        raise ValueError(f"argument --max-shard-bytes: {e}") from None  # argparse's wording, as --cache-limit
    if args.max_shard_samples is not None and args.max_shard_samples <= 0:
        raise ValueError(f"--max-shard-samples {args.max_shard_samples} must be a positive number of samples")
    if args.follow_src and not os.path.isdir(args.src):
        raise ValueError(f"--follow-src polls a folder that files land in; {args.src} is not a folder")
    if args.poll_s <= 0 or args.idle_exit_s < 0:
        raise ValueError(f"--poll-s {args.poll_s} must be > 0 and --idle-exit-s {args.idle_exit_s} >= 0")
    comp = args.compression
    if comp is not None and comp.lower() == "none":
        comp = None
    if os.path.isdir(args.dst) and os.listdir(args.dst) and not (
            os.path.isdir(os.path.join(args.dst, "_log")) or os.path.exists(os.path.join(args.dst, "index.arrow"))):
        raise ValueError(f"DST {args.dst} is a folder that holds files but no dataset; ingest into an empty or "
                         "new folder, or into a dataset")
    return dict(format=args.format, max_shard_bytes=max_bytes, max_shard_samples=args.max_shard_samples,
                compression=comp)


class _Stop(KeyboardInterrupt):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stop(signum, _frame):
    raise _Stop(signum)


def _order(source, n: int, seed: int | None, stage_parent: str):
    """(output order, its bucket folder or None): convert's keyed permutation, or its
    two-pass bucket shuffle for sources read front to back (tools/convert/order.py)."""
    import tempfile

    import numpy as np

    from shardfeed.tools.convert.order import BucketShuffle, OutputOrder, bucket_samples_for

    if seed is None or n == 0 or getattr(source, "random_access", True):
        return OutputOrder(n, seed), None
    folder = tempfile.mkdtemp(prefix=".ingest-shuffle-", dir=stage_parent)
    shuffle = BucketShuffle(folder, n, seed, bucket_samples_for(source.load_many(np.arange(min(n, BATCH))), n))
    shuffle.scatter(source.load_many, BATCH)
    return shuffle, folder


def _ingest_source(source, writer, bar, key_prefix: str = "", seed: int | None = None) -> int:
    """Write every sample of ``source`` (in the order ``seed`` fixes); the writer publishes each full shard."""
    import shutil

    from shardfeed.tools.convert.job import _batches

    n = len(source)
    order, folder = _order(source, n, seed, os.path.dirname(os.path.abspath(writer.root)))
    try:
        _write_all(_batches(source, order, 0, n), source, writer, bar, key_prefix)
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    source.close()
    return n


def _write_all(batches, source, writer, bar, key_prefix: str) -> None:
    from shardfeed.formats import ShardError
    from shardfeed.formats.columnar_values import typed_for_columnar

    for batch in batches:
        for sample in batch:
            where = sample.pop("__src__", None) or source.describe()
            if key_prefix:
                sample["__key__"] = f"{key_prefix}/{sample['__key__']}"
            if writer.format != "tar":
                sample = typed_for_columnar(sample, where)
            try:
                writer.write(sample)
            except (ValueError, TypeError) as e:
                raise ShardError(where, str(e)) from None
        bar.update(len(batch))


def _new_files(folder: str, seen: set) -> list[str]:
    from shardfeed.tools.convert.source_kinds import kind_of_file

    names = sorted(n for n in os.listdir(folder) if not n.startswith(".") and n not in seen
                   and kind_of_file(n) is not None and os.path.isfile(os.path.join(folder, n)))
    return names


def run(args, writer, bar) -> int:
    """Ingest SRC (and, with --follow-src, what lands in it later); returns the sample count."""
    from shardfeed.tools.convert.field_map import parse_field_specs
    from shardfeed.tools.convert.source_kinds import open_source

    specs = parse_field_specs(args.field)
    if not args.follow_src:
        return _ingest_source(open_source(args.src, args.source_type, specs, args.key_column), writer, bar,
                              seed=args.shuffle_seed)
    seen: set = set()
    total, last_new = 0, time.monotonic()
    while True:
        names = _new_files(args.src, seen)
        for name in names:
            seen.add(name)
            source = open_source(os.path.join(args.src, name), args.source_type, specs, args.key_column)
            # rows of each file are numbered from 0: the file's name keeps keys apart
            stem = name.split(".", 1)[0]
            total += _ingest_source(source, writer, bar, key_prefix=stem if args.key_column is None else "",
                                    seed=args.shuffle_seed)
        if names:
            last_new = time.monotonic()
        elif time.monotonic() - last_new >= args.idle_exit_s:
            return total
        else:
            time.sleep(args.poll_s)


def class_order_warning(writer) -> str | None:
    """The warning `inspect` gives, for the shards this writer published (None when they mix classes)."""
    import numpy as np

    from shardfeed.formats.index import DatasetIndex
    from shardfeed.tools.inspect_cmd import class_stats

    shards = writer.shards
    if len(shards) < 2 or "cls" not in writer.fields:
        return None
    index = DatasetIndex(writer.root, [s.name for s in shards], [s.format for s in shards],
                         np.array([s.samples for s in shards], np.int64), np.array([s.bytes for s in shards], np.int64),
                         [s.hash for s in shards], writer.fields, {})
    stats = class_stats(index)
    if stats is None or not stats["class_ordered"]:
        return None
    return (f"the {len(shards)} shards published are class-ordered: each holds few of the {stats['classes']} "
            f"classes ({stats['mean_shard_entropy_bits']:.2f} bits of label entropy per shard, "
            f"{stats['entropy_bits']:.2f} over all), so no read-time shuffle buffer can mix batches; ingest with "
            "--shuffle-seed SEED (or shuffle the source upstream)")


def main(args) -> int:
    from tqdm import tqdm

    from shardfeed.cache.fetching.url_schemes import is_remote
    from shardfeed.formats import ShardError, ShardWriter
    from shardfeed.tools.ingest_remote import RemoteIngestWriter

    if args.dst is None:
        return end_only(args)
    try:
        opts = _check(args)
        if is_remote(args.dst):
            writer = RemoteIngestWriter(args.dst, args.prefix, **opts)
        else:
            writer = ShardWriter(args.dst, append=True, prefix=args.prefix, **opts)
    except (ValueError, ShardError) as e:
        print(f"shardfeed ingest: error: {e}", file=sys.stderr)
        return 2
    bar = tqdm(unit="sample", unit_scale=True, desc="ingest", disable=not show_progress(args.quiet), file=sys.stderr)
    old = {}
    if threading.current_thread() is threading.main_thread():  # handlers can only be set there
        old = {s: signal.signal(s, _raise_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    t0 = time.perf_counter()
    end_seq = None
    try:
        total = run(args, writer, bar)
        if args.end:
            end_seq = writer.end_stream()
        else:
            writer.close()
    except (ValueError, ShardError) as e:
        writer.abort()
        bar.close()
        print(f"shardfeed ingest: error: {e}\n{plural(len(writer.shards), 'shard')} published to {args.dst} "
              "before it stay", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        writer.abort()
        bar.close()
        signum = getattr(e, "signum", signal.SIGINT)
        print(f"shardfeed ingest: stopped by {signal.Signals(signum).name}; the shard in progress was dropped, "
              f"{plural(len(writer.shards), 'shard')} published before stay in {args.dst}", file=sys.stderr)
        return 128 + signum
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    bar.close()
    secs = max(time.perf_counter() - t0, 1e-9)
    ended = f"; stream ended by commit {end_seq}" if end_seq is not None else ""
    print(f"ingested {plural(total, 'sample')} into {plural(len(writer.shards), 'published shard')}, "
          f"{human_bytes(writer.bytes_written)} in {secs:.2f} s ({total / secs:,.0f} samples/s) -> "
          f"{args.dst}{ended}")
    try:  # an object-store DST's shards left the staging folder once uploaded: not read back here
        warning = None if is_remote(args.dst) else class_order_warning(writer)
    except ShardError as e:  # the check reads shards back; a failure there is not the ingest's
        warning = f"class order not checked: {e}"
    if warning:
        print(f"shardfeed ingest: warning: {warning}", file=sys.stderr)
    return 0


def end_only(args) -> int:
    """`ingest --end DATASET`: publish the end of the stream and nothing else."""
    from shardfeed.cache.fetching.url_schemes import is_remote
    from shardfeed.formats import ShardError, ShardWriter
    from shardfeed.tools.ingest_remote import RemoteIngestWriter

    dataset = args.src
    if not args.end:
        print("shardfeed ingest: error: ingest needs SRC and DST (`shardfeed ingest SRC DST`); to end the stream of "
              f"a dataset whose writer is gone, run `shardfeed ingest --end {dataset}`", file=sys.stderr)
        return 2
    try:
        if is_remote(dataset):
            seq = RemoteIngestWriter(dataset, args.prefix).end_stream()
        else:
            if not os.path.isdir(os.path.join(dataset, "_log")):
                raise ValueError(f"{dataset} is not a growing dataset (no _log/ commit log there): there is no "
                                 "stream to end")
            seq = ShardWriter(dataset, append=True, prefix=args.prefix).end_stream()
    except (ValueError, ShardError) as e:
        print(f"shardfeed ingest: error: {e}", file=sys.stderr)
        return 2
    print(f"ended the stream of {dataset} by commit {seq}: its followers end their iteration there, all at the "
          "same step")
    return 0


if __name__ == "__main__":
    # `python -m shardfeed.tools.ingest` skips building every subcommand's parser (a producer starts fast)
    _p = argparse.ArgumentParser(prog="shardfeed ingest")
    add_arguments(_p)
    sys.exit(main(_p.parse_args()))
