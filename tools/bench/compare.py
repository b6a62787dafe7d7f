"""`shardfeed bench compare`: shardfeed beside its peers in one run: throughput,
first batch, shuffle quality and the reference trainer.

Each library writes the same deterministic samples (samples.py) with its own
writer and reads them through its usual PyTorch path (the adapters of
the registry, peers.py), each configuration in a fresh process,
content-checked (a wrong pass is FAILED, never a number). Four parts:

1. Throughput per configuration (size x workers x shuffle x library): the
   **whole pass** (construction of the dataset and loader included: what a
   short evaluation loop or a notebook sees), the **steady** rate after the
   first batch, and the **first batch** latency; `cat` of the shards (page
   cache warm) gives the read limit. shardfeed appears three times: its
   default (payloads copied into ``bytes``), ``bytes_as="tensor"`` (views,
   no copy) and over Parquet.
2. Shuffle quality of each library's default shuffle on class-ordered data
   (compare_quality.py).
3. The reference trainer's steps/s and data stall fed by each loader
   (compare_train.py).
4. The issue's targets, judged from the same run (compare_report.py).

MosaicML Streaming runs in its own venv (see peers.py); a peer that
cannot be imported is reported as skipped with the reason, never faked.
Writes bench_compare.md, bench_compare.json and bench_compare*.png under --out.
The full run takes about 10 minutes on 2 cores; --quick about 2.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from tqdm import tqdm

from shardfeed.tools.bench import compare_quality, compare_report, compare_train, fresh, results
from shardfeed.tools.bench.peers import adapter, peers_python, python_for
from shardfeed.tools.bench.report import csv_choices, too_small, versions
from shardfeed.tools.bench.samples import GENERATOR_VERSION, SampleSpec
from shardfeed.tools.text import show_progress

SIZES = {"2KiB": 2048, "100KiB": 100 * 1024}
COUNTS = {"2KiB": 32768, "100KiB": 2048}  # 64 MiB and 200 MiB
QUICK_COUNTS = {"2KiB": 4096, "100KiB": 512}
# Passes per configuration: one pass on a shared 2-core machine moved some rows by up to 2.5x between runs; the
# passes go round all configurations in turn (load drifting during the run hits every library alike), and the
# median of each configuration's passes is its figure.
REPEAT = 3
LIBRARIES = ("shardfeed", "shardfeed-tensor", "shardfeed-parquet", "webdataset", "litdata", "streaming", "files",
             "parquet", "parquet-1k")
# shardfeed's variants deliver the order of its own `global` row: their shuffle quality is that row's.
SAME_ORDER = {"shardfeed-tensor", "shardfeed-parquet"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.strip().split("\n\n")[0]
    parser.add_argument("--out", default="bench-results", help="folder for the results (default: %(default)s)")
    parser.add_argument("--libraries", default=",".join(LIBRARIES), help="comma-separated subset of: "
                        + ", ".join(LIBRARIES))
    parser.add_argument("--sizes", default=None, help="2KiB, 100KiB or both (default: both; 2KiB with --quick)")
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke test: {QUICK_COUNTS['2KiB']} x 2 KiB only, 0 workers, small class-ordered data, "
                             f"{compare_train.QUICK_STEPS} trainer steps")
    parser.add_argument("--samples-2k", type=int, default=None, help=f"default {COUNTS['2KiB']}")
    parser.add_argument("--samples-100k", type=int, default=None, help=f"default {COUNTS['100KiB']}")
    parser.add_argument("--workers", default=None, help="comma-separated worker counts (default: 0,2; 0 with --quick)")
    parser.add_argument("--shuffle", default="off,on", help="off, on or off,on (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--no-quality", action="store_true", help="skip the shuffle-quality part")
    parser.add_argument("--quality-classes", type=int, default=None,
                        help=f"classes of the class-ordered data (default {compare_quality.FULL['classes']})")
    parser.add_argument("--quality-per-class", type=int, default=None,
                        help=f"samples per class (default {compare_quality.FULL['per_class']})")
    parser.add_argument("--train-steps", type=int, default=None,
                        help=f"reference trainer steps per library, 0 to skip (default {compare_train.STEPS})")
    parser.add_argument("--train-workers", type=int, default=0, help="loader workers feeding the trainer (default 0)")
    parser.add_argument("--peers-python", default=None,
                        help="python of the venv that runs MosaicML Streaming (default: .venv-peers of this checkout, "
                             "made by tools/bench/install_peers.sh)")
    parser.add_argument("--repeat", type=int, default=None,
                        help=f"passes per throughput configuration, interleaved, median reported (default {REPEAT}; "
                             "1 with --quick)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per configuration")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG plots")


def _cat_mb_s(paths: list[str]) -> float:
    """`cat` of the files to /dev/null, page cache warm (read once first), MB/s."""
    subprocess.run(["cat", *paths], stdout=subprocess.DEVNULL, check=True)
    start = time.perf_counter()
    subprocess.run(["cat", *paths], stdout=subprocess.DEVNULL, check=True)
    return sum(os.path.getsize(p) for p in paths) / (time.perf_counter() - start) / 1e6


def _rates(r: dict) -> dict:
    if r.get("status") != "ok":
        return {}
    out = {"whole": r["count"] / r["elapsed_s"], "first_batch_s": r["first_batch_s"], "batches": r["batches"]}
    if r.get("fresh_s"):  # the pass from a fresh interpreter: its start and every import included
        out.update(fresh=r["count"] / r["fresh_s"], fresh_s=r["fresh_s"], import_s=r["import_s"])
    if r.get("steady_s") and not too_small(r["batches"]):
        out["steady"] = r["steady_count"] / r["steady_s"]
    return out


class Run:
    """One run's settings, data folders and child processes."""

    def __init__(self, args):
        self.libs = csv_choices(args.libraries, LIBRARIES, "libraries")
        self.sizes = csv_choices(args.sizes or ("2KiB" if args.quick else ",".join(SIZES)), SIZES, "sizes")
        workers = args.workers or ("0" if args.quick else "0,2")
        self.workers = [int(w) for w in csv_choices(workers, [str(i) for i in range(65)], "workers")]
        self.shuffles = [s == "on" for s in csv_choices(args.shuffle, ["off", "on"], "shuffle")]
        self.counts = dict(QUICK_COUNTS if args.quick else COUNTS)
        for s, given in (("2KiB", args.samples_2k), ("100KiB", args.samples_100k)):
            if given is not None:
                self.counts[s] = given
        for s in self.sizes:
            if self.counts[s] < 1:
                raise ValueError(f"--samples-{s[:-3].lower()} must be >= 1, got {self.counts[s]}")
        q = dict(compare_quality.QUICK if args.quick else compare_quality.FULL)
        q["classes"] = args.quality_classes or q["classes"]
        q["per_class"] = args.quality_per_class or q["per_class"]
        self.quality = None if args.no_quality else q
        self.repeat = args.repeat if args.repeat is not None else (1 if args.quick else REPEAT)
        if self.repeat < 1:
            raise ValueError(f"--repeat must be >= 1, got {self.repeat}")
        self.steps = args.train_steps if args.train_steps is not None else (
            compare_train.QUICK_STEPS if args.quick else compare_train.STEPS)
        if self.steps < 0 or args.train_workers < 0 or args.batch_size < 1:
            raise ValueError("--train-steps and --train-workers must be >= 0 and --batch-size >= 1")
        self.args = args
        self.peers_py = peers_python(args.peers_python)
        self.data = os.path.join(os.path.abspath(args.out), "data")
        os.makedirs(self.data, exist_ok=True)
        self.written: dict[str, str] = {}

    def child(self, lib: str, job: dict) -> dict:
        """The job (child.py) in a fresh process under the library's interpreter, with its wall time."""
        start = time.perf_counter()
        python = python_for(lib, self.peers_py)
        job = {"library": lib, **job}
        if job["mode"] in ("read", "noop"):
            job["spawned_at"] = time.time()  # the child's fresh_s counts from here
        r = fresh.run("shardfeed.tools.bench.child:run", job, timeout=self.args.timeout, python=python,
                      by_path=False, who="the configuration's process (--timeout)")
        if r.get("status", "").startswith("skipped") and adapter(lib).venv and python == sys.executable:
            r["status"] += "; run tools/bench/install_peers.sh to give it its own venv (.venv-peers)"
        return {**r, "wall_s": time.perf_counter() - start}

    def folder(self, lib: str, tag: str) -> str:
        return os.path.join(self.data, f"{adapter(lib).data_name}-{tag}-v{GENERATOR_VERSION}")

    def write(self, datasets: list[tuple[str, dict, set]]) -> None:
        """Writes the missing datasets ((tag, job fields, libraries that read it) each), one process
        per library; written data stays under --out/data for the next run."""
        for lib in _bar(list(dict.fromkeys(adapter(lib).data_name for lib in self.libs)), "write"):
            jobs = []
            for tag, fields, readers in datasets:
                if lib not in {adapter(r).data_name for r in readers}:
                    continue
                folder = self.folder(lib, tag)
                if os.path.isdir(folder):
                    self.written[folder] = "ok"
                elif folder not in self.written:
                    os.makedirs(folder)  # webdataset's ShardWriter does not make it
                    jobs.append({"mode": "write", "library": lib, "folder": folder, **fields})
            if not jobs:
                continue
            r = self.child(lib, {"mode": "write_all", "jobs": jobs})
            results = r.get("results") or [r] * len(jobs)
            for job, done in zip(jobs, results):
                self.written[job["folder"]] = done.get("status") or "no status"
                if self.written[job["folder"]] != "ok":
                    subprocess.run(["rm", "-rf", job["folder"]])

    def ensure(self, lib: str, tag: str, fields: dict) -> str:
        """The status of the library's data (written by ``write``, or now)."""
        folder = self.folder(lib, tag)
        if folder not in self.written:
            self.write_one(lib, tag, fields)
        return self.written[folder]

    def write_one(self, lib: str, tag: str, fields: dict) -> None:
        libs, self.libs = self.libs, [lib]
        try:
            self.write([(tag, fields, {lib})])
        finally:
            self.libs = libs

    def read(self, lib: str, tag: str, fields: dict, spec, **job) -> dict:
        status = self.ensure(lib, tag, fields)
        if status != "ok":
            return {"status": status}
        return self.child(lib, {"mode": "read", "folder": self.folder(lib, tag), **fields,
                                "batch_size": self.args.batch_size, "expected": spec.expected(), **job})


def _bar(items, desc):
    return tqdm(items, desc=desc, unit="pass", disable=not show_progress())


def throughput(run: Run, report: dict) -> None:
    for s in run.sizes:
        tag = f"{s}-{run.counts[s]}"
        if any(adapter(lib).data_name == "shardfeed" for lib in run.libs) and \
                run.ensure("shardfeed", tag, {"count": run.counts[s], "size": SIZES[s]}) == "ok":
            report["cat_mb_s"][s] = _cat_mb_s(adapter("shardfeed").files(run.folder("shardfeed", tag)))
    # 100 KiB in stored order only (where asked): its targets are about bandwidth, and it halves the passes
    configs = [(s, w, sh, lib) for s in run.sizes for w in run.workers
               for sh in (run.shuffles if s == "2KiB" or False not in run.shuffles else [False]) for lib in run.libs]
    passes: dict = {c: [] for c in configs}
    # What a fresh interpreter with the harness's imports (numpy, xxhash: every library's pass has them) costs
    # before any library is imported: the floor of the fresh-process figures.
    base = [run.child("shardfeed", {"mode": "noop"}) for _ in range(run.repeat)]
    if all(b.get("status") == "ok" for b in base):
        report["harness_start_s"] = statistics.median(b["fresh_s"] for b in base)
    for _, (s, w, sh, lib) in _bar([(k, c) for k in range(run.repeat) for c in configs], "read"):
        r = run.read(lib, f"{s}-{run.counts[s]}", {"count": run.counts[s], "size": SIZES[s]},
                     SampleSpec(run.counts[s], SIZES[s]), workers=w, shuffle=sh)
        passes[(s, w, sh, lib)].append(r)
    for (s, w, sh, lib), rs in passes.items():
        report["rows"].append({"size": s, "workers": w, "shuffle": sh, "library": lib, "label": adapter(lib).label,
                               "bytes_per_sample": SIZES[s], **_median(rs)})


def _median(rs: list[dict]) -> dict:
    """One configuration's row from its passes: the median of each rate over the passes (all must be ok: a
    failed or wrong pass makes the row that status), each pass's rates kept under ``passes``."""
    bad = next((r for r in rs if r.get("status") != "ok"), None)
    if bad is not None:
        return {"status": bad.get("status"), "wall_s": bad.get("wall_s")}
    rates = [_rates(r) for r in rs]
    row = {"status": "ok", "wall_s": sum(r.get("wall_s") or 0 for r in rs), "passes": rates}
    for k in ("whole", "steady", "first_batch_s", "batches", "fresh", "fresh_s", "import_s"):
        vals = [x[k] for x in rates if k in x]
        if len(vals) == len(rates):
            row[k] = statistics.median(vals)
    return row


def quality_tag(q: dict) -> str:
    return f"classes{q['classes']}x{q['per_class']}-{q['per_shard']}"


def quality(run: Run, report: dict) -> None:
    q = run.quality
    fields = compare_quality.job_fields(q)
    spec = compare_quality.spec_for(q)
    tag = quality_tag(q)
    rows = [(lib, True) for lib in run.libs if lib not in SAME_ORDER]
    if "shardfeed" in run.libs:
        rows.insert(0, ("shardfeed", False))  # stored order: the baseline
    out = {**q, "ideal": compare_quality.ideal(spec, run.args.batch_size), "rows": []}
    for lib, sh in _bar(rows, "shuffle quality"):
        r = run.read(lib, tag, fields, spec, workers=0, shuffle=sh, record=True)
        row = {"library": lib, "label": adapter(lib).label, "status": r.get("status"),
               "setting": compare_report.shuffle_setting(lib, sh)}
        if r.get("status") == "ok":
            row.update(compare_quality.measure(r["order"], r["batch_sizes"], spec, run.args.batch_size))
        out["rows"].append(row)
    report["quality"] = out


def train(run: Run, report: dict) -> None:
    count = run.counts["2KiB"]
    fields = {"count": count, "size": SIZES["2KiB"]}
    out = {"steps": run.steps, "workers": run.args.train_workers, "image": compare_train.IMAGE, "rows": [],
           "classes": 1000}
    for lib in _bar(run.libs, "trainer"):
        status = run.ensure(lib, f"2KiB-{count}", fields)
        r = {"status": status} if status != "ok" else run.child(lib, {
            "mode": "train", "folder": run.folder(lib, f"2KiB-{count}"), **fields, "workers": run.args.train_workers,
            "shuffle": True, "batch_size": run.args.batch_size, "steps": run.steps})
        out["rows"].append({"library": lib, "label": adapter(lib).label, **r})
    report["train"] = out


def _machine() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{os.cpu_count()} cores, 1-min load {load:.1f} at the start"


def main(args: argparse.Namespace) -> int:
    from shardfeed.tools.warm import compile_bytecode

    # every pass is a fresh process: without bytecode caches (PYTHONDONTWRITEBYTECODE, a module edited since
    # its cache was written) each one compiled shardfeed's stale modules inside its timed pass (batcher.py:
    # 4-6 ms of a 60-100 ms pass), while the peers' site-packages had pip's caches
    compile_bytecode()
    run = Run(args)
    out = os.path.abspath(args.out)
    report = {"command": "shardfeed bench compare " + " ".join(sys.argv[3:]) if sys.argv[1:3] == ["bench", "compare"]
              else None, "machine": _machine(), "versions": versions(), "peers_python": compare_report.shown_path(run.peers_py),
              "peers_versions": versions(python_for("streaming", run.peers_py)) if "streaming" in run.libs
              and run.peers_py else None, "batch_size": args.batch_size, "repeat": run.repeat,
              "counts": {s: run.counts[s] for s in run.sizes}, "rows": [], "cat_mb_s": {},
              "configurations": {lib: (adapter(lib).label, adapter(lib).CONFIG) for lib in run.libs}}
    started = time.perf_counter()
    libs = set(run.libs)
    datasets = [(f"{s}-{run.counts[s]}", {"count": run.counts[s], "size": SIZES[s]}, libs) for s in run.sizes]
    if run.steps and "2KiB" not in run.sizes:
        datasets.append((f"2KiB-{run.counts['2KiB']}", {"count": run.counts["2KiB"], "size": SIZES["2KiB"]}, libs))
    if run.quality:
        datasets.append((quality_tag(run.quality), compare_quality.job_fields(run.quality), libs - SAME_ORDER))
    run.write(datasets)
    throughput(run, report)
    if run.quality:
        quality(run, report)
    if run.steps:
        train(run, report)
    report["elapsed_s"] = time.perf_counter() - started
    report["targets"] = compare_report.targets(report)
    md = compare_report.render(report)
    written = results.write(out, {"bench_compare.md": "# shardfeed bench compare\n\n" + md,
                                  "bench_compare.json": report})
    if not args.no_plot:
        from shardfeed.tools.bench import compare_plots
        written += compare_plots.write_all(report, out)
    print(md)
    print(f"bench compare: {len(report['rows'])} passes in {report['elapsed_s']:.0f} s; wrote " + ", ".join(written))
    return 0
