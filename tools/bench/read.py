"""`shardfeed bench read`: read throughput of shardfeed and its peers, side by side in one run.

Every library writes the same deterministic samples (2 KiB and 100 KiB
payloads) with its own writer, then reads them through its usual PyTorch
path with 0 and 2 workers, shuffle off and on. Each configuration runs in a
fresh process (child.py through fresh.py), its whole process tree's RSS sampled from
here; every pass is content-checked and a pass with wrong content is
reported FAILED, never as a number. `cat` of the shards, page cache warm,
gives the machine's read limit in the same run. shardfeed is also read at a
larger dataset size to show whether its memory grows with the dataset.
A pass of fewer than MIN_BATCHES batches has no steady state to measure:
its row says "too small: N batches", with no rate, and no target is judged
on it (the --quick sizes are chosen to give every pass enough batches).

Writes bench_read.md, bench_read.json and bench_read.png under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from tqdm import tqdm

from shardfeed.tools.bench import fresh
from shardfeed.tools.bench.peers import ADAPTERS
from shardfeed.tools.bench.report import MIN_BATCHES, csv_choices, too_small
from shardfeed.tools.bench.samples import GENERATOR_VERSION, SampleSpec
from shardfeed.tools.text import show_progress

SIZES = {"2KiB": 2048, "100KiB": 100 * 1024}
# Default dataset sizes: about 128 MiB and 400 MiB of payload, so the whole
# run (writing included) stays near 10 minutes on 2 cores.
DEFAULT_COUNTS = {"2KiB": 65536, "100KiB": 4096}
# Quick: about 16 MiB and 200 MiB, the fewest samples that still give every
# pass a steady state (32 and 8 batches of 256); with a larger --batch-size
# they grow to MIN_BATCHES batches. One batch of 100 KiB samples (as before)
# measured start-up and judged targets on it.
QUICK_COUNTS = {"2KiB": 8192, "100KiB": 2048}
MANIFEST = "bench-manifest.json"
# the libraries of this interpreter (Streaming and shardfeed's Parquet and no-copy variants are `bench compare`'s)
LIBRARIES = ("shardfeed", "shardfeed-mmap", "webdataset", "litdata", "files", "parquet", "parquet-1k")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="bench-results", help="folder for the results (default: %(default)s)")
    parser.add_argument("--data", default=None,
                        help="folder for the benchmark datasets, reused when valid (default: OUT/data)")
    parser.add_argument("--quick", action="store_true",
                        help=f"small datasets ({QUICK_COUNTS['2KiB']} x 2 KiB, {QUICK_COUNTS['100KiB']} x 100 KiB, "
                             f"at least {MIN_BATCHES} batches each)")
    parser.add_argument("--samples-2k", type=int, default=None, help="number of 2 KiB samples")
    parser.add_argument("--samples-100k", type=int, default=None, help="number of 100 KiB samples")
    parser.add_argument("--sizes", default=",".join(SIZES),
                        help="comma-separated sample sizes to measure (default: %(default)s)")
    parser.add_argument("--libraries", default=",".join(LIBRARIES),
                        help="comma-separated subset of: " + ", ".join(LIBRARIES))
    parser.add_argument("--workers", default="0,2", help="comma-separated worker counts (default: %(default)s)")
    parser.add_argument("--shuffle", default="off,on", help="off, on or off,on (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--growth", type=int, default=4,
                        help="also read shardfeed's 2 KiB data at this many times the samples, "
                             "to show RSS against dataset size; 0 or 1 turns it off (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="passes per configuration, each in a fresh process; the median is kept")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds before one configuration is stopped and reported as an error")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG plot")


def _positive(value, what: str) -> int:
    if value is None or value < 1:
        raise ValueError(f"{what} must be >= 1, got {value}")
    return int(value)


class Plan:
    """What one run measures, checked up front so a typo fails in a second, not after minutes."""

    def __init__(self, args):
        self.out = os.path.abspath(args.out)
        self.data = os.path.abspath(args.data or os.path.join(args.out, "data"))
        self.batch_size = _positive(args.batch_size, "--batch-size")
        counts = dict(DEFAULT_COUNTS)
        if args.quick:
            counts = {s: max(n, MIN_BATCHES * self.batch_size) for s, n in QUICK_COUNTS.items()}
        if args.samples_2k is not None:
            counts["2KiB"] = _positive(args.samples_2k, "--samples-2k")
        if args.samples_100k is not None:
            counts["100KiB"] = _positive(args.samples_100k, "--samples-100k")
        self.counts = counts
        self.sizes = [s for s in SIZES if s in csv_choices(args.sizes, list(SIZES), "sizes")]
        self.libraries = csv_choices(args.libraries, LIBRARIES, "libraries")
        self.workers = [int(w) for w in csv_choices(args.workers, [str(i) for i in range(65)], "workers")]
        self.shuffles = [s == "on" for s in csv_choices(args.shuffle, ["off", "on"], "shuffle")]
        self.repeats = _positive(args.repeats, "--repeats")
        if args.growth < 0:
            raise ValueError(f"--growth must be >= 0 (0 turns it off), got {args.growth}")
        self.growth = args.growth if args.growth > 1 and "shardfeed" in self.libraries else 0
        # Growth is measured on the smallest samples: there per-sample metadata
        # (index, offsets, shuffle state) is largest next to the payload.
        self.growth_size = self.sizes[0]
        self.timeout = args.timeout
        self.plot = not args.no_plot

    def batches(self, count: int) -> int:
        return -(-count // self.batch_size)

    def notes(self) -> list[str]:
        """Sizes whose passes are too short to measure, said before minutes are spent on them."""
        return [f"{size}: {self.counts[size]:,} samples at batch {self.batch_size} is "
                f"{too_small(self.batches(self.counts[size]))} (< {MIN_BATCHES}): reported, no rate, no target judged"
                for size in self.sizes if too_small(self.batches(self.counts[size]))]

    def datasets(self):
        """(library, size name, count) for every dataset the run reads."""
        for size in self.sizes:
            for lib in self.libraries:
                yield lib, size, self.counts[size]
        if self.growth:
            yield "shardfeed", self.growth_size, self.counts[self.growth_size] * self.growth

    def folder(self, lib: str, size: str, count: int) -> str:
        # Variants of one library's reader (shardfeed-mmap) read that library's data.
        return os.path.join(self.data, f"{ADAPTERS[lib].data_name}-{size}-{count}")


# --- datasets -------------------------------------------------------------------------

def _listing(adapter, folder: str) -> dict:
    files = adapter.files(folder)
    return {"files": len(files), "bytes": sum(os.path.getsize(f) for f in files)}


def expected_for(plan: Plan, size: str, count: int) -> dict:
    """The digest a correct pass adds up to, cached beside the data."""
    path = os.path.join(plan.data, f"expected-{size}-{count}-v{GENERATOR_VERSION}.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    expected = SampleSpec(count, SIZES[size]).expected()
    os.makedirs(plan.data, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(expected, f)
    os.replace(path + ".tmp", path)
    return expected


def run_pass(job: dict, timeout: float) -> dict:
    """One job of child.py in a fresh process, the RSS of its whole process tree sampled."""
    return fresh.run("shardfeed.tools.bench.child:run", job, timeout=timeout, rss=True,
                     who="the configuration's process (--timeout)")


def ensure_dataset(plan: Plan, lib: str, size: str, count: int) -> dict:
    """Writes one library's dataset unless a complete one is there; returns {"status", ...}."""
    lib = ADAPTERS[lib].data_name  # a reader variant shares its library's data
    adapter = ADAPTERS[lib]
    folder = plan.folder(lib, size, count)
    want = {"generator": GENERATOR_VERSION, "library": lib, "size": SIZES[size], "count": count}
    manifest_path = os.path.join(folder, MANIFEST)
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f)
        if {k: manifest.get(k) for k in want} == want and manifest.get("listing") == _listing(adapter, folder):
            return {"status": "ok", "reused": True, **manifest["listing"]}
    tmp = folder + ".writing"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(tmp)
    result = run_pass({"mode": "write", "library": lib, "folder": tmp, "count": count, "size": SIZES[size]},
                      plan.timeout)
    if result.get("status") != "ok":
        shutil.rmtree(tmp, ignore_errors=True)
        return result
    os.replace(tmp, folder)
    listing = _listing(adapter, folder)
    with open(manifest_path, "w") as f:
        json.dump({**want, "listing": listing, "write_s": result.get("write_s")}, f)
    return {"status": "ok", "reused": False, "write_s": result.get("write_s"), **listing}


# --- the read limit ---------------------------------------------------------------------

def read_files(paths: list[str]) -> float:
    """`cat` the files to /dev/null; seconds taken."""
    start = time.perf_counter()
    # Batches of paths keep the command line short for one-file-per-sample data.
    for i in range(0, len(paths), 2000):
        subprocess.run(["cat", *paths[i:i + 2000]], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def measure_cat(paths: list[str], repeats: int = 3) -> dict:
    total = sum(os.path.getsize(p) for p in paths)
    seconds = statistics.median(read_files(paths) for _ in range(repeats))
    return {"elapsed_s": seconds, "file_bytes": total, "mb_per_s": total / seconds / 1e6}


def measure_check(count: int, size: int, batch_size: int, limit_bytes: int = 64 << 20) -> dict:
    """Rate of the content check alone, over batches already in memory: the
    most any library can show in this harness, since every pass runs it."""
    from shardfeed.tools.bench.samples import ContentCheck
    count = max(1, min(count, limit_bytes // size))
    spec = SampleSpec(count, size)
    batches = []
    for s in range(0, count, batch_size):
        ids = range(s, min(count, s + batch_size))
        batches.append(([spec.key(i) for i in ids], [spec.payload(i) for i in ids], [spec.cls(i) for i in ids]))
    check = ContentCheck()
    start = time.perf_counter()
    for batch in batches:
        check.add(*batch)
    seconds = time.perf_counter() - start
    return {"samples_per_s": count / seconds, "mb_per_s": count * size / seconds / 1e6,
            "us_per_sample": seconds / count * 1e6}


# --- the run ----------------------------------------------------------------------------

def _median_result(results: list[dict]) -> dict:
    ok = [r for r in results if r.get("status") == "ok"]
    if len(ok) < len(results):  # any failed pass makes the configuration fail
        return next(r for r in results if r.get("status") != "ok")
    ok.sort(key=lambda r: r["elapsed_s"])
    best = dict(ok[len(ok) // 2])
    best["peak_rss_mib"] = max(r["peak_rss_mib"] for r in ok)
    best["repeats"] = len(ok)
    return best


def add_rates(row: dict, limit: dict | None, batch_size: int) -> None:
    """A content-checked pass's rates: the steady state after the first batch,
    or, for a pass too short to have one, none at all (marked too_small)."""
    row["batches"] = row.get("batches") or -(-row["count"] // batch_size)
    row["whole_pass_samples_per_s"] = row["count"] / row["elapsed_s"]
    row["first_batch_ms"] = row["first_batch_s"] * 1000
    # no steady_s: every sample came in the first batch, whatever the count of empty ones after it
    small = too_small(row["batches"]) if row.get("steady_s") else too_small(1)
    if small:
        row["too_small"] = small
        return
    row["samples_per_s"] = row["steady_count"] / row["steady_s"]
    row["mb_per_s"] = row["steady_bytes"] / row["steady_s"] / 1e6
    row["frac_cat"] = row["mb_per_s"] / limit["mb_per_s"] if limit else None


def run_plan(plan: Plan, log=print) -> dict:
    started = time.time()
    datasets = {}
    for lib, size, count in tqdm(list(plan.datasets()), desc="bench data", unit="dataset", disable=not show_progress()):
        datasets[(lib, size, count)] = ensure_dataset(plan, lib, size, count)

    # Warm the page cache for everyone, then take the read limit on shardfeed's
    # shards (or the first library that has data) in this same run.
    limits = {}
    for (lib, size, count), info in datasets.items():
        if info["status"] == "ok":
            read_files(ADAPTERS[lib].files(plan.folder(lib, size, count)))
    for size in plan.sizes:
        for lib in ["shardfeed"] + [x for x in plan.libraries if x != "shardfeed"]:
            key = (lib, size, plan.counts[size])
            if key in datasets and datasets[key]["status"] == "ok":
                limit = measure_cat(ADAPTERS[lib].files(plan.folder(*key)))
                limits[size] = {"library": lib, "samples_per_s": key[2] / limit["elapsed_s"], **limit}
                break

    # Libraries compared with each other run next to each other in time, so a
    # change in the machine's load touches a comparison as little as it can.
    checks = {size: measure_check(plan.counts[size], SIZES[size], plan.batch_size) for size in plan.sizes}

    jobs = []
    for size in plan.sizes:
        for workers in plan.workers:
            for shuffle in plan.shuffles:
                for lib in plan.libraries:
                    jobs.append((lib, size, plan.counts[size], workers, shuffle, "main"))
    if plan.growth:
        for workers in plan.workers:
            jobs.append(("shardfeed", plan.growth_size, plan.counts[plan.growth_size] * plan.growth, workers, True,
                         "growth"))

    rows = []
    expected = {}
    for lib, size, count, workers, shuffle, role in tqdm(jobs, desc="bench read", unit="config", disable=not show_progress()):
        info = datasets[(lib, size, count)]
        row = {"library": lib, "label": ADAPTERS[lib].label, "peer": ADAPTERS[lib].peer, "size": size,
               "count": count, "workers": workers, "shuffle": shuffle, "role": role}
        if info["status"] != "ok":
            row["status"] = info["status"] if info["status"].startswith("skipped") else \
                f"error: writing failed ({info['status']})"
        else:
            if (size, count) not in expected:
                expected[(size, count)] = expected_for(plan, size, count)
            job = {"mode": "read", "library": lib, "folder": plan.folder(lib, size, count), "count": count,
                   "size": SIZES[size], "workers": workers, "shuffle": shuffle,
                   "batch_size": plan.batch_size, "expected": expected[(size, count)]}
            row.update(_median_result([run_pass(job, plan.timeout) for _ in range(plan.repeats)]))
        if row["status"] == "ok":
            add_rates(row, limits.get(size), plan.batch_size)
        rows.append(row)

    return {"rows": rows, "limits": limits, "checks": checks, "datasets": {f"{k[0]}-{k[1]}-{k[2]}": v for k, v in datasets.items()},
            "counts": {s: plan.counts[s] for s in plan.sizes}, "batch_size": plan.batch_size,
            "min_batches": MIN_BATCHES, "repeats": plan.repeats,
            "growth": plan.growth, "elapsed_s": time.time() - started, "machine": _machine()}


def _machine() -> dict:
    import platform
    versions = {}
    for name in ("torch", "webdataset", "litdata", "pyarrow", "numpy"):
        try:
            from importlib.metadata import version
            versions[name] = version(name)
        except Exception:
            versions[name] = None
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "versions": versions}


def main(args) -> int:
    from shardfeed.tools.bench.report import render, write_reports
    try:
        plan = Plan(args)
    except ValueError as e:
        print(f"shardfeed bench read: {e}", file=sys.stderr)
        return 2
    for note in plan.notes():
        print(f"shardfeed bench read: note: {note}", file=sys.stderr)
    report = run_plan(plan)
    paths = write_reports(report, plan.out, plot=plan.plot)
    print(render(report))
    rows = report["rows"]
    ok = sum(r["status"] == "ok" for r in rows)
    failed = sum(r["status"].startswith("FAILED") for r in rows)
    small = sum(r["status"] == "ok" and bool(r.get("too_small")) for r in rows)
    print(f"bench read: {len(rows)} configurations, {ok} ok ({small} too small to measure), "
          f"{failed} FAILED content checks, "
          f"{len(rows) - ok - failed} skipped or errors, in {report['elapsed_s']:.0f} s; "
          f"wrote {', '.join(paths)}")
    return 1 if failed else 0
