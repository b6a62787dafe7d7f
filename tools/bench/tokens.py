"""`shardfeed bench tokens`: the LLM pre-training read: fixed windows of a pre-tokenized uint16 (or uint32) stream
under global shuffle, shardfeed's token windows (loader/token_windows.py) against a Megatron-style memory-mapped
``.bin``/``.idx`` loop, in tokens/s and as a share of this machine's memory bandwidth.

    shardfeed bench tokens [--tokens 33554432] [--window 2048] [--batch-size 32] [--workers 0,2]
                           [--repeat 3] [--dtype uint16|uint32] [--peers-python PY|none] [--out DIR]

Token ids are uint16 (GPT-2's 50,257-id vocabulary) or, with --dtype uint32, uint32 (Llama 3's 128,256);
"uint16" below stands for either.

- **shardfeed**: ``write_token_windows`` (8 tar shards), ``ShardDataset(shuffle="global")`` +
  ``Loader``: each batch one ``(batch, window)`` uint16 tensor.
- **Megatron-style**: the stream as one raw ``.bin`` (uint16) with an ``.idx`` of document offsets (here
  one document), read through ``numpy.memmap``; a map-style torch Dataset returns window ``i`` as a
  uint16 tensor (a copy out of the mapping, as Megatron's GPTDataset copies its sample), and a torch
  DataLoader shuffles (``shuffle=True``, a seeded generator) and stacks. Megatron itself also builds
  its shuffle and sample indices with a C++ helper; with one document of whole windows they are the
  identity and a permutation, which is what this loop uses.
- **MosaicML Streaming**: its LLM pre-training path as llm-foundry's ``StreamingTextDataset`` reads
  pre-tokenized data: ``MDSWriter(columns={"tokens": "bytes"})`` at its default shard size (64 MB), one
  window of token ids (``ndarray.tobytes()``) per sample; ``StreamingDataset(local=..., shuffle=True,
  shuffle_seed=0, batch_size=B)`` (its default py1e shuffle) + torch ``DataLoader(batch_size=B,
  num_workers)`` whose collate turns each sample back with ``np.frombuffer(..., uint16)`` and stacks.
  Streaming runs in its own venv (``.venv-peers``, see peers.py): each of its passes is a process
  of that venv's python, timed inside it from the dataset's construction as the other passes are (its
  imports are not timed, as theirs are not). Without that venv its rows say "skipped" and why.
- **Memory bandwidth**: ``numpy.copyto`` of a 256 MiB array (page-faulted first), bytes of the source
  per second: the ceiling for moving tokens once.

Every pass is checked: the sum of every delivered token (int64) must equal the stream's. Each variant is
one pass per repeat (a fresh Loader, workers started inside the timing), variants alternating, median of
the repeats.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.strip().split("\n\n")[0]
    parser.add_argument("--tokens", type=int, default=1 << 25, help="tokens in the stream (default: 32 Mi = 64 MiB)")
    parser.add_argument("--window", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", default="0,2", help="comma-separated worker counts (default: %(default)s)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dtype", choices=("uint16", "uint32"), default="uint16",
                        help="token ids (uint32: a vocabulary past 65,535, here Llama 3's 128,256)")
    parser.add_argument("--out", default="bench-results", help="folder for the results (default: %(default)s)")
    parser.add_argument("--peers-python", default=None, metavar="PYTHON",
                        help="the interpreter with MosaicML Streaming (default: $SHARDFEED_PEERS_PYTHON, else "
                             ".venv-peers beside the checkout; its rows are skipped without one, or with \"none\")")


class MegatronStyle:
    """Window ``i`` of a memory-mapped ``.bin`` (module level so DataLoader workers can pickle it)."""

    def __init__(self, bin_path: str, idx_path: str, window: int, dtype: str = "uint16"):
        self.bin_path, self.window, self.dtype = bin_path, window, dtype
        offsets = np.load(idx_path)  # document starts and the end, in tokens
        self.n = int(offsets[-1]) // window
        self._mm = None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch

        if self._mm is None:  # opened in the process that reads (after a fork or spawn)
            self._mm = np.memmap(self.bin_path, dtype=np.dtype(self.dtype), mode="r")
        return torch.from_numpy(np.array(self._mm[i * self.window:(i + 1) * self.window]))


def _write(folder: str, tokens: np.ndarray, window: int) -> dict:
    from shardfeed.loader.token_windows import write_token_windows

    sf = os.path.join(folder, "shardfeed")
    if not os.path.exists(os.path.join(sf, "index.arrow")):
        n = len(tokens) // window
        write_token_windows(sf, [tokens], window=window, dtype=str(tokens.dtype), max_shard_samples=-(-n // 8))
    mg = os.path.join(folder, "megatron")
    os.makedirs(mg, exist_ok=True)
    tokens.tofile(os.path.join(mg, "data.bin"))
    np.save(os.path.join(mg, "data.idx.npy"), np.array([0, len(tokens)], np.int64))
    return {"shardfeed": sf, "megatron": (os.path.join(mg, "data.bin"), os.path.join(mg, "data.idx.npy"))}


def _stack_tokens(samples, dtype: str = "uint16"):
    """Streaming's samples back to token ids (llm-foundry's np.frombuffer), stacked into one tensor."""
    import torch

    return torch.from_numpy(np.stack([np.frombuffer(s["tokens"], np.dtype(dtype)) for s in samples]))


def _batches(variant: str, where, window: int, batch: int, workers: int, dtype: str = "uint16"):
    if variant == "streaming":
        from torch.utils.data import DataLoader

        from shardfeed.tools.bench.peers import import_streaming
        _, streaming_dataset = import_streaming()
        dataset = streaming_dataset(local=where, shuffle=True, shuffle_seed=0, batch_size=batch)
        import functools
        yield from DataLoader(dataset, batch_size=batch, num_workers=workers,
                              collate_fn=functools.partial(_stack_tokens, dtype=dtype))
        return
    if variant == "shardfeed":
        from shardfeed.loader import Loader, ShardDataset
        with Loader(ShardDataset(where, shuffle="global", seed=0), batch_size=batch, num_workers=workers) as ld:
            for b in ld:
                yield b[f"tokens.{dtype}"]
        return
    import torch
    from torch.utils.data import DataLoader
    yield from DataLoader(MegatronStyle(*where, window, dtype), batch_size=batch, shuffle=True, num_workers=workers,
                          generator=torch.Generator().manual_seed(0))


def _pass(variant, where, window, batch, workers, expected_sum, dtype: str = "uint16") -> dict:
    t0 = time.perf_counter()
    total = count = 0
    first = None
    for x in _batches(variant, where, window, batch, workers, dtype):
        a = x.numpy()
        total += int(a.sum(dtype=np.int64))
        count += a.size
        if first is None:
            first = (time.perf_counter(), count)
    end = time.perf_counter()
    if total != expected_sum:
        return {"status": f"FAILED: token sum {total} != {expected_sum}"}
    return {"status": "ok", "tokens": count, "whole": count / (end - t0),
            "steady": (count - first[1]) / (end - first[0]) if end > first[0] else None}


def child(job: dict) -> dict:
    """A Streaming process (fresh.run, under Streaming's venv): write the MDS shards from the .bin, or time
    one pass."""
    try:
        from shardfeed.tools.bench.peers import import_streaming
        mds_writer, _ = import_streaming()
        if job["mode"] == "write":
            mm, w = np.memmap(job["bin"], dtype=np.dtype(job["dtype"]), mode="r"), job["window"]
            with mds_writer(out=job["folder"], columns={"tokens": "bytes"}) as out:
                for i in range(len(mm) // w):
                    out.write({"tokens": mm[i * w:(i + 1) * w].tobytes()})
            result = {"status": "ok"}
        else:
            import torch.utils.data  # noqa: F401 (imported before the timing, as the parent's passes have it)
            from streaming.base.util import clean_stale_shared_memory
            clean_stale_shared_memory()
            result = _pass("streaming", job["folder"], job["window"], job["batch"], job["workers"], job["expected"],
                           job["dtype"])
    except ImportError as e:
        result = {"status": f"skipped: cannot import MosaicML Streaming ({type(e).__name__}: {e})"}
    return result


def _in_streaming(python: str, job: dict, timeout: float = 1800) -> dict:
    from shardfeed.tools.bench import fresh

    # by path: Streaming's venv may hold another checkout's shardfeed
    return fresh.run("shardfeed.tools.bench.tokens:child", job, timeout=timeout, python=python, by_path=True)


def _streaming_data(folder: str, bin_path: str, window: int, python: str | None, dtype: str) -> str:
    """Streaming's shards of the same stream (written once, in its venv): "ok" or why not."""
    if python is None:
        return ("skipped: no venv for MosaicML Streaming (run tools/bench/install_peers.sh, or give "
                "--peers-python / $SHARDFEED_PEERS_PYTHON)")
    if os.path.exists(os.path.join(folder, "index.json")):
        return "ok"
    return _in_streaming(python, {"mode": "write", "bin": bin_path, "folder": folder, "window": window,
                                  "dtype": dtype})["status"]


def copy_gb_s(nbytes: int = 256 << 20) -> float:
    src = np.ones(nbytes, np.uint8)
    dst = np.zeros(nbytes, np.uint8)
    best = 0.0
    for _ in range(3):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = max(best, nbytes / (time.perf_counter() - t))
    return best / 1e9


def main(args: argparse.Namespace) -> int:
    out = os.path.abspath(args.out)
    dtype = getattr(args, "dtype", "uint16")
    data = os.path.join(out, "data", f"tokens-{args.tokens}-w{args.window}" + ("" if dtype == "uint16" else "-uint32"))
    os.makedirs(data, exist_ok=True)
    workers = [int(w) for w in args.workers.split(",")]
    n = args.tokens // args.window * args.window
    vocab = 50257 if dtype == "uint16" else 128256  # GPT-2's, Llama 3's
    tokens = (np.random.default_rng(0).integers(0, vocab, n)).astype(dtype)
    expected = int(tokens.sum(dtype=np.int64))
    where = _write(data, tokens, args.window)
    from shardfeed.tools.bench.peers import peers_python
    peers_py = None if args.peers_python == "none" else peers_python(args.peers_python)
    where["streaming"] = os.path.join(data, "streaming")
    streaming = _streaming_data(where["streaming"], where["megatron"][0], args.window, peers_py, dtype)
    bw = copy_gb_s()
    runs: dict = {}
    for _ in range(args.repeat):
        for w in workers:
            for v in ("shardfeed", "megatron", "streaming"):
                if v == "streaming":
                    r = streaming if streaming != "ok" else _in_streaming(peers_py, {
                        "mode": "pass", "folder": where[v], "window": args.window, "batch": args.batch_size,
                        "workers": w, "expected": expected, "dtype": dtype})
                    r = r if isinstance(r, dict) else {"status": r}
                else:
                    r = _pass(v, where[v], args.window, args.batch_size, w, expected, dtype)
                runs.setdefault((v, w), []).append(r)
    rows = []
    for (v, w), rs in runs.items():
        bad = next((r for r in rs if r["status"] != "ok"), None)
        row = {"variant": v, "workers": w, "status": bad["status"] if bad else "ok"}
        if not bad:
            for k in ("whole", "steady"):
                vals = [r[k] for r in rs if r.get(k)]
                row[k] = statistics.median(vals) if vals else None
            row["share_of_copy"] = row["steady"] * tokens.itemsize / (bw * 1e9) if row.get("steady") else None
        rows.append(row)
    from shardfeed.tools.bench import results

    report = {"tokens": n, "dtype": dtype, "window": args.window, "batch_size": args.batch_size, "repeat": args.repeat,
              "copy_gb_s": bw, "machine": results.machine(), "rows": rows}
    labels = {"shardfeed": "shardfeed token windows (global shuffle)",
              "megatron": "Megatron-style .bin/.idx memmap + DataLoader(shuffle=True)",
              "streaming": "MosaicML Streaming, MDS 'bytes' windows (py1e shuffle) + DataLoader"}
    md = (f"`shardfeed bench tokens`: {n:,} {dtype} tokens, windows of {args.window:,}, batch {args.batch_size}, "
          f"median of {args.repeat} passes; numpy copy {bw:.2f} GB/s; {report['machine']}.\n\n" + results.table(
              ["variant", "workers", "whole pass tokens/s", "steady tokens/s", "steady share of copy bandwidth",
               "status"],
              [[labels[r["variant"]], r["workers"], results.cell(r.get("whole")), results.cell(r.get("steady")),
                results.cell(r.get("share_of_copy"), ".1%"), r["status"]] for r in rows], "lrrrrl") + "\n")
    results.write(out, {"bench_tokens.json": report, "bench_tokens.md": "# shardfeed bench tokens\n\n" + md})
    print(md)
    print(f"bench tokens: wrote {out}/bench_tokens.md and .json", file=sys.stderr)
    return 0 if all(r["status"] == "ok" or r["status"].startswith("skipped") for r in rows) else 1
