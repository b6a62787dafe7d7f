"""Tables and targets of `shardfeed bench compare`, from one run's report.

Targets (issue 13, "Must show"), each judged from this run only and within
the same worker count:

- 2 KiB, whole pass and steady: shardfeed >= 2x the fastest peer, at each
  worker count, shuffle off and on;
- 2 KiB steady, stored order, 0 workers: >= 1,000,000 samples/s;
- 100 KiB: >= 50% of `cat` and >= 2x the fastest peer, at each worker count
  (whole pass and steady, stored order), for shardfeed's default copied
  ``bytes`` and for its no-copy ``bytes_as="tensor"`` form;
- first batch of a fresh process under 0.1 s (2 KiB, every configuration);
- Parquet ``global`` within 2x of tar ``global`` (whole pass and steady).

A rate needs a steady state: a pass of fewer than MIN_BATCHES batches has
no steady rate, and a target that needs one is "not judged".
"""

from __future__ import annotations

import os

from shardfeed.tools.bench.report import MIN_BATCHES
from shardfeed.tools.bench.results import cell, table

KIB100 = 100 * 1024
RATES = {"whole": "whole pass", "steady": "steady"}


# What "shuffle on with defaults" is for each library (see the adapters in peers.py).
SHUFFLE_SETTINGS = {
    "shardfeed": 'shuffle="global" (its default order)',
    "webdataset": "shardshuffle over all shards + .shuffle(1000), as documented",
    "litdata": "StreamingDataset(shuffle=True)",
    "streaming": "StreamingDataset(shuffle=True): py1e, default block size",
    "files": "DataLoader(shuffle=True) over the files",
    "parquet": "row groups in random order, rows shuffled within each",
    "parquet-1k": "row groups in random order, rows shuffled within each",
}


def shuffle_setting(library: str, shuffle: bool) -> str:
    return SHUFFLE_SETTINGS.get(library, "shuffle=True") if shuffle else "shuffle off (stored order)"


def _on(sh: bool) -> str:
    return "on" if sh else "off"


def row(report, **want):
    for r in report["rows"]:
        if all(r.get(k) == v for k, v in want.items()):
            return r
    return None


def best_peer(report, key, **want):
    rows = [r for r in report["rows"] if r.get(key) and all(r.get(k) == v for k, v in want.items())
            and not r["library"].startswith("shardfeed")]
    return max(rows, key=lambda r: r[key]) if rows else None


def targets(report: dict) -> list[dict]:
    """[{"target", "config", "met": True/False/None, "detail"}], every target of the issue."""
    out = []

    def judge(target, config, got, want, detail, why=None, below=False):
        met = None if got is None else (got < want if below else got >= want)
        out.append({"target": target, "config": config, "met": met,
                    "detail": detail if got is not None else why or "not measured in this run"})

    def why_not(*rows_):
        for r in rows_:
            if r is None:
                return "not run"
            if r["status"] != "ok":
                return f"{r['library']}: {r['status']}"
        return f"too few batches for a steady state (< {MIN_BATCHES})"

    workers = sorted({r["workers"] for r in report["rows"]})
    shuffles = sorted({r["shuffle"] for r in report["rows"]})
    for w in workers:
        for sh in shuffles:
            for key, name in RATES.items():
                sf = row(report, size="2KiB", workers=w, shuffle=sh, library="shardfeed")
                peer = best_peer(report, key, size="2KiB", workers=w, shuffle=sh)
                got = sf[key] / peer[key] if sf and sf.get(key) and peer else None
                judge(f"2 KiB {name}: >= 2x the fastest peer", f"{w} workers, shuffle {_on(sh)}", got, 2,
                      f"{got:.2f}x ({sf[key]:,.0f} vs {peer['library']} {peer[key]:,.0f}/s)" if got else "",
                      why_not(sf) if not (sf and sf.get(key)) else "no peer measured")
    sf = row(report, size="2KiB", workers=0, shuffle=False, library="shardfeed")
    got = sf.get("steady") if sf else None
    judge("2 KiB steady, stored order: >= 1,000,000/s", "0 workers", got, 1e6,
          f"{got:,.0f}/s" if got else "", why_not(sf))
    cat = report["cat_mb_s"].get("100KiB")
    for lib in ("shardfeed", "shardfeed-tensor"):
        form = "bytes (copied)" if lib == "shardfeed" else 'bytes_as="tensor" (views)'
        for w in workers:
            sf = row(report, size="100KiB", workers=w, shuffle=False, library=lib)
            for key, name in RATES.items():
                mb_s = sf[key] * KIB100 / 1e6 if sf and sf.get(key) else None
                got = mb_s / cat if mb_s and cat else None
                judge(f"100 KiB {name}: >= 50% of cat", f"{form}, {w} workers", got, 0.5,
                      f"{got:.0%} ({mb_s:,.0f} of {cat:,.0f} MB/s)" if got else "", why_not(sf))
                peer = best_peer(report, key, size="100KiB", workers=w, shuffle=False)
                got = sf[key] / peer[key] if sf and sf.get(key) and peer else None
                judge(f"100 KiB {name}: >= 2x the fastest peer", f"{form}, {w} workers", got, 2,
                      f"{got:.2f}x ({sf[key] * KIB100 / 1e6:,.0f} vs {peer['library']} "
                      f"{peer[key] * KIB100 / 1e6:,.0f} MB/s)" if got else "",
                      why_not(sf) if not (sf and sf.get(key)) else "no peer measured")
    for w in workers:
        for sh in shuffles:
            sf = row(report, size="2KiB", workers=w, shuffle=sh, library="shardfeed")
            got = sf.get("first_batch_s") if sf else None
            judge("first batch (fresh process, construction included): < 0.1 s",
                  f"2 KiB, {w} workers, shuffle {_on(sh)}", got, 0.1, f"{got:.3f} s" if got else "",
                  why_not(sf), below=True)
    for w in workers:
        for key, name in RATES.items():
            pq = row(report, size="2KiB", workers=w, shuffle=True, library="shardfeed-parquet")
            tar = row(report, size="2KiB", workers=w, shuffle=True, library="shardfeed")
            got = pq[key] / tar[key] if pq and tar and pq.get(key) and tar.get(key) else None
            judge(f"Parquet global within 2x of tar global ({name})", f"2 KiB, {w} workers", got, 0.5,
                  f"{got:.2f}x ({pq[key]:,.0f} vs {tar[key]:,.0f}/s)" if got else "", why_not(pq, tar))
    return out


def throughput_table(report: dict) -> str:
    rows = []
    for r in report["rows"]:
        mb = r["steady"] * r["bytes_per_sample"] / 1e6 if r.get("steady") else None
        rows.append([r["size"], r["workers"], _on(r["shuffle"]), r["label"], cell(r.get("fresh")), cell(r.get("whole")),
                     cell(r.get("steady")), cell(mb), cell(r.get("import_s"), ".3f"),
                     cell(r.get("first_batch_s"), ".3f"), r["status"]])
    return table(["size", "workers", "shuffle", "library", "fresh process /s", "whole pass /s", "steady /s",
                  "steady MB/s", "import s", "first batch s", "status"], rows, "lrllrrrrrrl")


def configurations_table(report: dict) -> str:
    """How each library in the run writes and reads (its adapter's CONFIG)."""
    return table(["library", "configuration"], [list(lc) for lc in report.get("configurations", {}).values()])


def quality_table(report: dict) -> str:
    q = report.get("quality")
    if not q:
        return "Shuffle quality: not run (--no-quality)."
    ideal = q["ideal"]
    lines = [f"Class-ordered data: {q['classes']} classes x {q['per_class']:,} samples written class by class, "
             f"shards of {q['per_shard']:,}, batch {report['batch_size']}, one epoch at 0 workers, each library's "
             f"default shuffle turned on. Ideal (uniform random batches): {ideal['classes_per_batch']:.1f} "
             f"classes per batch, Spearman 0, displacement 0.33. shardfeed's other rows (Parquet, tensor) read in "
             f"the order of its `global` row.", ""]
    rows = [[r["label"], r["setting"], cell(c := r.get("classes_per_batch"), ".1f"),
             cell(c / ideal["classes_per_batch"] if c else None, ".2f"), cell(r.get("largest_class_share"), ".2f"),
             cell(r.get("spearman"), ".2f"), cell(r.get("displacement"), ".2f"), r["status"]] for r in q["rows"]]
    lines.append(table(["library", "shuffle", "classes per batch", "of ideal", "largest class share", "Spearman",
                        "displacement / n", "status"], rows, "llrrrrrl"))
    return "\n".join(lines)


def train_table(report: dict) -> str:
    t = report.get("train")
    if not t:
        return "Trainer: not run (--train-steps 0)."
    lines = [f"Reference trainer (tools/train/model.py SmallCNN, {t['image']}x{t['image']}x3 images cut from the "
             f"2 KiB payloads, {t['classes']:,} classes, batch {report['batch_size']}, SGD), CPU, one torch thread, "
             f"{t['workers']} loader workers, shuffle on, {t['steps']} steps; steps/s and stall after the first "
             f"step; stall = share of the time waiting for the next batch.", ""]
    rows = [[r["label"], cell(r.get("steps_per_s"), ".2f"), cell(r.get("stall"), ".0%"),
             cell(r.get("wait_ms_per_step"), ".1f"), cell(r.get("compute_ms_per_step"), ".1f"),
             cell(r.get("first_step_s"), ".2f"), r["status"]] for r in t["rows"]]
    lines.append(table(["library", "steps/s", "data stall", "wait ms/step", "compute ms/step", "first step s",
                        "status"], rows, "lrrrrrl"))
    return "\n".join(lines)


def targets_table(items: list[dict]) -> str:
    met = {True: "met", False: "MISSED", None: "not judged"}
    return table(["target", "configuration", "result", "figures"],
                 [[t["target"], t["config"], met[t["met"]], t["detail"]] for t in items])


def shown_path(path: str) -> str:
    """A path as the report shows it: relative to the working folder when inside it,
    so a published report names no machine's folders."""
    rel = os.path.relpath(path) if path and os.path.isabs(path) else path
    return rel if rel and not rel.startswith("..") else path


def _versions_line(report: dict) -> str:
    v = report["versions"]
    line = "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if k != "mosaicml-streaming")
    pv = report.get("peers_versions")
    if pv and "error" not in pv:
        line += (f"; mosaicml-streaming {pv.get('mosaicml-streaming')} in its own venv ({shown_path(report['peers_python'])}: "
                 f"torch {pv.get('torch')}, numpy {pv.get('numpy')}; imported from streaming.base, "
                 f"without its torchvision-based example datasets)")
    else:
        line += f"; mosaicml-streaming {v.get('mosaicml-streaming')} (no peers venv: tools/bench/install_peers.sh)"
    return line


def _passes(report: dict) -> str:
    n = report.get("repeat", 1)
    if n == 1:
        return "one pass per configuration in a fresh process"
    return (f"{n} passes per configuration, each in a fresh process, going round all configurations in turn; "
            f"each figure is the median of its {n} passes")


def render(report: dict) -> str:
    sizes = " and ".join(f"{n:,} x {s.replace('KiB', ' KiB')}" for s, n in report["counts"].items())
    items = report["targets"]
    counts = {k: sum(t["met"] is v for t in items) for k, v in (("met", True), ("missed", False), ("nj", None))}
    head = (f"`shardfeed bench compare`: {sizes} samples, batch {report['batch_size']}, page cache warm, "
            f"{_passes(report)}, every pass content-checked (a wrong pass is FAILED, never a "
            f"number). **Whole pass** = samples / time from constructing the dataset and loader to the last batch; "
            f"**steady** = after the first batch; **first batch** = construction + first batch; **fresh process** = "
            f"samples / time from starting the child interpreter to the last batch (interpreter start and every "
            f"import included: what a short job or a notebook cell sees; a bare interpreter with the harness's "
            f"imports takes {cell(report.get('harness_start_s'), '.3f')} s of it); **import s** = importing the "
            f"library's reading modules (torch already imported by the harness). A pass of fewer "
            f"than {MIN_BATCHES} batches gets no steady rate. Machine: {report['machine']}. Run took "
            f"{report['elapsed_s']:.0f} s.")
    cat = ("`cat` of shardfeed's shards (page cache warm): "
           + ", ".join(f"{s} {v:,.0f} MB/s" for s, v in report["cat_mb_s"].items()))
    return "\n\n".join([head, _versions_line(report), "## Configurations", configurations_table(report),
                        "## Throughput", throughput_table(report), cat,
                        "## Shuffle quality", quality_table(report), "## Reference trainer", train_table(report),
                        "## Targets", f"{counts['met']} met, {counts['missed']} missed, {counts['nj']} not judged.",
                        targets_table(items)]) + "\n"
