"""Tables, targets and the plot of `shardfeed bench read`, from one run's results.

The targets (issue 4), each judged within the same run and worker count:
- 2 KiB samples: shardfeed reads at least 2x the samples/s of the fastest peer;
- 100 KiB samples: shardfeed reads at least 50% of `cat`'s bandwidth;
- 2 workers at least as fast as 0 workers;
- shardfeed's peak RSS no higher than the leanest peer's;
- and flat as the dataset grows (at most +10% at --growth times the samples).
"""

from __future__ import annotations

import json
import os

SPEEDUP_2K = 2.0
CAT_FRACTION_100K = 0.5
RSS_GROWTH_LIMIT = 0.10


def _fmt(value, spec=",.0f", missing="–"):
    return missing if value is None else format(value, spec)


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
        ok = r["status"] == "ok"
        lines.append("| " + " | ".join([
            r["label"] + (" (growth)" if r["role"] == "growth" else ""), r["size"], f"{r['count']:,}",
            str(r["workers"]), _shuffle(r),
            _fmt(r.get("samples_per_s")) if ok else "", _fmt(r.get("mb_per_s")) if ok else "",
            _fmt(r.get("frac_cat"), ".3f") if ok else "", _fmt(r.get("first_batch_ms"), ",.1f") if ok else "",
            _fmt(r.get("peak_rss_mib"), ",.0f") if ok else "",
            r["status"].replace("|", "/")]) + " |")
    return "\n".join(lines)


def _anon(row) -> str:
    anon = row.get("peak_anon_rss_mib")
    return "" if anon is None else f" (anon {anon:,.0f})"


def _find(rows, **want):
    return [r for r in rows if all(r.get(k) == v for k, v in want.items())]


def targets(report: dict) -> list[dict]:
    """Each target per configuration: {"target", "config", "met" (True/False/None), "detail"}."""
    rows = report["rows"]
    main = [r for r in rows if r["role"] == "main"]
    out = []

    def shardfeed_row(**want):
        found = _find(main, library="shardfeed", **want)
        return found[0] if found else None

    def not_measured(row):
        return "shardfeed not run" if row is None else f"shardfeed not measured ({row['status']})"

    configs = sorted({(r["size"], r["workers"], r["shuffle"]) for r in main})
    for size, workers, shuffle in configs:
        where = f"{size}, {workers} workers, shuffle {'on' if shuffle else 'off'}"
        sf = shardfeed_row(size=size, workers=workers, shuffle=shuffle)
        sf_ok = sf is not None and sf["status"] == "ok"
        peers = [r for r in _find(main, size=size, workers=workers, shuffle=shuffle)
                 if r["peer"] and r["status"] == "ok"]

        if size == "2KiB":
            t = {"target": f"2 KiB: >= {SPEEDUP_2K:g}x the fastest peer's samples/s", "config": where}
            if not sf_ok:
                t.update(met=None, detail=not_measured(sf))
            elif not peers:
                t.update(met=None, detail="no peer measured")
            else:
                best = max(peers, key=lambda r: r["samples_per_s"])
                ratio = sf["samples_per_s"] / best["samples_per_s"]
                t.update(met=ratio >= SPEEDUP_2K,
                         detail=f"{ratio:.2f}x {best['label']} ({sf['samples_per_s']:,.0f} vs "
                                f"{best['samples_per_s']:,.0f} samples/s)")
            out.append(t)

        if size == "100KiB":
            t = {"target": f"100 KiB: >= {CAT_FRACTION_100K:.0%} of cat bandwidth", "config": where}
            if not sf_ok:
                t.update(met=None, detail=not_measured(sf))
            elif sf.get("frac_cat") is None:
                t.update(met=None, detail="no cat measurement")
            else:
                t.update(met=sf["frac_cat"] >= CAT_FRACTION_100K,
                         detail=f"{sf['frac_cat']:.1%} of cat ({sf['mb_per_s']:,.0f} of "
                                f"{report['limits'][size]['mb_per_s']:,.0f} MB/s)")
            out.append(t)

        t = {"target": "peak RSS <= the leanest peer's", "config": where}
        if not sf_ok:
            t.update(met=None, detail=not_measured(sf))
        elif not peers:
            t.update(met=None, detail="no peer measured")
        else:
            lean = min(peers, key=lambda r: r["peak_rss_mib"])
            t.update(met=sf["peak_rss_mib"] <= lean["peak_rss_mib"],
                     detail=f"{sf['peak_rss_mib']:,.0f} MiB{_anon(sf)} vs {lean['label']} "
                            f"{lean['peak_rss_mib']:,.0f} MiB{_anon(lean)}")
        out.append(t)

    for size, shuffle in sorted({(s, sh) for s, _, sh in configs}):
        zero = shardfeed_row(size=size, workers=0, shuffle=shuffle)
        for workers in sorted({w for s, w, sh in configs if s == size and sh == shuffle and w > 0}):
            more = shardfeed_row(size=size, workers=workers, shuffle=shuffle)
            t = {"target": f"{workers} workers >= 0 workers",
                 "config": f"{size}, shuffle {'on' if shuffle else 'off'}"}
            if zero is None or more is None or zero["status"] != "ok" or more["status"] != "ok":
                t.update(met=None, detail=not_measured(more if zero and zero["status"] == "ok" else zero))
            else:
                ratio = more["samples_per_s"] / zero["samples_per_s"]
                t.update(met=ratio >= 1.0, detail=f"{ratio:.2f}x ({more['samples_per_s']:,.0f} vs "
                                                  f"{zero['samples_per_s']:,.0f} samples/s)")
            out.append(t)

    for grown in [r for r in rows if r["role"] == "growth"]:
        base = shardfeed_row(size=grown["size"], workers=grown["workers"], shuffle=grown["shuffle"])
        t = {"target": f"peak RSS flat as the dataset grows (<= +{RSS_GROWTH_LIMIT:.0%})",
             "config": f"{grown['size']}, {grown['workers']} workers, {base['count'] if base else '?':,} -> "
                       f"{grown['count']:,} samples"}
        if base is None or base["status"] != "ok" or grown["status"] != "ok":
            t.update(met=None, detail=not_measured(grown if base and base["status"] == "ok" else base))
        else:
            growth = grown["peak_rss_mib"] / base["peak_rss_mib"] - 1
            t.update(met=growth <= RSS_GROWTH_LIMIT,
                     detail=f"{base['peak_rss_mib']:,.0f}{_anon(base)} -> {grown['peak_rss_mib']:,.0f} MiB"
                            f"{_anon(grown)} ({growth:+.1%})")
        out.append(t)
    return out


def targets_table(items: list[dict]) -> str:
    mark = {True: "met", False: "MISSED", None: "not measured"}
    lines = ["| target | configuration | result | measured |", "|---|---|---|---|"]
    lines += [f"| {t['target']} | {t['config']} | {mark[t['met']]} | {t['detail'].replace('|', '/')} |"
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
            f"`cat` MB/s counts the shard files' bytes, tar headers included; fraction of cat = MB/s / cat MB/s.")
    items = targets(report)
    met = sum(t["met"] is True for t in items)
    missed = sum(t["met"] is False for t in items)
    return "\n\n".join([head, table(report), f"Targets: {met} met, {missed} missed, "
                        f"{len(items) - met - missed} not measured", targets_table(items)])


def plot_report(report: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["rows"] if r["role"] == "main"]
    libs = list(dict.fromkeys(r["label"] for r in rows))
    panels = [(size, "samples_per_s" if size == "2KiB" else "mb_per_s") for size in report["counts"]]
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 5), squeeze=False)
    axes = axes[0]
    for ax, (size, metric) in zip(axes, panels):
        unit = "samples/s" if metric == "samples_per_s" else "MB/s"
        configs = sorted({(r["workers"], r["shuffle"]) for r in rows if r["size"] == size})
        width = 0.8 / max(len(libs), 1)
        for j, lib in enumerate(libs):
            values = []
            for workers, shuffle in configs:
                found = _find(rows, size=size, label=lib, workers=workers, shuffle=shuffle)
                values.append(found[0].get(metric, 0) if found and found[0]["status"] == "ok" else 0)
            ax.bar([i + j * width for i in range(len(configs))], values, width, label=lib)
        limit = report["limits"].get(size)
        if limit:
            cat = limit[metric]
            ax.axhline(cat, color="black", linestyle="--", label="cat (read limit)")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(configs))])
        ax.set_xticklabels([f"{w} workers\nshuffle {'on' if s else 'off'}" for w, s in configs])
        ax.set_yscale("log")
        ax.set_ylabel(unit + " (log scale)")
        ax.set_title(f"{size} samples ({report['counts'][size]:,}); missing bar = skipped/failed")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_reports(report: dict, out: str, plot: bool = True) -> list[str]:
    os.makedirs(out, exist_ok=True)
    paths = [os.path.join(out, "bench_read.md"), os.path.join(out, "bench_read.json")]
    with open(paths[0], "w") as f:
        f.write("# shardfeed bench read\n\n" + render(report) + "\n")
    with open(paths[1], "w") as f:
        json.dump({**report, "targets": targets(report)}, f, indent=1, default=str)
    if plot:
        paths.append(os.path.join(out, "bench_read.png"))
        plot_report(report, paths[-1])
    return paths
