"""`shardfeed bench`: the benchmarks, one sub-subcommand each.

    shardfeed bench read      read throughput against peers (bench_read)
    shardfeed bench shuffle   shuffle quality (bench_shuffle)
    shardfeed bench formats   format size and speed (bench_formats)
    shardfeed bench pairings  every format under every order, with and without a cache (bench_pairings)
    shardfeed bench payloads  raw/npy tokens and byte fields as bytes, views, jagged (bench_payloads)
    shardfeed bench images    photos: decode + RandomResizedCrop + flip in the workers vs ImageFolder, webdataset
    shardfeed bench tokens    token windows under global shuffle vs a Megatron-style memmap loop (bench_tokens)
    shardfeed bench convert   conversion throughput and write-time shuffle (bench_convert)
    shardfeed bench cache     node cache vs a throttled remote (bench_cache)
    shardfeed bench remote    a remote dataset through a cache smaller than it: bytes, requests, stall
    shardfeed bench mix       mixing overhead and audit memory (bench_mix)
    shardfeed bench stream    publish-to-delivery latency, ingest + follow throughput (bench_stream)
    shardfeed bench compare   beside the peers: whole pass, steady, first batch (bench_compare)
    shardfeed bench startup   a fresh process's first batch, import included, wall and CPU (bench_startup)
    shardfeed bench balance   2 ranks, one slowed 2x/3x: balanced vs equal vs the best static split (bench_balance)
    shardfeed bench soak      streaming ingest + follow on 2 ranks under scheduled faults (bench_soak)
    shardfeed bench all       each of the above in turn, except the long soak

Each benchmark is its own module with ``add_arguments`` and ``main``; one that
is not built yet in this checkout is reported as "not built" instead of
breaking the others.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from shardfeed.tools.bench.results import add_out as _add_out
from shardfeed.tools.text import HelpFormatter

BENCHES = {
    "read": ("shardfeed.tools.bench.read", "read throughput of shardfeed and its peers, side by side"),
    "shuffle": ("shardfeed.tools.bench.shuffle", "shuffle quality against peers"),
    "formats": ("shardfeed.tools.bench.formats", "shard formats: size on disk and speed"),
    "pairings": ("shardfeed.tools.bench.pairings",
                 "each format (tar, Arrow, Parquet, tar.zst, tar.gz) under each order, cache and worker count"),
    "payloads": ("shardfeed.tools.bench.payloads",
                 "payload forms: raw/npy tokens vs bytes, byte fields as bytes, tensor views or jagged"),
    "images": ("shardfeed.tools.bench.images",
               "real photographs: decode + RandomResizedCrop + flip in the workers against ImageFolder and webdataset"),
    "tokens": ("shardfeed.tools.bench.tokens",
               "LLM token windows under global shuffle vs a Megatron-style .bin/.idx memmap loop, tokens/s"),
    "cache": ("shardfeed.tools.bench.cache", "node-local cache against a throttled remote: bytes fetched, stalls"),
    "remote": ("shardfeed.tools.bench.remote",
               "remote dataset over a shaped link through a cache smaller than it: bytes, requests, stall"),
    "mix": ("shardfeed.tools.bench.mix", "mixing overhead of a 3-source Mixture and the audit's memory"),
    "convert": ("shardfeed.tools.bench.convert", "conversion throughput, write-shuffle memory and quality"),
    "stream": ("shardfeed.tools.bench.stream", "streaming: publish-to-delivery latency, ingest + follow throughput"),
    "compare": ("shardfeed.tools.bench.compare", "shardfeed beside its peers: whole pass, steady rate, first batch"),
    "startup": ("shardfeed.tools.bench.startup",
                "a fresh process's import and first batch (local tar, 0 workers), wall and CPU, median of fresh runs"),
    "balance": ("shardfeed.tools.bench.balance",
                "per-rank batch sizes from measured speed (Balancer) vs equal and static splits, one rank slowed"),
    "soak": ("shardfeed.tools.bench.soak", "streaming ingest + follow on 2 ranks with faults injected, then an audit"),
}
# runs of half an hour by design: `bench all` leaves them out (run them by name)
LONG = {"soak"}


def _load(name: str):
    """The benchmark's module, or None when it is not in this checkout."""
    module = BENCHES[name][0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise  # the module is there but something it needs is not: a real error
        return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.strip()
    sub = parser.add_subparsers(dest="bench", required=True, metavar="{" + ",".join(BENCHES) + ",all}")
    for name, (_, help_text) in BENCHES.items():
        # a benchmark's own add_arguments may set a longer description
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=HelpFormatter)
        mod = _load(name)
        if mod is None:
            p.description = f"{help_text} (not built in this checkout)"
            p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        else:
            mod.add_arguments(p)
        _add_out(p)
    p = sub.add_parser("all", help="run every benchmark with its defaults", formatter_class=HelpFormatter,
                       description="Run every benchmark with its defaults, one after the other, into --out;\n"
                                   "one that fails does not stop the others.")
    _add_out(p)
    p.add_argument("--quick", action="store_true", help="pass --quick to the benchmarks that take it")


def _defaults(mod, out: str, quick: bool) -> argparse.Namespace:
    """The benchmark's own defaults, with the shared --out (and --quick where it has one)."""
    p = argparse.ArgumentParser()
    mod.add_arguments(p)
    _add_out(p)
    argv = ["--out", out]
    if quick and any("--quick" in a.option_strings for a in p._actions):
        argv.append("--quick")
    return p.parse_args(argv)


def run_one(name: str, args: argparse.Namespace) -> int:
    mod = _load(name)
    if mod is None:
        print(f"shardfeed bench {name}: not built ({BENCHES[name][0]} is not in this checkout)")
        return 0
    return int(mod.main(args) or 0)


def main(args: argparse.Namespace) -> int:
    if args.bench != "all":
        return run_one(args.bench, args)
    codes = {}
    for name in (n for n in BENCHES if n not in LONG):
        mod = _load(name)
        if mod is None:
            codes[name] = "not built"
            print(f"shardfeed bench {name}: not built ({BENCHES[name][0]} is not in this checkout)")
            continue
        try:
            codes[name] = int(mod.main(_defaults(mod, args.out, args.quick)) or 0)
        except Exception as e:  # one broken benchmark must not hide the others' results
            print(f"shardfeed bench {name}: error: {type(e).__name__}: {e}", file=sys.stderr)
            codes[name] = 1
    print("bench all: " + ", ".join(f"{n} {'ok' if c == 0 else c if isinstance(c, str) else f'exit {c}'}"
                                    for n, c in codes.items()))
    return 1 if any(isinstance(c, int) and c != 0 for c in codes.values()) else 0
