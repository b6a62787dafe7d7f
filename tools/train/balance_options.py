"""The reference trainer's --balance, --balance-every and --slow-rank options: parsed and checked
without torch, so `shardfeed train --help` and an option error start in well under a second
(balancing.py, which acts on them, runs on torch)."""

from __future__ import annotations

import re


def add_arguments(p) -> None:
    a = p.add_argument
    a("--balance", action="store_true",
      help="choose per-rank batch sizes from each rank's measured compute time, agreed every --balance-every steps "
           "(the global batch stays; the rest of the epoch is dealt again, every sample still once)")
    a("--balance-every", type=int, default=10, help="steps between two agreements of --balance")
    a("--slow-rank", default=None, metavar="R:F",
      help="simulate a slower device: rank R repeats its forward/backward work F-1 extra times each step")


def parse_slow_rank(text: str | None, world: int) -> tuple[int, int] | None:
    if text is None:
        return None
    m = re.fullmatch(r"(\d+):(\d+)", text.strip())
    if not m or int(m[2]) < 1 or int(m[1]) >= world:
        raise ValueError(f"--slow-rank {text!r} must be RANK:FACTOR with RANK in 0..{world - 1} and FACTOR an int "
                         ">= 1 (e.g. 1:3: rank 1 does its forward/backward work 3 times)")
    return int(m[1]), int(m[2])


def check_arguments(args, world: int) -> None:
    parse_slow_rank(args.slow_rank, world)
    if args.balance_every < 2:
        raise ValueError(f"--balance-every {args.balance_every} must be 2 or more")
    if args.balance and args.follow:
        raise ValueError("--balance re-deals the rest of an epoch; a followed stream (--follow) has no epoch to "
                         "re-deal: drop one of them")
