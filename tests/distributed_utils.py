"""Ranks as local processes joined by gloo, bounded by a timeout.

Each rank is a forked process (fast: no re-import of torch) that runs
``fn(rank, world_size, *args)`` inside an initialised gloo process group
and sends back its return value; any rank failing, hanging or dying fails
the test with that rank's error.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import traceback


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(fn, rank, world_size, port, args, conn):
    import datetime

    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size, timeout=datetime.timedelta(seconds=30))
        try:
            conn.send(("ok", fn(rank, world_size, *args)))
        finally:
            dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - reported to the test
        conn.send(("err", f"rank {rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}"))


def run_ranks(fn, world_size: int, *args, timeout: float = 60.0) -> list:
    """Results of ``fn`` on every rank, in rank order. Ranks are not daemons (their
    loaders start worker processes); the finally clause kills any that hang."""
    ctx = mp.get_context("fork")
    port = _free_port()
    procs, conns = [], []
    for r in range(world_size):
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_rank_main, args=(fn, r, world_size, port, args, send), daemon=False,
                        name=f"test-rank-{r}")
        p.start()
        send.close()
        procs.append(p)
        conns.append(recv)
    results = []
    try:
        for r, c in enumerate(conns):
            if not c.poll(timeout):
                raise TimeoutError(f"rank {r} of {world_size} gave no result in {timeout} s (hang?)")
            kind, value = c.recv()
            if kind == "err":
                raise AssertionError(value)
            results.append(value)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    return results
