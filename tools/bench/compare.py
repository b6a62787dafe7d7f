"""`shardfeed bench compare`: shardfeed beside its peers, whole pass and steady state, one run.

Each library writes the same deterministic samples (samples.py) with its own
writer and reads them through its usual PyTorch path (the adapters of
peers.py, plus shardfeed over Parquet and MosaicML Streaming here), each
configuration in a fresh process, content-checked (a wrong pass is FAILED,
never a number). Per configuration three figures: the **whole pass**
(construction of the dataset and loader included: what a short evaluation
loop or a notebook sees), the **steady** rate after the first batch, and the
**first batch** latency. `cat` of the shards (page cache warm) gives the
read limit at 100 KiB. A peer that cannot be imported is reported as
skipped, never faked. The issue's targets are judged from the same run.

Writes bench_compare.md, bench_compare.json and bench_compare.png under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from tqdm import tqdm

from shardfeed.tools.bench.peers import ADAPTERS, Adapter, ShardfeedAdapter, _per_shard
from shardfeed.tools.bench.samples import GENERATOR_VERSION, SampleSpec
from shardfeed.tools.text import show_progress

SIZES = {"2KiB": 2048, "100KiB": 100 * 1024}
COUNTS = {"2KiB": 32768, "100KiB": 2048}  # 64 MiB and 200 MiB: the whole run stays near 10 minutes on 2 cores
QUICK_COUNTS = {"2KiB": 8192, "100KiB": 512}
LIBRARIES = ("shardfeed", "shardfeed-parquet", "webdataset", "litdata", "streaming", "files", "parquet")
RESULT_PREFIX = "BENCH_RESULT "


class ShardfeedParquetAdapter(ShardfeedAdapter):
    """shardfeed over Parquet shards written by its own ShardWriter (decoded row groups kept)."""

    name, label = "shardfeed-parquet", "shardfeed, Parquet"

    def write(self, spec, folder):
        from shardfeed.formats import ShardWriter
        with ShardWriter(folder, format="parquet", max_shard_samples=_per_shard(spec)) as writer:
            for sample in spec:
                writer.write(sample)

    def files(self, folder):
        return sorted(os.path.join(folder, p) for p in os.listdir(folder) if p.endswith(".parquet"))


class StreamingAdapter(Adapter):
    """MosaicML Streaming: MDSWriter shards read by StreamingDataset + torch DataLoader."""

    name, label = "streaming", "MosaicML Streaming"

    def load(self, read):
        super().load(read)
        import streaming  # noqa: F401  (fails beside the CPU torch wheel: PEERS.md)

    def write(self, spec, folder):
        from streaming import MDSWriter
        with MDSWriter(out=folder, columns={"key": "str", "bin": "bytes", "cls": "int"},
                       size_limit=_per_shard(spec) * (spec.size + 64)) as out:
            for i in range(spec.count):
                out.write({"key": spec.key(i), "bin": spec.payload(i), "cls": spec.cls(i)})

    def batches(self, folder, workers, shuffle, batch_size):
        from streaming import StreamingDataset
        from torch.utils.data import DataLoader

        from shardfeed.tools.bench.peers import _collate_dicts
        dataset = StreamingDataset(local=folder, shuffle=shuffle, shuffle_seed=0, batch_size=batch_size)
        yield from DataLoader(dataset, batch_size=batch_size, num_workers=workers, collate_fn=_collate_dicts)


EXTRA = {a.name: a for a in (ShardfeedParquetAdapter(), StreamingAdapter())}


def child_main(job_json: str) -> None:
    """Entry of a configuration's fresh process: bench/child.py with this module's adapters added."""
    ADAPTERS.update(EXTRA)
    from shardfeed.tools.bench import child
    child.main([job_json])


def run_child(job: dict, timeout: float) -> dict:
    code = "import sys; from shardfeed.tools.bench.compare import child_main; child_main(sys.argv[1])"
    try:
        done = subprocess.run([sys.executable, "-c", code, json.dumps(job)], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": f"error: no result after {timeout:.0f} s (--timeout)"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
    return {"status": f"error: process exited {done.returncode} without a result ({tail})"}


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version
    out = {"python": sys.version.split()[0]}
    for dist in ("shardfeed", "torch", "numpy", "pyarrow", "webdataset", "litdata", "mosaicml-streaming"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "not installed"
    return out


def _cat_mb_s(paths: list[str]) -> float:
    """`cat` of the files to /dev/null, page cache warm (read once first), MB/s."""
    subprocess.run(["cat", *paths], stdout=subprocess.DEVNULL, check=True)
    start = time.perf_counter()
    subprocess.run(["cat", *paths], stdout=subprocess.DEVNULL, check=True)
    return sum(os.path.getsize(p) for p in paths) / (time.perf_counter() - start) / 1e6


def _data_files(lib: str, folder: str) -> list[str]:
    return {**ADAPTERS, **EXTRA}[lib].files(folder)


def _rates(r: dict, size: int) -> dict:
    if r.get("status") != "ok":
        return {}
    out = {"whole": r["count"] / r["elapsed_s"], "first_batch_s": r["first_batch_s"]}
    if r.get("steady_s"):
        out["steady"] = r["steady_count"] / r["steady_s"]
    out["whole_mb_s"] = out["whole"] * size / 1e6
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.strip().split("\n\n")[0]
    parser.add_argument("--out", default="bench-results", help="folder for the results (default: %(default)s)")
    parser.add_argument("--libraries", default=",".join(LIBRARIES), help="comma-separated subset of: "
                        + ", ".join(LIBRARIES))
    parser.add_argument("--sizes", default=",".join(SIZES), help="2KiB, 100KiB or both (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help=f"small datasets ({QUICK_COUNTS['2KiB']} x 2 KiB, {QUICK_COUNTS['100KiB']} x 100 KiB)")
    parser.add_argument("--samples-2k", type=int, default=None, help=f"default {COUNTS['2KiB']}")
    parser.add_argument("--samples-100k", type=int, default=None, help=f"default {COUNTS['100KiB']}")
    parser.add_argument("--workers", default="0,2", help="comma-separated worker counts (default: %(default)s)")
    parser.add_argument("--shuffle", default="off,on", help="off, on or off,on (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per configuration")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG plot")


def _csv(value: str, allowed, what: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise ValueError(f"--{what} {value!r}: unknown {bad or 'empty list'}; choose from {', '.join(allowed)}")
    return items


def main(args: argparse.Namespace) -> int:
    libs = _csv(args.libraries, LIBRARIES, "libraries")
    sizes = _csv(args.sizes, SIZES, "sizes")
    workers = [int(w) for w in _csv(args.workers, [str(i) for i in range(65)], "workers")]
    shuffles = [s == "on" for s in _csv(args.shuffle, ["off", "on"], "shuffle")]
    counts = dict(QUICK_COUNTS if args.quick else COUNTS)
    for s, given in (("2KiB", args.samples_2k), ("100KiB", args.samples_100k)):
        if given is not None:
            counts[s] = given
    for s in sizes:
        if counts[s] < 1:
            raise ValueError(f"--samples-{s[:-3].lower()} must be >= 1, got {counts[s]}")
    out = os.path.abspath(args.out)
    data = os.path.join(out, "data")
    os.makedirs(data, exist_ok=True)
    report = {"versions": _versions(), "batch_size": args.batch_size, "counts": {s: counts[s] for s in sizes},
              "rows": [], "cat_mb_s": {}, "written": {}}
    jobs = [(lib, s) for s in sizes for lib in libs]
    started = time.perf_counter()
    for lib, s in tqdm(jobs, desc="write", unit="dataset", disable=not show_progress()):
        folder = os.path.join(data, f"{lib}-{s}-{counts[s]}-v{GENERATOR_VERSION}")
        if not os.path.isdir(folder):
            os.makedirs(folder)  # webdataset's ShardWriter does not make it
            r = run_child({"mode": "write", "library": lib, "folder": folder, "count": counts[s],
                           "size": SIZES[s]}, args.timeout)
            if r.get("status") != "ok":
                subprocess.run(["rm", "-rf", folder])
            report["written"][f"{lib}-{s}"] = r.get("status")
        else:
            report["written"][f"{lib}-{s}"] = "ok"
    for s in sizes:
        if report["written"].get(f"shardfeed-{s}") == "ok":
            report["cat_mb_s"][s] = _cat_mb_s(_data_files("shardfeed", os.path.join(
                data, f"shardfeed-{s}-{counts[s]}-v{GENERATOR_VERSION}")))
    configs = [(s, w, sh, lib) for s in sizes for w in workers for sh in shuffles for lib in libs]
    for s, w, sh, lib in tqdm(configs, desc="read", unit="pass", disable=not show_progress()):
        folder = os.path.join(data, f"{lib}-{s}-{counts[s]}-v{GENERATOR_VERSION}")
        status = report["written"].get(f"{lib}-{s}")
        if status != "ok":
            r = {"status": status or "not written"}
        else:
            spec = SampleSpec(counts[s], SIZES[s])
            r = run_child({"mode": "read", "library": lib, "folder": folder, "count": counts[s], "size": SIZES[s],
                           "workers": w, "shuffle": sh, "batch_size": args.batch_size,
                           "expected": spec.expected()}, args.timeout)
        report["rows"].append({"size": s, "workers": w, "shuffle": sh, "library": lib, "status": r.get("status"),
                               **_rates(r, SIZES[s])})
    report["elapsed_s"] = time.perf_counter() - started
    report["targets"] = targets(report)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "bench_compare.json"), "w") as f:
        json.dump(report, f, indent=1)
    md = render(report)
    with open(os.path.join(out, "bench_compare.md"), "w") as f:
        f.write(md)
    written = ["bench_compare.md", "bench_compare.json"]
    if not args.no_plot:
        plot(report, os.path.join(out, "bench_compare.png"))
        written.append("bench_compare.png")
    print(md)
    print(f"bench compare: {len(report['rows'])} passes in {report['elapsed_s']:.0f} s; wrote "
          + ", ".join(os.path.join(out, w) for w in written))
    return 0


# --- report -------------------------------------------------------------------------------

def _row(report, **want):
    for r in report["rows"]:
        if all(r.get(k) == v for k, v in want.items()):
            return r
    return None


def _best_peer(report, key, **want):
    rows = [r for r in report["rows"] if r.get(key) and all(r.get(k) == v for k, v in want.items())
            and not r["library"].startswith("shardfeed")]
    return max(rows, key=lambda r: r[key]) if rows else None


def targets(report: dict) -> list[dict]:
    """The issue's targets, each met or missed with the figures, from this run only."""
    out = []

    def judge(name, got, want, detail):
        out.append({"target": name, "met": None if got is None else got >= want,
                    "detail": detail if got is not None else "not measured in this run"})

    for w in sorted({r["workers"] for r in report["rows"]}):
        for sh in sorted({r["shuffle"] for r in report["rows"]}):
            for key in ("whole", "steady"):
                sf = _row(report, size="2KiB", workers=w, shuffle=sh, library="shardfeed")
                peer = _best_peer(report, key, size="2KiB", workers=w, shuffle=sh)
                got = sf.get(key) / peer[key] if sf and sf.get(key) and peer else None
                judge(f"2 KiB {key}, {w} workers, shuffle {'on' if sh else 'off'}: >= 2x the fastest peer", got, 2,
                      f"{got:.2f}x ({sf.get(key):,.0f} vs {peer['library']} {peer[key]:,.0f}/s)" if got else "")
    sf = _row(report, size="2KiB", workers=0, shuffle=False, library="shardfeed")
    got = sf.get("steady") if sf else None
    judge("2 KiB steady, stored order, 0 workers: >= 1,000,000/s", got, 1e6, f"{got:,.0f}/s" if got else "")
    for w in sorted({r["workers"] for r in report["rows"]}):
        sf = _row(report, size="100KiB", workers=w, shuffle=False, library="shardfeed")
        cat = report["cat_mb_s"].get("100KiB")
        for key in ("whole", "steady"):
            mb_s = sf[key] * SIZES["100KiB"] / 1e6 if sf and sf.get(key) else None
            got = mb_s / cat if mb_s and cat else None
            judge(f"100 KiB {key}, {w} workers: >= 50% of cat", got, 0.5,
                  f"{got:.0%} ({mb_s:,.0f} of {cat:,.0f} MB/s)" if got else "")
        peer = _best_peer(report, "whole", size="100KiB", workers=w, shuffle=False)
        got = sf["whole"] / peer["whole"] if sf and sf.get("whole") and peer else None
        judge(f"100 KiB, {w} workers: >= 2x the fastest peer", got, 2,
              f"{got:.2f}x (vs {peer['library']})" if got else "")
    sf = _row(report, size="2KiB", workers=0, shuffle=False, library="shardfeed")
    got = sf.get("first_batch_s") if sf else None
    out.append({"target": "first batch (construction included), 0 workers: < 0.1 s",
                "met": None if got is None else got < 0.1, "detail": f"{got:.3f} s" if got else "not measured"})
    for w in sorted({r["workers"] for r in report["rows"]}):
        pq = _row(report, size="2KiB", workers=w, shuffle=True, library="shardfeed-parquet")
        tar = _row(report, size="2KiB", workers=w, shuffle=True, library="shardfeed")
        got = pq["whole"] / tar["whole"] if pq and tar and pq.get("whole") and tar.get("whole") else None
        judge(f"Parquet global within 2x of tar global, {w} workers (whole pass)", got, 0.5,
              f"{got:.2f}x ({pq['whole']:,.0f} vs {tar['whole']:,.0f}/s)" if got else "")
    return out


def _fmt(v, spec=",.0f"):
    return "–" if v is None else format(v, spec)


def render(report: dict) -> str:
    lines = ["| size | workers | shuffle | library | whole pass /s | steady /s | first batch s | status |",
             "|---|--:|---|---|--:|--:|--:|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['size']} | {r['workers']} | {'on' if r['shuffle'] else 'off'} | {r['library']} | "
                     f"{_fmt(r.get('whole'))} | {_fmt(r.get('steady'))} | {_fmt(r.get('first_batch_s'), '.3f')} | "
                     f"{r['status']} |")
    lines += ["", "`cat` (page cache warm): " + ", ".join(f"{s} {v:,.0f} MB/s" for s, v in report["cat_mb_s"].items()),
              "", "| target | met | figures |", "|---|---|---|"]
    for t in report["targets"]:
        met = {True: "met", False: "missed", None: "not judged"}[t["met"]]
        lines.append(f"| {t['target']} | {met} | {t['detail']} |")
    lines += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items())]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = sorted({(r["size"], r["workers"]) for r in report["rows"]})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4), squeeze=False)
    for ax, (s, w) in zip(axes[0], panels):
        rows = [r for r in report["rows"] if r["size"] == s and r["workers"] == w and r.get("whole")]
        labels = [f"{r['library']}\n{'shuf' if r['shuffle'] else 'stored'}" for r in rows]
        ax.barh(labels, [r["whole"] for r in rows], color=["C0" if r["library"].startswith("shardfeed") else "C7"
                                                         for r in rows])
        ax.set_title(f"{s}, {w} workers: whole pass")
        ax.set_xlabel("samples/s (construction included)")
        ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
