"""`shardfeed convert SRC DST`: images, JSONL, CSV, Parquet or WebDataset tars -> a shardfeed dataset.

Exit codes: 0 done; 2 bad input or options (the message names the file and
the reason; nothing is published at DST); 130 interrupted by SIGINT (Ctrl-C),
143 stopped by SIGTERM: 128 + the signal's number, as a shell reports a process
the signal killed. Either way the staging folder is removed and nothing is
published; a second signal while cleaning up ends the process at once, and the
next run removes what it left.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading

from shardfeed.tools.size_options import human_bytes, parse_size
from shardfeed.tools.text import plural, show_progress

_PARQUET_CODECS = ("none", "snappy", "gzip", "brotli", "lz4", "zstd")

EPILOG = """\
sources (detected from SRC, or --source-type):
  images   a folder of class subfolders: ROOT/<class>/<name>.<jpg|png|...>; each image is a sample
           {"__key__": "<class>/<name>", "<ext>": bytes, "cls": class index}; classes are the sorted
           folder names, written to DST/classes.txt (line i = class i)
  jsonl    .jsonl/.ndjson files (a file, a folder or a glob); one sample per line
  csv      .csv files with a header row; one sample per row
  parquet  .parquet files; one sample per row
  tar      WebDataset tars (.tar, .tar.gz, .tgz, .tar.zst): a file, a folder or a glob; re-sharded
  dataset  a shardfeed dataset folder (has index.arrow): re-sharded into another format or size

rows -> samples (jsonl, csv, parquet):
  --field COL=EXT stores column COL as field EXT, encoded by EXT (cls: int, txt: text, json,
  npy, jpg/png/bin: bytes); COL=EXT:file reads the file the cell names (relative to the table's
  folder), COL=EXT:base64 decodes the cell. Without --field, a JSONL/CSV row becomes one "json"
  field holding the whole row and Parquet columns become fields of the same name. The key is
  --key-column, else a "__key__" column, else the row number in the source (%010d).

examples:
  shardfeed convert photos/ data/photos --max-shard-bytes 256MB --shuffle-seed 0 --processes 2
  shardfeed convert captions.jsonl data/caps --field image=jpg:file --field caption=txt --key-column id
  shardfeed convert 'wds/*.tar.gz' data/parquet --format parquet --compression zstd
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = __doc__.splitlines()[0]
    p.epilog = EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("src", metavar="SRC", help="input: folder, file or glob pattern (quote it); with --merge: DST")
    p.add_argument("dst", metavar="DST", help="output dataset folder (must not exist unless --overwrite); "
                                              "with --merge: the first part folder")
    p.add_argument("more_parts", nargs="*", metavar="PART", help="with --merge: the other part folders")
    p.add_argument("--source-type", choices=("images", "jsonl", "csv", "parquet", "tar", "dataset"),
                   help="override the detected input kind")
    p.add_argument("--format", choices=("tar", "parquet", "arrow"), default="tar", help="shard format (tar)")
    p.add_argument("--max-shard-bytes", default="256MiB", metavar="SIZE",
                   help="start a new shard past this size; 256MB = 256e6, 1GiB = 2**30 (256MiB)")
    p.add_argument("--max-shard-samples", type=int, metavar="N", help="at most N samples per shard")
    p.add_argument("--compression", metavar="CODEC",
                   help="tar: zstd (.tar.zst); parquet: " + ", ".join(_PARQUET_CODECS) + "; arrow: none")
    p.add_argument("--processes", type=int, default=1, metavar="N",
                   help="write N parts in parallel processes (same samples and order as 1; the same shards "
                        "too with --max-shard-samples, while a byte limit alone cuts each part's last shard "
                        "short, so N processes may write up to N-1 more shards)")
    p.add_argument("--shuffle-seed", type=int, metavar="SEED",
                   help="write samples in a random order fixed by SEED (fixes class-ordered inputs); "
                        "O(1) memory, kept in the index")
    p.add_argument("--shuffle-mode", choices=("auto", "permute", "buckets"), default="auto",
                   help="permute: read samples by id in shuffled order; buckets: two passes through "
                        "bucket files in the stage (for sources read front to back, e.g. compressed "
                        "tars); auto picks by source (auto). Both give the same dataset")
    p.add_argument("--part", metavar="I/N",
                   help="write only part I of N (0-based) into DST as a part folder; publish all N with --merge")
    p.add_argument("--merge", action="store_true",
                   help="shardfeed convert --merge DST PART...: publish parts written with --part as one dataset")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: --processes on this machine; ray: one Ray task per part, same output (local)")
    p.add_argument("--address", metavar="ADDR",
                   help="--engine ray: the Ray cluster to join (default: a local instance, 2 CPUs)")
    p.add_argument("--field", action="append", metavar="COL=EXT[:file|:base64]",
                   help="map a table column to a sample field (repeatable)")
    p.add_argument("--key-column", metavar="COL", help="table column holding each sample's key")
    p.add_argument("--image-field", metavar="NAME",
                   help="image folders: store every image as field NAME instead of its extension "
                        "(one column when the folder mixes .jpg and .png)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing DST (swapped in at the end)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised where the conversion is so its cleanup runs."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _interrupt(signum, _frame):
    # A second signal during the cleanup takes the default action (ends the process).
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_DFL)
    raise Interrupted(signum)


@contextlib.contextmanager
def _stop_on_signals():
    """SIGTERM (kill, a job scheduler, docker stop) cleans up like Ctrl-C does."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    old = {s: signal.signal(s, _interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _options(args):
    from shardfeed.tools.convert.job import ConvertOptions

    try:
        max_bytes = parse_size(args.max_shard_bytes)
    except ValueError as e:
        raise ValueError(f"argument --max-shard-bytes: {e}") from None  # argparse's wording, as --cache-limit
    if args.max_shard_samples is not None and args.max_shard_samples <= 0:
        raise ValueError(f"--max-shard-samples {args.max_shard_samples} must be a positive number of samples")
    if args.processes < 1:
        raise ValueError(f"--processes {args.processes} must be 1 or more")
    comp = args.compression
    if comp is not None and comp.lower() == "none":
        comp = None
    if args.format == "tar" and comp not in (None, "zstd"):
        raise ValueError(f"--compression {comp!r} is not available for tar shards; use zstd or none")
    if args.format == "arrow" and comp is not None:
        raise ValueError("arrow shards are stored uncompressed so they can be memory-mapped; drop --compression")
    if args.format == "parquet" and comp is not None and comp.lower() not in _PARQUET_CODECS:
        raise ValueError(f"--compression {comp!r} is not a Parquet codec ({', '.join(_PARQUET_CODECS)})")
    part = None
    if args.part is not None:
        from shardfeed.tools.convert.parts import parse_part

        part = parse_part(args.part)
        if args.processes != 1:
            raise ValueError("--part writes one part in one process; run the N parts side by side instead "
                             "of passing --processes")
    if args.address and args.engine != "ray":
        raise ValueError("--address is the Ray cluster for --engine ray; add --engine ray or drop --address")
    if args.engine == "ray":
        try:
            import ray  # noqa: F401  (checked here so the error comes before any work)
        except ImportError:
            raise ValueError("--engine ray needs Ray: pip install 'ray[data]' "
                             "(from a shardfeed clone: pip install -e '.[ray]')") from None
    return ConvertOptions(format=args.format, max_shard_bytes=max_bytes, max_shard_samples=args.max_shard_samples,
                          compression=comp.lower() if comp else None, processes=args.processes,
                          shuffle_seed=args.shuffle_seed, overwrite=args.overwrite,
                          shuffle_mode=args.shuffle_mode, part=part, engine=args.engine, address=args.address)


def _merge(args) -> int:
    from shardfeed.formats import ShardError
    from shardfeed.tools.convert.parts import merge_parts

    try:
        result = merge_parts(args.src, [args.dst, *args.more_parts], args.overwrite)
    except (ValueError, ShardError) as e:
        print(f"shardfeed convert --merge: error: {e}\nnothing was written to {args.src}", file=sys.stderr)
        return 2
    print(f"merged {plural(len(args.more_parts) + 1, 'part')}: {plural(result.samples, 'sample')} in "
          f"{plural(result.shards, 'shard')}, {human_bytes(result.bytes)} -> {result.root}")
    return 0


def fingerprint(args, source) -> str:
    """What the source is, for the stage key: a rerun with the same arguments finds its stage."""
    return "|".join(map(str, [os.path.abspath(args.src), source.kind, source.describe(), args.field,
                              args.key_column, args.image_field]))


def main(args) -> int:
    from tqdm import tqdm

    from shardfeed.formats import ShardError
    from shardfeed.formats.staging import check_destination
    from shardfeed.formats.writer import check_field
    from shardfeed.tools.convert.field_map import parse_field_specs
    from shardfeed.tools.convert.job import convert
    from shardfeed.tools.convert.source_kinds import open_source

    if args.merge:
        return _merge(args)
    if args.more_parts:
        print(f"shardfeed convert: error: unexpected arguments {args.more_parts}; convert takes SRC DST "
              "(several part folders go with --merge)", file=sys.stderr)
        return 2
    from shardfeed.tools.arg_bounds import overlap

    try:
        err = overlap(args.src, args.dst)
        if err:
            raise ValueError(err)
        opts = _options(args)
        specs = parse_field_specs(args.field)
        if args.image_field:
            check_field(args.image_field)
        check_destination(args.dst, opts.overwrite, args.src)
        source = open_source(args.src, args.source_type, specs, args.key_column, args.image_field)
    except (ValueError, ShardError) as e:
        print(f"shardfeed convert: error: {e}", file=sys.stderr)
        return 2
    _report_stale(args.dst)
    print(f"reading {args.src}: {source.describe()}", file=sys.stderr)
    bar = tqdm(total=len(source), unit="sample", unit_scale=True, desc="convert",
               disable=not show_progress(args.quiet), file=sys.stderr)
    try:
        with _stop_on_signals():
            result = convert(source, args.dst, opts, bar.update, fingerprint(args, source))
    except ShardError as e:
        bar.close()
        print(f"shardfeed convert: error: {e}\nnothing was written to {args.dst}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        bar.close()
        signum = getattr(e, "signum", signal.SIGINT)
        how = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
        print(f"shardfeed convert: {how}; nothing was written to {args.dst}", file=sys.stderr)
        return 128 + signum
    bar.close()
    mb_s = result.bytes / 1e6 / max(result.seconds, 1e-9)
    if opts.part is not None:
        print(f"wrote part {opts.part[0]}/{opts.part[1]}: {plural(result.samples, 'sample')} in "
              f"{plural(result.shards, 'shard')} -> {result.root} (publish all parts with --merge)")
        return 0
    print(f"converted {plural(result.samples, 'sample')} into {plural(result.shards, opts.format + ' shard')}, "
          f"{human_bytes(result.bytes)} in {result.seconds:.2f} s ({mb_s:.1f} MB/s) -> {result.root}")
    return 0


def _report_stale(dst: str) -> None:
    """Remove what killed runs left beside DST, and say so (it may have been big)."""
    from shardfeed.formats.staging import remove_stale_stages

    for path in remove_stale_stages(os.path.dirname(os.path.abspath(dst))):
        print(f"removed {path}, left by a conversion that is no longer running", file=sys.stderr)
