"""The processes of `shardfeed bench soak`: the writer and one follower rank.

Both run as forked children of the soak driver (soak.py), each in its own
process group, so the driver can SIGKILL a rank together with its loader
workers. Checkpoints are folders ``ckpt/<seq>-s<step>/`` holding each rank's
loader state and audit record of the same moment, plus ``DONE`` written by
rank 0 only after every rank saved (an all_reduce between): a rank killed
mid-save leaves a folder without ``DONE``, which a restart ignores.
"""

from __future__ import annotations

import datetime
import json
import os
import time

WORLD = 2  # ranks of the soak's job
DATA_FS_BYTES = 256 << 20  # the smallest tmpfs of the dataset under --disk-faults (where it can be mounted)
# what one published sample takes on disk at most: its ~2.3 KiB in the tar (a 512-byte header per
# member), its sidecar row and its share of the commit entry. A tmpfs holds only what is written,
# so sizing it for the whole run costs memory only while the full-disk fault fills it
SAMPLE_DISK_BYTES = 4 << 10


def data_fs_bytes(minutes: float, rate: float) -> int:
    """The dataset's tmpfs: room for what the writer publishes in the run twice over, so the
    only full disk is the one the schedule injects (a 30-minute run at 100/s outgrew 256 MiB)."""
    return max(DATA_FS_BYTES, int(2 * minutes * 60 * rate * SAMPLE_DISK_BYTES))
KEY_FMT = "g{gen:03d}-{i:07d}"


def _atomic_json(path: str, obj) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def writer_main(root: str, gen: int, per_shard: int, rate: float, stop_file: str) -> None:
    """Append samples at ``rate`` per second until ``stop_file`` appears, then end the stream.
    Samples trickle in one by one, so a SIGKILL usually lands inside a shard (never published)."""
    os.setsid()
    import numpy as np

    from shardfeed.formats import ShardWriter

    rng = np.random.default_rng(gen)
    w = ShardWriter(root, append=True, max_shard_samples=per_shard, max_shard_bytes=1 << 40, prefix=f"w{gen:03d}")
    t0, i = time.monotonic(), 0
    while not os.path.exists(stop_file):
        w.write({"__key__": KEY_FMT.format(gen=gen, i=i), "cls": i,
                 "bin": rng.integers(0, 256, 64 + i % 512, dtype=np.uint8).tobytes()})
        i += 1
        lag = t0 + i / rate - time.monotonic()
        if lag > 0:
            time.sleep(lag)
    w.end_stream()


def latest_checkpoint(ckpt: str) -> str | None:
    """The newest complete checkpoint folder (with DONE), or None."""
    done = [d for d in os.listdir(ckpt) if os.path.exists(os.path.join(ckpt, d, "DONE"))] \
        if os.path.isdir(ckpt) else []
    return os.path.join(ckpt, max(done, key=lambda d: int(d.split("-", 1)[0]))) if done else None


def rank_main(rank: int, world: int, port: int, cfg: dict) -> None:
    """One follower rank of job ``cfg["job"]``: resume from ``cfg["resume"]`` (a checkpoint folder or
    None), follow the stream to its end, checkpointing every ``cfg["every"]`` steps."""
    os.setsid()
    import torch
    import torch.distributed as dist

    from shardfeed.loader import Loader, ShardDataset
    from shardfeed.loader import audit as audit_mod

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=cfg["collective_timeout_s"]))
    ds = ShardDataset(cfg["root"], follow=True, poll_s=0.05, idle_timeout_s=cfg["idle_timeout_s"], decode=False,
                      rank=rank, world_size=world, seed=7)
    loader = Loader(ds, cfg["batch"], num_workers=cfg["workers"], audit=True)
    resume = cfg["resume"]
    if resume:
        with open(os.path.join(resume, f"rank{rank}.state.json")) as f:
            loader.load_state_dict(json.load(f))
    # every batch this rank delivered in this job, checkpointed or not: the replays after a restart
    counter = open(os.path.join(cfg["run"], f"delivered-job{cfg['job']:04d}-rank{rank}"), "w")
    delivered = 0
    one = torch.ones(1)

    def checkpoint(tag: str, step: int) -> None:
        d = os.path.join(cfg["ckpt"], f"{step:012d}-{tag}")
        os.makedirs(d, exist_ok=True)
        _atomic_json(os.path.join(d, f"rank{rank}.state.json"), loader.state_dict())
        audit_mod.save(loader.audit_state(), os.path.join(d, f"rank{rank}.audit.json"))
        dist.all_reduce(one.clone())  # every rank saved before DONE says so
        if rank == 0:
            _atomic_json(os.path.join(d, "DONE"), {"resumed_from": resume, "job": cfg["job"], "step": step,
                                                   "time": time.time()})

    for batch in loader:
        delivered += len(batch["__key__"])
        counter.seek(0)
        counter.write(f"{delivered:<12d}")
        counter.flush()
        dist.all_reduce(one.clone())  # a training step: all ranks step together
        step = loader.state_dict()["step"]
        if step % cfg["every"] == 0:
            checkpoint(f"s{step}", step)
    checkpoint("end", loader.state_dict()["step"] + 1)
    loader.close()
    dist.destroy_process_group()


def remote_reader_main(url: str, cache_dir: str, out_path: str, idle_timeout_s: float, stall_s: float) -> None:
    """Follow the stream at ``url`` (the driver's loopback HTTP server, faults injected) through a
    node cache at ``cache_dir`` to its end, writing each delivered key to ``out_path``, one a line."""
    os.setsid()
    # a stalled or trickling answer is given up on (and retried) after stall_s, not the default 30 s
    os.environ["SHARDFEED_FETCH_STALL_S"] = str(stall_s)
    from shardfeed.loader import Loader, ShardDataset

    ds = ShardDataset(url, follow=True, cache_dir=cache_dir, poll_s=0.05, idle_timeout_s=idle_timeout_s,
                      decode=False, seed=11)
    with open(out_path, "w") as out, Loader(ds, 8) as loader:
        for batch in loader:
            out.write("".join(f"{k}\n" for k in batch["__key__"]))
            out.flush()
    with open(out_path + ".done", "w"):
        pass
