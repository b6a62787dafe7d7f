"""Tables, targets and the plot of `shardfeed bench read`, from one run's results.

The targets (issue 4), each judged within the same run and worker count:
- 2 KiB samples: shardfeed reads at least 2x the samples/s of the fastest peer;
- 100 KiB samples: shardfeed reads at least 50% of `cat`'s bandwidth;
- 2 workers at least as fast as 0 workers;
- shardfeed's peak RSS no higher than the leanest peer's;
- and flat as the dataset grows (at most +10% at --growth times the samples).

A pass of fewer than MIN_BATCHES batches has no steady state: its rate is
mostly start-up (worker start, first shard opened, prefetch filling), so
its row says "too small: N batches", shows no rate, and no target is judged
on it ("not judged"), rather than a MISSED that measured nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from shardfeed.tools.bench import results

SPEEDUP_2K = 2.0
CAT_FRACTION_100K = 0.5
RSS_GROWTH_LIMIT = 0.10
# 8 batches: the first is start-up, and with 2 workers x prefetch 2 up to 4
# more were made while it waited; 8 leaves some batches paced by reading alone.
MIN_BATCHES = 8


def _fmt(value, spec=",.0f", missing="–"):
    return missing if value is None else format(value, spec)


def _plural(n: int, noun: str) -> str:
    return f"{n:,} {noun if n == 1 else noun + ('es' if noun.endswith(('s', 'ch')) else 's')}"


def too_small(batches: int) -> str | None:
    """The row's label when ``batches`` per pass cannot show a steady state, else None."""
    return f"too small: {_plural(batches, 'batch')}" if batches < MIN_BATCHES else None


def _measured(row) -> bool:
    """The row has rates: content checked and enough batches for a steady state."""
    return row["status"] == "ok" and not row.get("too_small")


def _status(row) -> str:
    return f"ok, {row['too_small']}" if row["status"] == "ok" and row.get("too_small") else row["status"]


def _shuffle(row) -> str:
    return "on" if row["shuffle"] else "off"


def table(report: dict) -> str:
    lines = ["| library | sample size | samples | workers | shuffle | samples/s | MB/s | fraction of cat "
             "| first batch ms | peak RSS MiB | status |",
             "|---|---|--:|--:|---|--:|--:|--:|--:|--:|---|"]
    for size, limit in report["limits"].items():
        # cat's MB/s counts file bytes (headers too); samples/s is the shards' samples per second
        lines.append(f"| `cat` of {limit['library']} shards (read limit) | {size} | | | | "
                     f"{_fmt(limit['samples_per_s'])} | {_fmt(limit['mb_per_s'])} | 1.00 | | | ok |")
    for size, check in report.get("checks", {}).items():
        cat = report["limits"].get(size)
        frac = _fmt(check["mb_per_s"] / cat["mb_per_s"], ".3f") if cat else ""
        lines.append(f"| content check alone (ceiling of this harness) | {size} | | | | "
                     f"{_fmt(check['samples_per_s'])} | {_fmt(check['mb_per_s'])} | {frac} | | | ok |")
    for r in report["rows"]:
        ok = _measured(r)
        first = r["status"] == "ok"  # a too-small pass still has a first batch
        lines.append("| " + " | ".join([
            r["label"] + (" (growth)" if r["role"] == "growth" else ""), r["size"], f"{r['count']:,}",
            str(r["workers"]), _shuffle(r),
            _fmt(r.get("samples_per_s")) if ok else "", _fmt(r.get("mb_per_s")) if ok else "",
            _fmt(r.get("frac_cat"), ".3f") if ok else "", _fmt(r.get("first_batch_ms"), ",.1f") if first else "",
            _fmt(r.get("peak_rss_mib"), ",.0f") if first else "",
            _status(r).replace("|", "/")]) + " |")
    return "\n".join(lines)


def _anon(row) -> str:
    anon = row.get("peak_anon_rss_mib")
    return "" if anon is None else f" (anon {anon:,.0f})"


def _find(rows, **want):
    return [r for r in rows if all(r.get(k) == v for k, v in want.items())]


def _unjudged(*rows) -> dict | None:
    """met=None with the reason, when a row the target needs failed or is too small; else None."""
    for row in rows:
        if row is None:
            return {"met": None, "result": "not measured", "detail": "shardfeed not run"}
        if row["status"] != "ok":
            return {"met": None, "result": "not measured", "detail": f"{row['label']} not measured ({row['status']})"}
    for row in rows:
        if row.get("too_small"):
            return {"met": None, "result": "not judged",
                    "detail": f"{row['label']}, {row['count']:,} samples: {row['too_small']} "
                              f"(< {MIN_BATCHES}, no steady state)"}
    return None


def _peers(rows) -> tuple[list, dict | None]:
    """The measured peers to compare with, or (no peers, why there are none)."""
    ok = [r for r in rows if r["peer"] and r["status"] == "ok"]
    measured = [r for r in ok if not r.get("too_small")]
    if measured:
        return measured, None
    return [], _unjudged(*ok) if ok else {"met": None, "result": "not measured", "detail": "no peer measured"}


def _judge(t: dict, met: bool, detail: str) -> dict:
    t.update(met=met, result="met" if met else "MISSED", detail=detail)
    return t


def targets(report: dict) -> list[dict]:
    """Each target per configuration: {"target", "config", "met" (True/False/None),
    "result" ("met", "MISSED", "not measured", "not judged"), "detail"}."""
    rows = report["rows"]
    main = [r for r in rows if r["role"] == "main"]
    out = []

    def shardfeed_row(**want):
        found = _find(main, library="shardfeed", **want)
        return found[0] if found else None

    configs = sorted({(r["size"], r["workers"], r["shuffle"]) for r in main})
    for size, workers, shuffle in configs:
        where = f"{size}, {workers} workers, shuffle {'on' if shuffle else 'off'}"
        sf = shardfeed_row(size=size, workers=workers, shuffle=shuffle)
        peers, no_peers = _peers(_find(main, size=size, workers=workers, shuffle=shuffle))
        skip = _unjudged(sf)

        if size == "2KiB":
            t = {"target": f"2 KiB: >= {SPEEDUP_2K:g}x the fastest peer's samples/s", "config": where}
            if skip or no_peers:
                t.update(skip or no_peers)
            else:
                best = max(peers, key=lambda r: r["samples_per_s"])
                ratio = sf["samples_per_s"] / best["samples_per_s"]
                _judge(t, ratio >= SPEEDUP_2K, f"{ratio:.2f}x {best['label']} ({sf['samples_per_s']:,.0f} vs "
                                               f"{best['samples_per_s']:,.0f} samples/s)")
            out.append(t)

        if size == "100KiB":
            t = {"target": f"100 KiB: >= {CAT_FRACTION_100K:.0%} of cat bandwidth", "config": where}
            if skip:
                t.update(skip)
            elif sf.get("frac_cat") is None:
                t.update(met=None, result="not measured", detail="no cat measurement")
            else:
                _judge(t, sf["frac_cat"] >= CAT_FRACTION_100K,
                       f"{sf['frac_cat']:.1%} of cat ({sf['mb_per_s']:,.0f} of "
                       f"{report['limits'][size]['mb_per_s']:,.0f} MB/s)")
            out.append(t)

        # A too-small pass's peak RSS is judged neither: its prefetch may never have filled.
        t = {"target": "peak RSS <= the leanest peer's", "config": where}
        if skip or no_peers:
            t.update(skip or no_peers)
        else:
            lean = min(peers, key=lambda r: r["peak_rss_mib"])
            _judge(t, sf["peak_rss_mib"] <= lean["peak_rss_mib"],
                   f"{sf['peak_rss_mib']:,.0f} MiB{_anon(sf)} vs {lean['label']} "
                   f"{lean['peak_rss_mib']:,.0f} MiB{_anon(lean)}")
        out.append(t)

    for size, shuffle in sorted({(s, sh) for s, _, sh in configs}):
        zero = shardfeed_row(size=size, workers=0, shuffle=shuffle)
        for workers in sorted({w for s, w, sh in configs if s == size and sh == shuffle and w > 0}):
            more = shardfeed_row(size=size, workers=workers, shuffle=shuffle)
            t = {"target": f"{workers} workers >= 0 workers",
                 "config": f"{size}, shuffle {'on' if shuffle else 'off'}"}
            skip = _unjudged(zero, more)
            if skip:
                t.update(skip)
            else:
                ratio = more["samples_per_s"] / zero["samples_per_s"]
                _judge(t, ratio >= 1.0, f"{ratio:.2f}x ({more['samples_per_s']:,.0f} vs "
                                        f"{zero['samples_per_s']:,.0f} samples/s)")
            out.append(t)

    for grown in [r for r in rows if r["role"] == "growth"]:
        base = shardfeed_row(size=grown["size"], workers=grown["workers"], shuffle=grown["shuffle"])
        t = {"target": f"peak RSS flat as the dataset grows (<= +{RSS_GROWTH_LIMIT:.0%})",
             "config": f"{grown['size']}, {grown['workers']} workers, {base['count'] if base else '?':,} -> "
                       f"{grown['count']:,} samples"}
        skip = _unjudged(base, grown)
        if skip:
            t.update(skip)
        else:
            growth = grown["peak_rss_mib"] / base["peak_rss_mib"] - 1
            _judge(t, growth <= RSS_GROWTH_LIMIT,
                   f"{base['peak_rss_mib']:,.0f}{_anon(base)} -> {grown['peak_rss_mib']:,.0f} MiB"
                   f"{_anon(grown)} ({growth:+.1%})")
        out.append(t)
    return out


def targets_table(items: list[dict]) -> str:
    lines = ["| target | configuration | result | measured |", "|---|---|---|---|"]
    lines += [f"| {t['target']} | {t['config']} | {t['result']} | {t['detail'].replace('|', '/')} |"
              for t in items]
    return "\n".join(lines)


def render(report: dict) -> str:
    sizes = " and ".join(f"{n:,} x {s.replace('KiB', ' KiB')}" for s, n in report["counts"].items())
    head = (f"shardfeed bench read: {sizes} samples, "
            f"batch {report['batch_size']}, page cache warm, {report['repeats']} pass(es) per configuration "
            f"in a fresh process, every pass content-checked; samples/s and MB/s are the steady state after "
            f"the first batch (first-batch latency has its own column); MB/s counts payload bytes (1 MB = 1e6 B); "
            f"peak RSS is the whole process tree (main + workers), sampled every 20 ms, mapped file pages "
            f"included (anon = heap only, in the targets). "
            f"`cat` MB/s counts the shard files' bytes, tar headers included; fraction of cat = MB/s / cat MB/s. "
            f"A pass of fewer than {MIN_BATCHES} batches is too small for a steady state: no rate is shown "
            f"and no target is judged on it.")
    items = targets(report)
    counts = {r: sum(t["result"] == r for t in items) for r in ("met", "MISSED", "not measured", "not judged")}
    summary = (f"Targets: {counts['met']} met, {counts['MISSED']} missed, {counts['not measured']} not measured, "
               f"{counts['not judged']} not judged (too small)")
    return "\n\n".join([head, table(report), summary, targets_table(items)])


def plot_report(report: dict, path: str) -> None:
    rows = [r for r in report["rows"] if r["role"] == "main"]
    libs = list(dict.fromkeys(r["label"] for r in rows))
    panels = [(size, "samples_per_s" if size == "2KiB" else "mb_per_s") for size in report["counts"]]
    _, fig, axes = results.figure(1, len(panels), figsize=(7 * len(panels), 5))
    axes = axes[0]
    for ax, (size, metric) in zip(axes, panels):
        unit = "samples/s" if metric == "samples_per_s" else "MB/s"
        configs = sorted({(r["workers"], r["shuffle"]) for r in rows if r["size"] == size})
        width = 0.8 / max(len(libs), 1)
        for j, lib in enumerate(libs):
            values = []
            for workers, shuffle in configs:
                found = _find(rows, size=size, label=lib, workers=workers, shuffle=shuffle)
                values.append(found[0].get(metric, 0) if found and _measured(found[0]) else 0)
            ax.bar([i + j * width for i in range(len(configs))], values, width, label=lib)
        limit = report["limits"].get(size)
        if limit:
            cat = limit[metric]
            ax.axhline(cat, color="black", linestyle="--", label="cat (read limit)")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(configs))])
        ax.set_xticklabels([f"{w} workers\nshuffle {'on' if s else 'off'}" for w, s in configs])
        ax.set_yscale("log")
        ax.set_ylabel(unit + " (log scale)")
        ax.set_title(f"{size} samples ({report['counts'][size]:,}); missing bar = skipped/failed/too small")
    axes[0].legend(fontsize=8)
    results.save(fig, path)


def write_reports(report: dict, out: str, plot: bool = True) -> list[str]:
    paths = results.write(out, {"bench_read.md": "# shardfeed bench read\n\n" + render(report) + "\n",
                                "bench_read.json": {**report, "targets": targets(report)}})
    if plot:
        paths.append(os.path.join(out, "bench_read.png"))
        plot_report(report, paths[-1])
    return paths


def csv_choices(value: str, allowed, what: str) -> list[str]:
    """A comma-separated option's items, each one of ``allowed`` (ValueError naming --what otherwise)."""
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise ValueError(f"--{what} {value!r}: unknown {bad or 'empty list'}; choose from {', '.join(allowed)}")
    return items


VERSIONED = ("shardfeed", "torch", "numpy", "pyarrow", "webdataset", "litdata", "mosaicml-streaming")
_VERSIONS_CODE = ("import json, sys\nfrom importlib.metadata import version\nout = {'python': sys.version.split()[0]}\n"
                  "for d in sys.argv[1:]:\n    try:\n        out[d] = version(d)\n    except Exception:\n"
                  "        out[d] = 'not installed'\nprint(json.dumps(out))")


def versions(python: str = sys.executable) -> dict:
    """Versions of the libraries as ``python`` sees them (this interpreter's without a process)."""
    if python == sys.executable:
        from importlib.metadata import PackageNotFoundError, version
        out = {"python": sys.version.split()[0]}
        for d in VERSIONED:
            try:
                out[d] = version(d)
            except PackageNotFoundError:
                out[d] = "not installed"
        return out
    try:
        done = subprocess.run([python, "-c", _VERSIONS_CODE, *VERSIONED], capture_output=True, text=True,
                              timeout=60, check=True)
        return json.loads(done.stdout)
    except (subprocess.SubprocessError, ValueError, OSError) as e:
        return {"error": f"{python}: {e}"}
