"""`shardfeed inspect DST`: counts, sizes, fields, formats and a few samples of a dataset.

Works on a shardfeed dataset folder and on foreign WebDataset tars (a tar
file or a folder of them, scanned once since they have no index), and on a
glob or brace pattern of shards. A foreign tar that cannot be scanned is
listed as unreadable and the rest is shown (`shardfeed verify` checks it).
Byte fields are shown as their length and first bytes; pickle is never decoded.
Exit codes: 0 shown; 2 the dataset could not be opened or read (or no shard of
it could).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter

import numpy as np

from shardfeed.tools.byte_sizes import human_bytes

PREVIEW_CHARS = 60
PREVIEW_BYTES = 12


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = __doc__.splitlines()[0]
    p.add_argument("dst", metavar="DST", help="dataset folder, tar file, folder of WebDataset tars, or a glob "
                                              "or brace pattern of shards (quote it)")
    p.add_argument("--samples", type=int, default=3, metavar="K",
                   help="show K samples spread evenly over the dataset (3; 0 for none)")
    p.add_argument("--shards", action="store_true", help="also list every shard (name, format, samples, bytes)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def preview(ext: str, value) -> str:
    """A short, safe description of one field value (never decodes pickle or images)."""
    from shardfeed.formats import codec_of

    codec = codec_of(ext)
    if isinstance(value, (bool, int, float, np.integer, np.floating)):
        return repr(value)
    if isinstance(value, str):
        return _clip(repr(value))
    data = bytes(value) if isinstance(value, (bytes, bytearray, memoryview)) else None
    if data is None:
        return _clip(f"{type(value).__name__} {value!r}")
    if codec in ("int", "text", "json"):
        try:
            text = data.decode("utf-8")
            return _clip(text if codec == "json" else repr(int(text)) if codec == "int" else repr(text))
        except (UnicodeDecodeError, ValueError):
            pass  # not what the extension claims: fall through to raw bytes
    head = data[:PREVIEW_BYTES].hex(" ")
    more = " ..." if len(data) > PREVIEW_BYTES else ""
    note = ", pickle: not decoded" if codec == "pickle" else ""
    return f"<{len(data):,} bytes{note}: {head}{more}>"


def _clip(text: str) -> str:
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS - 3] + "..."


def _dist(values) -> dict:
    if len(values) == 0:
        return {"min": 0, "median": 0, "max": 0}
    return {"min": int(np.min(values)), "median": int(np.median(values)), "max": int(np.max(values))}


def describe(index, samples: int = 3, list_shards: bool = False) -> dict:
    """Everything `inspect` shows, as plain JSON-able values."""
    from shardfeed.formats import open_shard

    info = {
        "root": os.path.abspath(index.root),
        "indexed": not index.meta.get("scanned", False),
        "shards": len(index),
        "samples": index.num_samples,
        "bytes": index.num_bytes,
        "formats": dict(Counter(index.formats)),
        "fields": list(index.fields),
        "shard_bytes": _dist(index.sizes),
        "shard_samples": _dist(index.counts),
        "unreadable": [{"shard": path, "reason": reason} for path, reason in index.skipped],
    }
    classes = os.path.join(index.root, "classes.txt")
    if os.path.isfile(classes):
        with open(classes, encoding="utf-8") as f:
            names = f.read(1 << 20).splitlines()
        info["classes"] = {"count": len(names), "first": names[:10]}
    if list_shards:
        info["shard_list"] = [index.shard(i).__dict__ for i in range(len(index))]
    picks = []
    n = index.num_samples
    if samples > 0 and n > 0:
        ids = np.unique(np.linspace(0, n - 1, min(samples, n)).round().astype(np.int64))
        shards, local = index.locate(ids)
        for gid, s, j in zip(ids.tolist(), shards.tolist(), local.tolist()):
            with open_shard(index, s) as reader:
                sample = reader.read(j)
            picks.append({"id": gid, "shard": index.names[s], "index_in_shard": j, "key": sample["__key__"],
                          "fields": {ext: preview(ext, v) for ext, v in sample.items() if ext != "__key__"}})
    info["examples"] = picks
    return info


def render(info: dict) -> str:
    fmt = ", ".join(f"{k}: {v}" for k, v in info["formats"].items())
    sb, ss = info["shard_bytes"], info["shard_samples"]
    lines = [
        f"dataset        {info['root']}" + ("" if info["indexed"] else "  (no index: tars scanned)"),
        f"shards         {info['shards']:,} ({fmt})",
        f"samples        {info['samples']:,}",
        f"bytes          {info['bytes']:,} ({human_bytes(info['bytes'])})",
        f"fields         {', '.join(info['fields']) or '-'}",
        f"shard bytes    min {human_bytes(sb['min'])}  median {human_bytes(sb['median'])}  max {human_bytes(sb['max'])}",
        f"shard samples  min {ss['min']:,}  median {ss['median']:,}  max {ss['max']:,}",
    ]
    for bad in info.get("unreadable", []):
        lines.append(f"unreadable     {bad['shard']}: {bad['reason']}")
    if "classes" in info:
        c = info["classes"]
        lines.append(f"classes        {c['count']:,} (classes.txt: {', '.join(c['first'])}"
                     f"{', ...' if c['count'] > len(c['first']) else ''})")
    for s in info.get("shard_list", []):
        lines.append(f"  {s['name']}  {s['format']}  {s['samples']:,} samples  {s['bytes']:,} bytes  {s['hash']}")
    if info["examples"]:
        lines.append("examples")
    for ex in info["examples"]:
        lines.append(f"  #{ex['id']} key {ex['key']!r} ({ex['shard']} sample {ex['index_in_shard']})")
        width = max(len(k) for k in ex["fields"]) if ex["fields"] else 0
        for ext, text in ex["fields"].items():
            lines.append(f"      {ext:<{width}}  {text}")
    return "\n".join(lines)


def main(args) -> int:
    from shardfeed.formats import ShardError, open_index

    if args.samples < 0:
        print(f"shardfeed inspect: error: --samples {args.samples} must be 0 or more", file=sys.stderr)
        return 2
    try:
        index = open_index(args.dst, on_error="skip")
        if len(index) == 0 and index.skipped:
            path, reason = index.skipped[0]
            raise ShardError(path, reason + (f" (and {len(index.skipped) - 1} more unreadable shards)"
                                             if len(index.skipped) > 1 else ""))
        info = describe(index, args.samples, args.shards)
    except ShardError as e:
        print(f"shardfeed inspect: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(info, indent=2) if args.json else render(info))
    return 0
