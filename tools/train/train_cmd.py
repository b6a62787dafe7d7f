"""`shardfeed train`: the reference DDP trainer, fed by the loader.

A small CNN on image shards, on N local CPU ranks (gloo) or under torchrun
(NCCL, bf16 autocast, pinned memory and non_blocking copies on GPUs). A log
line every --log-every steps (loss, samples/s, data stall, cache hits, bytes
fetched), held-out accuracy each epoch, a summary and a PNG plot at the end.
Checkpoints hold model, optimizer, LR scheduler and loader state; --resume
continues exactly, also with another number of ranks. Ranks end with the
launcher, however it ends (launch.py). Launch it either way:

    shardfeed train DATA --ranks 2                 # spawns 2 local ranks
    torchrun --nproc-per-node 2 -m shardfeed.tools.train DATA
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import signal
import socket
import sys
import time

from shardfeed.cache.fetching.url_schemes import is_remote
from shardfeed.tools.text import plural
from shardfeed.tools.train.launch import die_with_parent, run_ranks
from shardfeed.tools.train.options import add_arguments as _add
from shardfeed.tools.train.options import check_data, check_options


def add_arguments(p) -> None:
    p.description = __doc__.strip()
    _add(p)


def _backend(args) -> str:
    import torch

    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    return "nccl" if cuda else "gloo"


def _worker(rank: int, world: int, port: int, args, launcher: int) -> None:
    import torch.distributed as dist

    from shardfeed.formats import ShardError
    from shardfeed.tools.train.loop import run_rank

    die_with_parent(launcher)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    dist.init_process_group(_backend(args), rank=rank, world_size=world, timeout=_timeout(args))
    try:
        run_rank(rank, world, args)
    except (ShardError, ValueError) as e:
        # Bad data met mid-run (a shard checked up front went bad): one line, and
        # exit code 2 tells main() the message is already out.
        print(f"shardfeed train: error: rank {rank}: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    finally:
        dist.destroy_process_group()


def resume_hint(path: str | None) -> str:
    """Where a stopped run can go on from: the checkpoint and its step (read from its ``PATH.json``)."""
    if not path:
        return "No --checkpoint was given, so nothing was saved: pass --checkpoint PATH to be able to resume."
    try:
        with open(path + ".json") as f:
            info = json.load(f)
        at = f"step {info['step']}, epoch {info['epoch']}"
    except (OSError, ValueError, KeyError):
        return f"No checkpoint was written to {path} yet: a rerun starts from the beginning."
    return f"The last checkpoint is {path} ({at}): continue with --resume --checkpoint {path}."


def _timeout(args) -> datetime.timedelta:
    # a rank that dies leaves the others in a collective: fail after this long instead of hanging
    return datetime.timedelta(seconds=args.collective_timeout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _check(args) -> str | None:
    """The first problem with the options or the data, as one line; None when all is well."""
    from shardfeed.formats import ShardError

    try:
        check_options(args)
        for source, follow in ((args.data, args.follow), (args.eval_data, False)):
            if source and is_remote(source):  # a URL's index comes through the cache, inside the ranks
                from shardfeed.cache.fetching.url_schemes import check_url

                check_url(source)
            elif source:
                field = check_data(source, follow=follow, field=args.image_field)
                args.image_field = args.image_field or field
    except (ValueError, ShardError) as e:
        return str(e)
    return None


def main(args) -> int:
    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    problem = _check(args)
    if problem:
        if not under_torchrun or os.environ["RANK"] == "0":  # every rank exits; one says why
            print(f"shardfeed train: error: {problem}", file=sys.stderr)
        return 2
    import torch  # here, not at the top: `shardfeed train --help` and option errors need none of it
    import torch.distributed as dist

    from shardfeed.tools.train.loop import run_rank

    if under_torchrun:
        dist.init_process_group(_backend(args), timeout=_timeout(args))
        try:
            run_rank(dist.get_rank(), dist.get_world_size(), args)
        finally:
            dist.destroy_process_group()
        return 0
    t0 = time.perf_counter()
    # torch logs "Terminating process N via signal SIGTERM" for each rank it stops after another failed:
    # the one line below says so, naming the failed rank
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    try:
        stopped_by = run_ranks(_worker, args.ranks, (args.ranks, _free_port(), args))
    except torch.multiprocessing.ProcessRaisedException as e:  # an exception in a rank: its traceback, then why
        print(str(e).strip(), file=sys.stderr)
        print(f"shardfeed train: error: rank {e.error_index} raised the exception above; the other ranks were "
              f"stopped. {resume_hint(args.checkpoint)}", file=sys.stderr)
        return 1
    except torch.multiprocessing.ProcessExitedException as e:
        if e.exit_code == 2:  # the rank printed its one-line error
            return 2
        how = f"was killed by {e.signal_name}" if e.signal_name else f"exited with code {e.exit_code}"
        print(f"shardfeed train: error: rank {e.error_index} {how}; the other ranks were stopped. "
              f"{resume_hint(args.checkpoint)}", file=sys.stderr)
        return 1
    if stopped_by is not None:
        name = signal.Signals(stopped_by).name
        print(f"shardfeed train: stopped by {name}; its {plural(args.ranks, 'rank')} were stopped. "
              f"{resume_hint(args.checkpoint)}", file=sys.stderr)
        return 128 + stopped_by
    print(f"trained on {plural(args.ranks, 'rank')} in {time.perf_counter() - t0:.1f}s", flush=True)
    return 0
