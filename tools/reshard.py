"""`shardfeed reshard SRC DST`: change a dataset's shard size or format without decoding payloads.

Samples are copied as stored: tar members stay bytes, Parquet/Arrow columns
stay their values (ints and text become typed columns on the way into
Parquet/Arrow and their text form on the way back into tar), so images are
never decoded. The work is the conversion job's (tools/convert/job.py):
parts in parallel processes, staged, resumable after a kill, published in
one rename; SRC is a shardfeed dataset or WebDataset tars.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = __doc__.splitlines()[0]
    p.add_argument("src", metavar="SRC", help="a shardfeed dataset folder, or WebDataset tars (file, folder, glob)")
    p.add_argument("dst", metavar="DST", help="output dataset folder (must not exist unless --overwrite)")
    p.add_argument("--format", choices=("tar", "parquet", "arrow"), default="tar", help="shard format (tar)")
    p.add_argument("--max-shard-bytes", default="256MiB", metavar="SIZE", help="start a new shard past this size")
    p.add_argument("--max-shard-samples", type=int, metavar="N", help="at most N samples per shard")
    p.add_argument("--compression", metavar="CODEC", help="tar: zstd; parquet: a Parquet codec; arrow: none")
    p.add_argument("--processes", type=int, default=1, metavar="N", help="write N parts in parallel (1)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing DST dataset")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def main(args) -> int:
    from shardfeed.tools.convert import convert_cmd

    ns = argparse.Namespace(**vars(args))
    for name, value in (("source_type", None), ("shuffle_seed", None), ("shuffle_mode", "auto"), ("part", None),
                        ("merge", False), ("engine", "local"), ("address", None), ("field", None),
                        ("key_column", None), ("image_field", None), ("more_parts", [])):
        setattr(ns, name, value)
    from shardfeed.tools.convert.source_kinds import resolve_inputs

    try:
        kind, _ = resolve_inputs(args.src)
    except Exception as e:  # ShardError or ValueError: the message names SRC
        print(f"shardfeed reshard: error: {e}", file=sys.stderr)
        return 2
    if kind not in ("dataset", "tar"):
        print(f"shardfeed reshard: error: {args.src} holds {kind} input, not shards; use `shardfeed convert`",
              file=sys.stderr)
        return 2
    return convert_cmd.main(ns)
