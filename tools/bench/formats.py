"""`shardfeed bench formats`: how fast the formats layer writes, reads and opens.

Measures, in one run on this machine (everything seeded, so two runs do the
same work):
- write throughput of ShardWriter for 100 KiB samples, as a fraction of `dd`
  writing the same number of bytes to the same disk (no fsync for either:
  both measure the path into the page cache);
- random access to single samples by offset (mmap + sidecar) for 100 KiB
  samples, and tar vs Arrow IPC vs Parquet for 2 KiB samples;
- time and memory to open the index of a synthesized 100,000-shard,
  1,000,000,000-sample dataset, index.arrow vs JSON of the same rows, each in
  a fresh process (median of 3);
- the numba tar header scanner vs Python's tarfile indexing the same foreign
  tar of small members.
Writes ``bench_formats.md`` into ``--out`` and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

import numpy as np
from tqdm import tqdm

from shardfeed.formats import ShardInfo, ShardWriter, open_index, open_shard, write_index
from shardfeed.formats.tar import list_members, scan_headers
from shardfeed.tools.bench import fresh, results
from shardfeed.tools.text import show_progress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="bench-results", help="output folder (default bench-results)")
    parser.add_argument("--work", default=None,
                        help="scratch folder on the disk to measure (default: a temp folder under --out)")
    parser.add_argument("--write-mib", type=int, default=192, help="MiB of 100 KiB samples to write")
    parser.add_argument("--reads", type=int, default=10_000, help="random single-sample reads per case")
    parser.add_argument("--small-samples", type=int, default=20_000, help="2 KiB samples per format")
    parser.add_argument("--index-shards", type=int, default=100_000)
    parser.add_argument("--scan-members", type=int, default=100_000, help="members in the foreign tar")
    parser.add_argument("--seed", type=int, default=0)


def _payloads(size: int, count: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(count)]


def bench_write(work: str, mib: int, seed: int) -> dict:
    size = 100 << 10
    n = (mib << 20) // size
    pool = _payloads(size, 64, seed)  # generated before the clock starts
    root = os.path.join(work, "write100k")
    disk_guess = n * (size + 2048)
    dd_before = _dd(work, disk_guess)  # dd before and after: the page cache's writeback state drifts
    t0 = time.perf_counter()
    with ShardWriter(root, max_shard_bytes=64 << 20) as w:
        for i in range(n):
            w.write({"__key__": f"{i:09d}", "cls": i % 1000, "bin": pool[i % len(pool)]})
    t_write = time.perf_counter() - t0
    disk = sum(os.path.getsize(os.path.join(root, f)) for f in os.listdir(root))
    dd_after = _dd(work, disk_guess)
    dd_mbs = statistics.median([dd_before, dd_after])
    return {"root": root, "samples": n, "bytes": disk, "write_s": t_write, "dd_runs": (dd_before, dd_after),
            "write_mbs": disk / t_write / 1e6, "dd_mbs": dd_mbs}


def _dd(work: str, nbytes: int) -> float:
    """MB/s of dd writing ``nbytes`` (whole MiB) of zeros into a new file on the same disk."""
    path = os.path.join(work, "dd.bin")
    mib = max(1, nbytes >> 20)
    t0 = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={mib}"], check=True, capture_output=True)
    dt = time.perf_counter() - t0
    os.unlink(path)
    return (mib << 20) / dt / 1e6


def _random_reads(root: str, reads: int, seed: int) -> tuple[float, int]:
    """Open every shard once, then read ``reads`` random samples one at a time."""
    idx = open_index(root)
    readers = [open_shard(idx, i) for i in range(len(idx))]
    ids = np.random.default_rng(seed).integers(0, idx.num_samples, reads)
    shard, local = idx.locate(ids)
    for s, j in zip(shard[:100].tolist(), local[:100].tolist()):  # warm the page cache and code paths
        readers[s].read(j)
    got = 0
    t0 = time.perf_counter()
    for s, j in zip(shard.tolist(), local.tolist()):
        got += len(readers[s].read(j))
    dt = time.perf_counter() - t0
    for r in readers:
        r.close()
    return dt, got


def bench_small_formats(work: str, n: int, reads: int, seed: int) -> list[dict]:
    pool = _payloads(2048, 256, seed + 1)
    rows = []
    for fmt in ("tar", "arrow", "parquet"):
        root = os.path.join(work, f"small-{fmt}")
        with ShardWriter(root, format=fmt, max_shard_samples=max(1, n // 4)) as w:
            for i in range(n):
                w.write({"__key__": f"{i:09d}", "cls": i % 1000, "bin": pool[i % len(pool)]})
        dt, _ = _random_reads(root, reads, seed)
        rows.append({"format": fmt, "samples_s": reads / dt, "us": dt / reads * 1e6,
                     "disk_mb": sum(open_index(root).sizes) / 1e6})
    return rows


def open_in_fresh_process(job: dict) -> dict:
    """One index open (``job["kind"]`` arrow or json) and its RSS growth, in a fresh process (fresh.run)."""
    import tracemalloc

    import psutil
    import pyarrow.compute  # noqa: F401 (loaded before the baseline, as opening needs it)

    path, traced = job["path"], job["traced"]
    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    if traced:  # tracemalloc slows allocation ~10x: its run gives the peak only
        tracemalloc.start()
    t0 = time.perf_counter()
    if job["kind"] == "arrow":
        idx = open_index(path)
        n, samples = len(idx), idx.num_samples
    else:
        with open(path) as f:
            rows = json.load(f)
        names = [r["name"] for r in rows]
        counts = np.array([r["samples"] for r in rows], np.int64)
        offsets = np.concatenate([[0], np.cumsum(counts)])
        n, samples = len(names), int(offsets[-1])
    dt = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    return {"status": "ok", "s": dt, "rss": proc.memory_info().rss - rss0, "peak": peak, "n": n,
            "samples": samples}


def bench_index_open(work: str, shards: int) -> dict:
    from shardfeed.tools.extras import require

    require("psutil", "the index-open benchmark's memory sampling")  # its child processes import it
    root = os.path.join(work, "bigindex")
    os.makedirs(root, exist_ok=True)
    per = 1_000_000_000 // shards
    rng = np.random.default_rng(7)
    hashes = [f"{h:032x}" for h in rng.integers(0, 2**63, shards, dtype=np.int64).tolist()]
    rows = [ShardInfo(f"shard-{i:06d}.tar", "tar", per, 1 << 30, hashes[i]) for i in range(shards)]
    write_index(root, rows, ["cls", "jpg"])
    json_path = os.path.join(work, "bigindex.json")
    with open(json_path, "w") as f:
        json.dump([r.__dict__ for r in rows], f)
    out = {"shards": shards, "samples": per * shards, "arrow_bytes": os.path.getsize(os.path.join(root, "index.arrow")),
           "json_bytes": os.path.getsize(json_path)}
    for kind, path in (("arrow", root), ("json", json_path)):
        runs = []
        for traced in (False, False, False, True):
            res = fresh.run("shardfeed.tools.bench.formats:open_in_fresh_process",
                            {"kind": kind, "path": path, "traced": traced}, timeout=600)
            if res["status"] != "ok":
                raise RuntimeError(f"{kind} index open: {res['status']}")
            runs.append(res)
        if runs[0]["samples"] != per * shards or runs[0]["n"] != shards:
            raise RuntimeError(f"{kind} index read back {runs[0]} (expected {shards} shards)")
        out[kind] = {k: statistics.median(r[k] for r in runs[:3]) for k in ("s", "rss")}
        out[kind]["peak"] = runs[3]["peak"]
    return out


def bench_scan(work: str, members: int, seed: int) -> dict:
    path = os.path.join(work, "foreign.tar")
    rng = np.random.default_rng(seed + 2)
    import io
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:  # a tar not written by us
        for i in range(members):
            data = rng.integers(0, 256, 100, dtype=np.uint8).tobytes()
            info = tarfile.TarInfo(f"{i // 2:08d}.{'cls' if i % 2 else 'bin'}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    buf = np.fromfile(path, np.uint8)
    scan_headers(buf, path)  # compile (cached on disk) and warm
    t0 = time.perf_counter()
    hdr, _, _ = scan_headers(buf, path)
    t_scan = time.perf_counter() - t0
    t0 = time.perf_counter()
    named = list_members(buf, path)
    t_list = time.perf_counter() - t0
    t0 = time.perf_counter()
    with tarfile.open(path) as tf:
        py = tf.getmembers()
    t_py = time.perf_counter() - t0
    if not (len(hdr) == len(named) == len(py) == members):
        raise RuntimeError(f"scanners disagree: {len(hdr)}, {len(named)}, {len(py)} of {members}")
    if [m[0] for m in named[:1000]] != [m.name for m in py[:1000]]:
        raise RuntimeError("scanners disagree on member names")
    return {"members": members, "mb": buf.nbytes / 1e6, "scan_s": t_scan, "list_s": t_list, "tarfile_s": t_py}


def render(w: dict, rand: dict, small: list[dict], idx: dict, scan: dict) -> str:
    L = ["# shardfeed formats benchmark", "",
         f"Machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}. One run; "
         "index opening is the median of 3 fresh processes (after imports), its tracemalloc peak from a "
         "4th, since tracing slows allocation.", "",
         "## Write, 100 KiB samples (tar, ShardWriter vs dd to the same disk, no fsync for either)", "",
         "| what | MB/s | fraction of dd |", "|---|--:|--:|",
         f"| dd bs=1M from /dev/zero, same size, before / after | {w['dd_runs'][0]:,.0f} / "
         f"{w['dd_runs'][1]:,.0f} (median {w['dd_mbs']:,.0f}) | 1.00 |",
         f"| ShardWriter, {w['samples']:,} samples, {w['bytes'] / 1e6:,.0f} MB in {w['write_s']:.2f} s | "
         f"{w['write_mbs']:,.0f} | {w['write_mbs'] / w['dd_mbs']:.2f} |", "",
         "## Random access to single samples by offset (mmap + sidecar, checksum verified)", "",
         "| samples | format | samples/s | us/sample |", "|---|---|--:|--:|",
         f"| 100 KiB | tar | {rand['samples_s']:,.0f} | {rand['us']:.1f} |"]
    for r in small:
        L.append(f"| 2 KiB | {r['format']} | {r['samples_s']:,.0f} | {r['us']:.1f} |")
    a, j = idx["arrow"], idx["json"]
    L += ["", f"## Opening the index of {idx['shards']:,} shards / {idx['samples']:,} samples (fresh process)", "",
          "| index | file MB | seconds | RSS delta MB | tracemalloc peak MB |", "|---|--:|--:|--:|--:|",
          f"| index.arrow (open_index, validated) | {idx['arrow_bytes'] / 1e6:.1f} | {a['s']:.3f} | "
          f"{a['rss'] / 1e6:.1f} | {a['peak'] / 1e6:.1f} |",
          f"| JSON of the same rows (json.load + arrays) | {idx['json_bytes'] / 1e6:.1f} | {j['s']:.3f} | "
          f"{j['rss'] / 1e6:.1f} | {j['peak'] / 1e6:.1f} |",
          "", f"## Indexing a foreign tar of {scan['members']:,} members ({scan['mb']:.0f} MB, in page cache)", "",
          "| scanner | seconds | members/s |", "|---|--:|--:|",
          f"| numba scan_headers (offsets, sizes, types) | {scan['scan_s']:.4f} | "
          f"{scan['members'] / scan['scan_s']:,.0f} |",
          f"| list_members (numba scan + names in Python) | {scan['list_s']:.4f} | "
          f"{scan['members'] / scan['list_s']:,.0f} |",
          f"| Python tarfile getmembers() | {scan['tarfile_s']:.4f} | {scan['members'] / scan['tarfile_s']:,.0f} |"]
    return "\n".join(L) + "\n"


def main(args: argparse.Namespace) -> int:
    os.makedirs(args.out, exist_ok=True)
    work = args.work or tempfile.mkdtemp(prefix="bench-formats-", dir=args.out)
    t_start = time.perf_counter()
    try:
        steps = tqdm(total=5, desc="bench formats", unit="step", disable=not show_progress())
        steps.set_postfix_str("write 100 KiB")
        w = bench_write(work, args.write_mib, args.seed)
        steps.update()
        steps.set_postfix_str("random reads 100 KiB")
        dt, _ = _random_reads(w["root"], args.reads, args.seed)
        rand = {"samples_s": args.reads / dt, "us": dt / args.reads * 1e6}
        shutil.rmtree(w["root"])
        steps.update()
        steps.set_postfix_str("2 KiB tar / arrow / parquet")
        small = bench_small_formats(work, args.small_samples, args.reads, args.seed)
        steps.update()
        steps.set_postfix_str("index open")
        idx = bench_index_open(work, args.index_shards)
        steps.update()
        steps.set_postfix_str("tar scan")
        scan = bench_scan(work, args.scan_members, args.seed)
        steps.update()
        steps.close()
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    text = render(w, rand, small, idx, scan)
    results.write(args.out, {"bench_formats.md": text})
    print(text)
    print(f"bench formats: write {w['write_mbs'] / w['dd_mbs']:.2f} of dd, 100 KiB random read "
          f"{rand['samples_s']:,.0f}/s, index of {idx['shards']:,} shards opens in {idx['arrow']['s']:.3f} s, "
          f"tar scan {scan['members'] / scan['scan_s']:,.0f} members/s; {time.perf_counter() - t_start:.0f} s "
          f"-> {os.path.join(args.out, 'bench_formats.md')}")
    return 0
