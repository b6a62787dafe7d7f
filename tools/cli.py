"""`shardfeed` command line: one module per subcommand, imported lazily.

Each subcommand module has ``add_arguments(parser)`` and ``main(args) -> int``
so tests call ``main`` directly without a subprocess.
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys

from shardfeed.tools.text import HelpFormatter

# name -> (module, one-line help)
COMMANDS = {
    "convert": ("shardfeed.tools.convert.convert_cmd", "convert images/JSONL/CSV/Parquet/tars into shards"),
    "reshard": ("shardfeed.tools.reshard", "change shard size or format (tar <-> Parquet/Arrow) without decoding"),
    "inspect": ("shardfeed.tools.inspect_cmd", "show counts, sizes, fields and a few samples"),
    "verify": ("shardfeed.tools.verify", "check every hash and offset of a dataset"),
    "plan": ("shardfeed.tools.plan_cmd", "bytes a node's cache fetches per epoch for each shuffle order"),
    "bench": ("shardfeed.tools.bench.command", "throughput and quality benchmarks"),
    "ingest": ("shardfeed.tools.ingest", "append samples to a live dataset, publishing each shard as it fills"),
    "compact": ("shardfeed.tools.compact", "fold a growing dataset's commit log into index.arrow while readers follow"),
    "audit": ("shardfeed.tools.audit_cmd", "merge ranks' delivery records; report missed, repeated, padded samples"),
    "train": ("shardfeed.tools.train.train_cmd", "the reference DDP trainer on local CPU ranks or under torchrun"),
    "demo": ("shardfeed.tools.train.demo", "build a small dataset, shard it and read it back"),
    "warm": ("shardfeed.tools.warm", "compile the kernels once, so fresh processes start fast"),
}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser, with the arguments of the one command ``argv`` names (every command's one-line
    help is listed; only that command's module is imported, so `shardfeed --help` and argument
    errors come before any heavy import: torch is imported only by the commands that run it)."""
    parser = argparse.ArgumentParser(prog="shardfeed", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    named = next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        # the one-line help doubles as the description; a module may set a longer one
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=HelpFormatter)
        p.set_defaults(_module=module)
        if name == named:
            importlib.import_module(module).add_arguments(p)
    return parser


def bad_number(args: argparse.Namespace) -> str | None:
    """Every float option of every subcommand is a duration, rate, size or fraction: a
    non-finite or negative one (``--idle-exit-s nan`` waited forever) is refused up front."""
    for dest, value in vars(args).items():
        if isinstance(value, float) and not (math.isfinite(value) and value >= 0):
            return f"--{dest.replace('_', '-')} {value!r} must be a finite number >= 0"
    return None


def main(argv: list[str] | None = None) -> int:
    from shardfeed.tools.extras import MissingExtra
    from shardfeed.tools.size_options import join_negative_values

    argv = join_negative_values(sys.argv[1:] if argv is None else list(argv))
    args = build_parser(argv).parse_args(argv)
    err = bad_number(args)
    if err:
        print(f"shardfeed {args.command}: error: {err}", file=sys.stderr)
        return 2
    try:
        return int(importlib.import_module(args._module).main(args) or 0)
    except MissingExtra as e:  # an optional dependency (the bench extra): one line saying how to install it
        print(f"shardfeed {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
