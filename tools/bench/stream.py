"""`shardfeed bench stream`: publish-to-delivery latency and ingest + follow throughput.

One writer process appends shards to a live folder while a Loader in this
process follows it (``follow=True``, ``poll_s``). Latency: the writer stamps
each shard's samples with the wall time just before its commit; the reader
notes when each sample is delivered (one process-shared clock, one machine).
The writer paces shards (``--gap-s``) so latency is not queueing. Throughput:
the writer publishes as fast as it can and the run lasts from its first
sample to the follower's last delivered batch.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

from shardfeed.tools.text import plural

WRITER = textwrap.dedent("""
    import sys, time
    import numpy as np
    from shardfeed.formats import ShardWriter
    root, shards, per, size, gap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    payload = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes()
    w = ShardWriter(root, append=True, max_shard_samples=per, max_shard_bytes=1 << 40)
    for s in range(shards):
        if gap:
            time.sleep(gap)
        for i in range(per - 1):
            w.write({"__key__": f"{s:06d}-{i:06d}", "bin": payload, "txt": "0"})
        # the last sample of a shard fills it: the commit follows at once, stamped here
        w.write({"__key__": f"{s:06d}-{per - 1:06d}", "bin": payload, "txt": repr(time.time())})
    w.end_stream()
""")


def add_arguments(p) -> None:
    p.description = __doc__.strip()
    p.add_argument("--shards", type=int, default=50, help="shards published in the latency run")
    p.add_argument("--poll-s", type=float, default=0.05, help="the followers' poll interval")
    p.add_argument("--gap-s", type=float, default=0.1, help="latency run: the writer's pause between shards")
    p.add_argument("--latency-shard-samples", type=int, default=64,
                   help="latency run: samples per shard (small, so the follower is never the bottleneck)")
    p.add_argument("--sizes", default="2048,102400", help="sample payload sizes in bytes, comma-separated")
    p.add_argument("--mb", type=float, default=200.0, help="throughput run: MB written per sample size")
    p.add_argument("--quick", action="store_true", help="small runs (10 shards, 20 MB)")


def _run(root: str, shards: int, per: int, size: int, gap: float, poll_s: float) -> dict:
    from shardfeed.loader import Loader, ShardDataset

    os.makedirs(os.path.join(root, "_log"))
    writer = subprocess.Popen([sys.executable, "-c", WRITER, root, str(shards), str(per), str(size), str(gap)])
    loader = Loader(ShardDataset(root, follow=True, shuffle="none", poll_s=poll_s, idle_timeout_s=120, decode=False,
                                 world_size=1, rank=0), per)
    lat, n, first = [], 0, None
    t0 = time.time()
    for batch in loader:
        now = time.time()
        first = first or now
        n += len(batch["__key__"])
        for t in batch["txt"]:
            stamp = float(t if isinstance(t, str) else bytes(t).decode())
            if stamp:
                lat.append(now - stamp)
    end = time.time()
    if writer.wait(60) != 0:
        raise RuntimeError(f"bench stream: the writer process failed (exit {writer.returncode})")
    secs = end - t0
    return {"samples": n, "seconds": secs, "samples_s": n / secs, "mb_s": n * size / 1e6 / secs,
            "latency_ms": [x * 1000 for x in lat]}


def main(args) -> int:
    sizes = [int(s) for s in str(args.sizes).split(",")]
    shards, mb = (10, 20.0) if args.quick else (args.shards, args.mb)
    out = {"poll_s": args.poll_s, "runs": []}
    for size in sizes:
        per = max(1, min(512, (4 << 20) // size))  # ~4 MB shards, at most 512 samples
        with tempfile.TemporaryDirectory(prefix="bench-stream-") as tmp:
            lat = _run(os.path.join(tmp, "lat"), shards, args.latency_shard_samples, size, args.gap_s, args.poll_s)
            n_shards = max(1, int(mb * 1e6 / (size * per)))
            thr = _run(os.path.join(tmp, "thr"), n_shards, per, size, 0.0, args.poll_s)
        ms = np.asarray(lat["latency_ms"])
        row = {"size": size, "per_shard": per, "latency_median_ms": float(np.median(ms)),
               "latency_p99_ms": float(np.percentile(ms, 99)), "latency_shards": len(ms),
               "samples_s": thr["samples_s"], "mb_s": thr["mb_s"], "throughput_samples": thr["samples"]}
        out["runs"].append(row)
        print(f"{size:>7,} B samples, poll {args.poll_s:g} s: publish->delivery median {row['latency_median_ms']:.0f} ms, "
              f"p99 {row['latency_p99_ms']:.0f} ms over {plural(len(ms), 'shard')}; ingest+follow "
              f"{row['samples_s']:,.0f} samples/s, {row['mb_s']:.1f} MB/s ({plural(thr['samples'], 'sample')})")
    from shardfeed.tools.bench import results

    results.write(args.out, {"bench_stream.json": out}, say="stream")
    return 0
