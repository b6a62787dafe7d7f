"""The peers of `shardfeed bench remote`: MosaicML Streaming and LitData reading the same samples from the
same shaped link, through the same cache limit, counted by the same server.

Neither peer reads plain http(s) (Streaming 0.13 has no http downloader; LitData reads s3://), so the
peers read an S3 bucket: moto's S3 server behind a ThrottledServer that forwards to it
(tools/bench/s3_link.py: the same bandwidth, per-request latency and counters as the HTTP server
shardfeed's rows read). To keep the comparison exact, shardfeed also reads its own shards from that
bucket through that link (the row "shardfeed (s3://, the peers' link)").

Each peer writes the samples of remote.write_dataset (the same bytes, the same class-ordered order, from
one .npy file) with its own writer, at shardfeed's shard size (16 samples: at their default 64 MB the
whole dataset would be one shard larger than the cache), and reads them the way its docs show:

- Streaming: ``MDSWriter(columns={key: str, cls: int, bin: bytes}, size_limit=16 samples)``;
  ``StreamingDataset(remote="s3://...", local=DIR, shuffle=True, shuffle_seed=0, batch_size=B,
  cache_limit=LIMIT)`` (its default shuffle_algo "py1e" and block size, predownload 8 x batch) + a torch
  DataLoader(batch_size=B, num_workers=0). It runs in its own venv (.venv-peers: see peers.py).
- LitData: ``litdata.optimize(fn, inputs, chunk_size=16, num_workers=1)``;
  ``StreamingDataset("s3://...", cache_dir=DIR, shuffle=True, seed=0, max_cache_size=LIMIT,
  storage_options={endpoint_url, keys})`` + ``StreamingDataLoader(batch_size=B, num_workers=0)``.

A third Streaming row sets py1e's shuffle_block_size to the samples of half the cache (its documented
knob for this case; see TUNED).

num_workers=0 for all, as shardfeed's rows (each library prefetches in its own threads). Each peer runs in
a process of its own; at each epoch boundary it asks the link for its counters (s3_link.COUNTERS_PATH),
so its bytes and requests are the server's figures. A peer that cannot be imported or fails is a row
saying so, with the reason.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

CLASSES = 100  # as remote.py
PER_SHARD = 16  # as remote.write_dataset
PEERS = (("MosaicML Streaming", "streaming"), ("LitData", "litdata"))
# Streaming's documented knob for a cache smaller than the dataset: py1e's shuffle_block_size (default
# 262,144 samples, here the whole dataset). This extra row sets it to the samples of half the cache, so a
# block's shards fit the cache: less traffic, and the shuffle quality that costs beside it.
TUNED = "MosaicML Streaming (py1e, block = half the cache)"
S3_ROW = "shardfeed (s3://, the peers' link)"
READERS = ("MosaicML Streaming", "LitData", TUNED)
CONFIG = {
    "MosaicML Streaming": "MDSWriter(size_limit=16 samples); StreamingDataset(remote=s3://, local, shuffle=True "
                          "[py1e], shuffle_seed=0, batch_size, cache_limit) + DataLoader(num_workers=0)",
    S3_ROW: "its tar shards of the rows above uploaded to the bucket; ShardDataset(s3://, shuffle=\"global\", "
            "seed=0, cache_dir, cache_limit_bytes, storage_options) + Loader(num_workers=0)",
    TUNED: "as MosaicML Streaming, with shuffle_block_size = the samples of half the cache limit",
    "LitData": "optimize(chunk_size=16, num_workers=1); StreamingDataset(s3://, cache_dir, shuffle=True, seed=0, "
               "max_cache_size, storage_options) + StreamingDataLoader(num_workers=0)",
}
def samples_file(path: str, samples: int, payload: int) -> str:
    """The payloads of remote.write_dataset (the same generator, the same calls) as one (samples, payload) array."""
    rng = np.random.default_rng(0)
    arr = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(samples, payload))
    for i in range(samples):
        arr[i] = rng.integers(0, 256, payload, dtype=np.uint8)
    arr.flush()
    del arr
    return path


def _sample(npy: str, i: int, n: int) -> dict:
    arr = np.load(npy, mmap_mode="r")
    return {"key": f"{i:08d}", "cls": int(i * CLASSES // n), "bin": arr[i].tobytes()}


def _lit_item(args):
    """litdata.optimize's fn (module level: its worker processes call it)."""
    return _sample(*args)


def _classes(samples):
    return [int(s["cls"]) for s in samples]


def _counters(url: str) -> tuple[int, int]:
    from urllib.request import urlopen

    with urlopen(url, timeout=30) as r:
        c = json.loads(r.read())
    return c["bytes"], c["requests"]


def _epochs(loader, job: dict, set_epoch=None) -> list[dict]:
    rows = []
    for epoch in range(job["epochs"]):
        if set_epoch is not None:
            set_epoch(epoch)
        b0, r0 = _counters(job["counters"])
        t0 = time.perf_counter()
        wait, classes, seen = 0.0, [], 0
        it = iter(loader)  # workers and first downloads start here: the trainer waits for them too
        while True:
            t = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                wait += time.perf_counter() - t
                break
            wait += time.perf_counter() - t
            classes.append(len(set(batch)))
            seen += len(batch)
            time.sleep(job["compute_s"])
        dt = time.perf_counter() - t0
        b1, r1 = _counters(job["counters"])
        rows.append(dict(epoch=epoch, bytes_fetched=b1 - b0, requests=r1 - r0, epoch_s=dt, stall=wait / dt,
                         classes_per_batch=float(np.mean(classes)) if classes else "", samples=seen))
    return rows


def _streaming():
    from shardfeed.tools.bench.peers import import_streaming
    return import_streaming()


def child(job: dict) -> dict:
    """A peer's process (fresh.run): write, upload, then read for several epochs."""
    try:
        return _child(job)
    except ImportError as e:
        return {"status": f"skipped: cannot import ({type(e).__name__}: {e})"}


def _write(job: dict) -> None:
    n = job["samples"]
    if job["lib"] == "streaming":
        mds_writer, _ = _streaming()
        with mds_writer(out=job["folder"], columns={"key": "str", "cls": "int", "bin": "bytes"},
                        size_limit=PER_SHARD * (job["payload"] + 64)) as w:
            for i in range(n):
                w.write(_sample(job["npy"], i, n))
    else:
        from litdata import optimize
        optimize(fn=_lit_item, inputs=[(job["npy"], i, n) for i in range(n)], output_dir=job["folder"],
                 chunk_size=PER_SHARD, num_workers=1)


def _upload(job: dict) -> str:
    """The written folder to the bucket, straight to moto (not through the link: not counted)."""
    import boto3

    c = boto3.client("s3", endpoint_url=job["direct"])  # keys and region: the environment (s3_link.env)
    for dirpath, _, files in os.walk(job["folder"]):
        for name in sorted(files):
            path = os.path.join(dirpath, name)
            c.upload_file(path, job["bucket"], job["prefix"] + "/" + os.path.relpath(path, job["folder"]))
    return f"s3://{job['bucket']}/{job['prefix']}"


def _child(job: dict) -> dict:
    """Write with the library's own writer, upload, then read for job["epochs"] epochs."""
    if job["lib"] == "streaming":
        _streaming()  # an import failure is "skipped" before anything is written
    else:
        import litdata  # noqa: F401
    _write(job)
    own = _size(job["folder"])
    url = _upload(job)
    if job["lib"] == "streaming":
        _, streaming_dataset = _streaming()
        from streaming.base.util import clean_stale_shared_memory
        from torch.utils.data import DataLoader
        clean_stale_shared_memory()
        block = {"shuffle_block_size": job["block"]} if job.get("block") else {}
        ds = streaming_dataset(remote=url, local=job["cache"], shuffle=True, shuffle_seed=0,
                               batch_size=job["batch"], cache_limit=job["limit"], **block)
        loader = DataLoader(ds, batch_size=job["batch"], num_workers=0, collate_fn=_classes)
    else:
        from litdata import StreamingDataLoader, StreamingDataset
        from litdata.streaming import downloader

        # LitData builds its obstore S3Store without allow_http, so every chunk GET from an http:// endpoint
        # fails ("builder error"); a real S3 endpoint is https and needs none of this
        options = getattr(downloader, "_OBSTORE_CLIENT_OPTIONS", None)
        if isinstance(options, dict):
            options["allow_http"] = "true"
        ds = StreamingDataset(url, cache_dir=job["cache"], shuffle=True, seed=0, max_cache_size=job["limit"],
                              storage_options=dict(job["keys"], endpoint_url=job["endpoint"]))
        loader = StreamingDataLoader(ds, batch_size=job["batch"], num_workers=0, collate_fn=_classes)
    return {"status": "ok", "own_bytes": own, "rows": _epochs(loader, job)}


def _run(python: str, job: dict, env: dict, timeout: float) -> dict:
    from shardfeed.tools.bench import fresh

    # by name under this interpreter (litdata.optimize's workers can unpickle _lit_item), by path under
    # Streaming's venv, which may hold another checkout's shardfeed (or none)
    return fresh.run("shardfeed.tools.bench.remote_peers:child", job, timeout=timeout, python=python,
                     env={**os.environ, **env})


def _size(folder: str) -> int:
    """Bytes of a peer's shards (its index files left out, as shardfeed's index is)."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs
               if not f.endswith(".json"))


def _shardfeed_s3(url, endpoint, cache_dir, limit, epochs, batch, compute_s, link) -> list[dict]:
    from shardfeed.loader import Loader, ShardDataset
    from shardfeed.tools.bench.s3_link import KEYS

    opts = {"key": KEYS["aws_access_key_id"], "secret": KEYS["aws_secret_access_key"],
            "client_kwargs": {"endpoint_url": endpoint, "region_name": KEYS["region_name"]}}
    rows = []
    ds = ShardDataset(url, shuffle="global", seed=0, cache_dir=cache_dir, cache_limit_bytes=limit,
                      storage_options=opts)
    with Loader(ds, batch) as loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            b0, r0, t0 = link.bytes_sent, link.requests, time.perf_counter()
            classes = []
            for b in loader:
                classes.append(len(set(b["cls"].tolist())))
                time.sleep(compute_s)
            rows.append(dict(epoch=epoch, bytes_fetched=link.bytes_sent - b0, requests=link.requests - r0,
                             epoch_s=time.perf_counter() - t0, stall=loader.stats()["epoch"]["stall_fraction"],
                             classes_per_batch=float(np.mean(classes)), note=""))
    return rows


class _LeftOut(Exception):
    pass


def _empty(reader: str, bound: float, note: str) -> dict:
    return dict(reader=reader, epoch="", bytes_fetched="", x_dataset="", bound_x=bound, requests="", epoch_s="",
                stall="", classes_per_batch="", note=note)


def rows(setup, root: str, data: int, limit: int, bound: float, work: str, timeout: float = 900,
         readers: tuple = (S3_ROW, *READERS)) -> list[dict]:
    """The peers' rows of remote.py's table (and shardfeed's on the same S3 link), one per epoch;
    ``readers``: which of them (tests leave some out)."""
    from shardfeed.tools.bench.peers import adapter, peers_python, python_for

    samples, payload, epochs, rate, latency, batch, compute_s = setup
    try:
        import moto.server  # noqa: F401

        from shardfeed.cache import CacheLimitError
        from shardfeed.tools.bench.s3_link import BUCKET, COUNTERS_PATH, KEYS, ShapedS3
    except ImportError as e:
        return [_empty(r, bound, f"skipped: no S3 server to read from ({e})") for r in (S3_ROW, *READERS)]
    out: list[dict] = []
    npy = samples_file(os.path.join(work, "samples.npy"), samples, payload)
    streaming_py = peers_python(None)
    with ShapedS3(rate, latency) as s3:
        label = S3_ROW
        try:
            if label not in readers:
                raise _LeftOut
            url = s3.upload(root, "shardfeed")
            for r in _shardfeed_s3(url, s3.endpoint, os.path.join(work, "c-s3"), limit, epochs, batch, compute_s,
                                   s3.link):
                out.append(dict(r, reader=label, x_dataset=r["bytes_fetched"] / data, bound_x=bound))
        except _LeftOut:
            pass
        except CacheLimitError as e:  # as remote.py's rows say it
            out.append(_empty(label, bound, f"refused at start: needs {e.needed_bytes:,} bytes"))
        except Exception as e:  # a failure is a row, never a silent gap
            out.append(_empty(label, bound, f"error: {type(e).__name__}: {str(e)[:200]}"))
        per_sample = data / samples
        block = max(PER_SHARD, int(limit / 2 / per_sample) // PER_SHARD * PER_SHARD)
        for reader, lib in [p for p in (*PEERS, (TUNED, "streaming")) if p[0] in readers]:
            python = python_for(lib, streaming_py)
            if adapter(lib).venv and python == sys.executable:
                out.append(_empty(reader, bound, "skipped: no venv of its own (.venv-peers; run "
                                                 "tools/bench/install_peers.sh or set SHARDFEED_PEERS_PYTHON)"))
                continue
            job = dict(lib=lib, prefix=lib, samples=samples, payload=payload, npy=npy, folder=os.path.join(work, f"w-{lib}"),
                       direct=s3.direct, bucket=BUCKET, keys=KEYS, endpoint=s3.endpoint,
                       counters=s3.endpoint + COUNTERS_PATH, epochs=epochs, batch=batch, compute_s=compute_s,
                       limit=limit, cache=os.path.join(work, f"c-{lib}-{reader == TUNED}"),
                       block=block if reader == TUNED else None)
            if reader == TUNED:  # written again: one process per row
                job["folder"], job["prefix"] = job["folder"] + "-tuned", "streaming-tuned"
            done = _run(python, job, s3.env(), timeout)
            if done["status"] != "ok":
                out.append(_empty(reader, bound, done["status"]))
                continue
            own = done["own_bytes"]
            for r in done["rows"]:
                note = f"s3:// via the shaped link; its shards {own:,} bytes"
                seen = r.pop("samples")
                if seen != samples:
                    note += f"; delivered {seen} of {samples} samples"
                out.append(dict(r, reader=reader, x_dataset=r["bytes_fetched"] / own, bound_x=bound, note=note))
    return out
