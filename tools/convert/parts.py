"""`convert --part i/N` and `convert --merge DST PART...`: conversions run by any scheduler.

A part folder holds part i's shards (``shard-NNNNNN.*`` from 0, with their
sidecars), the source's extra files and ``part.json``: which part of how
many, the key of the whole conversion (every part of one conversion has the
same key: the same source, sample count, format, shard limits and seed), its
shards and fields. It has no ``index.arrow``: a part is not a dataset, so
nothing reads it by mistake before the merge.

Part i covers the same output positions as process i of ``--processes N``,
so N parts merged give byte for byte the dataset ``--processes N`` writes.
The merge checks that parts 0..N-1 are all there, once, with one key;
hard-links (or copies, across file systems) their shards into a stage under
global names, writes one index and publishes it with one rename. The parts
are left as they were.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field

from shardfeed.formats import ShardError, ShardInfo, write_index
from shardfeed.formats.sidecar import SIDECAR_SUFFIX

PART_FILE = "part.json"


@dataclass
class ConvertResult:
    """What a conversion (or a merge of parts) published."""

    root: str
    samples: int
    shards: int
    bytes: int
    seconds: float
    fields: list = field(default_factory=list)


def parse_part(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--part {text!r} is not I/N (e.g. 0/4: the first of 4 parts)") from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"--part {text!r}: I must be in 0..N-1 and N at least 1 (e.g. 0/4 .. 3/4)")
    return i, n


def write_part_manifest(folder: str, part: tuple[int, int], key: str, total: int, shards: list[ShardInfo],
                        fields: list[str], extra: dict) -> None:
    rec = {"part": part[0], "of": part[1], "key": key, "total_samples": total, "fields": list(fields),
           "shards": [dict(s.__dict__) for s in shards], "extra": extra}
    with open(os.path.join(folder, PART_FILE), "w", encoding="utf-8") as f:
        json.dump(rec, f, indent=1, sort_keys=True)


def _read_part(folder: str) -> dict:
    path = os.path.join(folder, PART_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            rec = json.load(f)
        rec["shards"] = [ShardInfo(**s) for s in rec["shards"]]
        int(rec["part"]), int(rec["of"]), str(rec["key"])
    except (FileNotFoundError, NotADirectoryError):
        raise ShardError(folder, f"is not a convert part (no {PART_FILE}); write parts with "
                                 "`shardfeed convert SRC PART_DIR --part I/N`") from None
    except (ValueError, KeyError, TypeError) as e:
        raise ShardError(path, f"part record is unreadable ({e}); write this part again") from None
    return rec


def _link(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not allowed: copy
        shutil.copyfile(src, dst)


def merge_parts(dst: str, part_dirs: list[str], overwrite: bool = False):
    """Publish the parts as one dataset at ``dst``; returns a ConvertResult."""
    from shardfeed.formats.staging import check_destination, publish_stage, remove_stale_stages, stage_path
    from shardfeed.tools.convert.resume import StageLock, args_key

    t0 = time.perf_counter()
    dst = os.path.abspath(dst)
    check_destination(dst, overwrite)
    if not part_dirs:
        raise ShardError(dst, "--merge needs the part folders to merge: --merge DST PART [PART ...]")
    recs = [(d, _read_part(d)) for d in part_dirs]
    keys = {r["key"] for _, r in recs}
    if len(keys) > 1:
        by_key = {}
        for d, r in recs:
            by_key.setdefault(r["key"], []).append(d)
        raise ShardError(dst, "the parts come from different conversions (source, options or seed differ): "
                              + "; ".join(f"{', '.join(ds)}" for ds in by_key.values()))
    count = recs[0][1]["of"]
    seen: dict[int, str] = {}
    for d, r in recs:
        if r["of"] != count:
            raise ShardError(d, f"is part {r['part']}/{r['of']} but {recs[0][0]} is one of {count} parts")
        if r["part"] in seen:
            raise ShardError(d, f"part {r['part']}/{count} is given twice (also {seen[r['part']]})")
        seen[r["part"]] = d
    missing = sorted(set(range(count)) - set(seen))
    if missing:
        raise ShardError(dst, f"parts {missing} of {count} are missing; write them with --part I/{count} "
                              "and merge all of them")
    recs.sort(key=lambda dr: dr[1]["part"])
    parent = os.path.dirname(dst)
    os.makedirs(parent, exist_ok=True)
    remove_stale_stages(parent)
    stage = stage_path(dst, args_key({"merge": sorted(os.path.abspath(d) for d in part_dirs)}))
    lock = StageLock(stage)
    try:
        shards, fields = [], []
        for d, r in recs:
            for info in r["shards"]:
                name = f"shard-{len(shards):06d}{info.name[len('shard-000000'):]}"
                for suffix in ("", SIDECAR_SUFFIX):
                    src = os.path.join(d, info.name + suffix)
                    if os.path.exists(src):
                        target = os.path.join(stage, name + suffix)
                        if os.path.lexists(target):
                            os.unlink(target)
                        _link(src, target)
                    elif not suffix:
                        raise ShardError(src, f"part {r['part']}/{count} lists this shard but it is missing")
                shards.append(ShardInfo(name, info.format, info.samples, info.bytes, info.hash))
            fields += [f for f in r["fields"] if f not in fields]
            for name in os.listdir(d):  # the source's extra files (classes.txt), the same in every part
                if name.endswith(".txt") and os.path.isfile(os.path.join(d, name)):
                    shutil.copyfile(os.path.join(d, name), os.path.join(stage, name))
        total = sum(s.samples for s in shards)
        if total != recs[0][1]["total_samples"]:
            raise ShardError(dst, f"the parts hold {total} samples but the conversion has "
                                  f"{recs[0][1]['total_samples']}; a part is damaged, write it again")
        write_index(stage, shards, fields, extra=recs[0][1]["extra"])
        lock.release(remove=True)
        publish_stage(stage, dst, overwrite)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        lock.release()
        raise
    return ConvertResult(dst, total, len(shards), sum(s.bytes for s in shards), time.perf_counter() - t0, fields)
