"""The result of `shardfeed bench soak`: the audit over the checkpoint chain
the final run descends from, what was published, delivered and replayed, the
faults injected and survived, memory and disk over the run.
"""

from __future__ import annotations

import argparse
import json
import os

from shardfeed.tools.bench.soak_procs import WORLD, latest_checkpoint
from shardfeed.tools.text import plural


def _chain(ckpt: str) -> list[str]:
    """The checkpoints the final run descends from, oldest first: their records tile the stream."""
    out, d = [], latest_checkpoint(ckpt)
    if d is None or not d.endswith("-end"):
        raise RuntimeError(f"bench soak: no end checkpoint in {ckpt}")
    while d:
        out.append(d)
        with open(os.path.join(d, "DONE")) as f:
            d = json.load(f)["resumed_from"]
    return out[::-1]


def _delivered_total(run: str) -> int:
    n = 0
    for name in os.listdir(run):
        if name.startswith("delivered-"):
            with open(os.path.join(run, name)) as f:
                n += int(f.read().strip() or 0)
    return n


def report(r, args, minutes: float) -> dict:
    """The soak's result (bench_soak.json) from run ``r`` (soak.py's _Run), after ``shardfeed audit``
    has judged the records of its checkpoint chain."""
    from shardfeed.formats.commit_log import open_stream_index
    from shardfeed.tools import audit_cmd as audit_cli

    chain = _chain(r.ckpt)
    records = [os.path.join(d, f"rank{k}.audit.json") for d in chain for k in range(WORLD)]
    print(f"soak: shardfeed audit over {plural(len(records), 'record')} of {plural(len(chain), 'checkpoint')}:")
    rc = audit_cli.main(argparse.Namespace(records=records, examples=5))
    from shardfeed.loader import audit as audit_mod

    rows = audit_cli.merge([audit_mod.load(p) for p in records], records)
    index = open_stream_index(r.root)[0]
    counts = [int(c) for c in index.counts]
    published = sum(counts)
    # writers publish only full shards; only the last writer's end_stream publishes a short one
    last = f"w{r.gen:03d}-"
    short = [n for n, c in zip(index.names, counts) if c != args.per_shard and not n.startswith(last)]
    unique = sum(x["unique"] for x in rows)
    delivered = sum(x["delivered"] for x in rows)
    errors = {n: open(os.path.join(r.run, n)).read() for n in sorted(os.listdir(r.run)) if n.startswith("error-")}
    dones = []
    for d in os.listdir(r.ckpt):
        p = os.path.join(r.ckpt, d, "DONE")
        if os.path.exists(p):
            with open(p) as f:
                dones.append(json.load(f)["time"])
    commits = [os.path.getmtime(os.path.join(r.root, n)) for n in os.listdir(r.root) if n.startswith("w")]
    survived = {k: 0 for k in r.kinds}
    ok = rc == 0 and unique == published and not short
    for f in r.faults:
        later = commits if f["kind"] == "writer" else dones
        survived[f["kind"]] += int(ok and any(t > f["time"] for t in later))
    worker_errors = sum(1 for n, e in errors.items() if e.startswith("WorkerError"))
    out = {"minutes": minutes, "rate": args.rate, "per_shard": args.per_shard, "batch": args.batch,
           "workers": args.workers, "every": args.every, "published": published, "shards": len(counts),
           "partial_shards_published": len(short), "delivered_in_records": delivered,
           "unique": unique, "lost": published - unique, "replayed": _delivered_total(r.run) - delivered,
           "faults": {k: sum(f["kind"] == k for f in r.faults) for k in r.kinds}, "survived": survived,
           "job_restarts": r.restarts, "writers": r.gen + 1, "worker_errors": worker_errors,
           "checkpoints_in_chain": len(chain), "audit_exit": rc, "errors": errors}
    out["disk"] = {"data_tmpfs": r.mounted, "data_fs_bytes": r.fs_bytes if r.mounted else None,
                   "writers_restarted_after_enospc": r.enospc_writers}
    if r.samples:
        rss, data = ([x[k] for x in r.samples] for k in ("rss", "data_bytes"))
        third = max(1, len(rss) // 3)
        out["memory_disk"] = {
            "samples": len(rss), "peak_rss": max(rss), "rss_first_third_mean": sum(rss[:third]) / third,
            "rss_last_third_mean": sum(rss[-third:]) / third, "peak_data_bytes": max(data),
            "data_bytes_end": data[-1],
            "series": [{k: x[k] for k in ("t", "rss", "procs", "data_bytes", "reader_rss", "cache_bytes") if k in x}
                       for x in r.samples]}
    return out


def keep_records(run: str, out: str) -> None:
    """Copy a failed run's records (keys delivered, error files, checkpoints' audit) to ``out``."""
    import shutil

    dst = os.path.join(out, "failed-run")
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(run, dst, ignore=shutil.ignore_patterns("*.pt"), dirs_exist_ok=True)
    print(f"soak: the failed run's records are kept in {dst}", flush=True)
