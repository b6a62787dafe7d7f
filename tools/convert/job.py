"""Run a conversion: source samples -> one dataset folder with one index.

Life of a conversion (nothing under DST's name until the very end):

1. the output order is fixed: sample ids 0..n-1, or with ``shuffle_seed``
   the keyed permutation of them (order.py: O(1) memory; sources read front
   to back go through a two-pass bucket shuffle giving the same order);
2. the order is cut into ``processes`` contiguous parts at shard boundaries
   of a 1-process run, found by measuring every sample first (part_bounds.py), so
   the shards are those 1 process writes;
   each part is written by its own ShardWriter under ``<stage>/part-NNN/``,
   where the stage is a hidden sibling of DST named by a hash of the
   arguments (``.<name>.convert-<key>``, see resume.py); each finished shard
   is renamed into the part folder and recorded in its manifest;
3. the parts' shards are moved into the stage root and renamed
   ``shard-000000...`` in output order, so the dataset's samples, their order
   and shard names do not depend on the number of processes;
4. class names and the one ``index.arrow`` covering every part (with the
   shuffle seed in its metadata) are written last, and the stage is renamed
   to DST (an existing DST, with overwrite, is first moved aside as
   ``.<name>.old-<host>-<pid>`` and removed after the swap). Overwrite
   replaces only an empty folder or a shardfeed dataset, never a folder of
   other files. SIGINT and SIGTERM are deferred during the swap, so an
   interrupt never leaves DST missing; one that arrives then is too late to
   stop the conversion, which completes.

With ``part=(i, N)`` only part i of N is written, published at DST as a part
folder for ``parts.merge_parts`` (no index).

Any error or interrupt (KeyboardInterrupt and its subclasses, which the CLI
raises for SIGINT and SIGTERM) removes the stage: no partial dataset is ever
published. A run killed outright (SIGKILL, power loss) leaves its stage
behind, and a rerun with the same arguments continues it from the last
finished shard of each part, to the same bytes as an uninterrupted run
(resume.py). Stages of the older ``.<name>.convert-<host>-<pid>`` form whose
owner no longer runs on this host are removed; a live run's stage, or one
from another host sharing the folder, is never touched.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from shardfeed.formats import ShardError, ShardInfo, ShardWriter, write_index
from shardfeed.formats.columnar_values import typed_for_columnar
from shardfeed.formats.sidecar import SIDECAR_SUFFIX
from shardfeed.formats.staging import check_destination, publish_stage, remove_stale_stages, stage_path
from shardfeed.tools.convert.order import BucketShuffle, OutputOrder, bucket_samples_for
from shardfeed.tools.convert.part_bounds import PLAN, load_plan, measure, parts_at, save_plan, shard_ends
from shardfeed.tools.convert.parts import ConvertResult, write_part_manifest
from shardfeed.tools.convert.processes import run_each
from shardfeed.tools.convert.resume import (
    StageLock,
    append_manifest,
    args_key,
    read_manifest,
    remove_superseded,
)

PART_PREFIX = "shard"
_SHARD_NAME = re.compile(rf"^{PART_PREFIX}-\d+(\..+)$")  # ShardWriter's "shard-000012.tar.zst"
BATCH = 256  # samples read per source call; also the progress granularity
ASSEMBLED = "assembled.json"


@dataclass
class ConvertOptions:
    format: str = "tar"
    max_shard_bytes: int = 256 << 20
    max_shard_samples: int | None = None
    compression: str | None = None
    processes: int = 1
    shuffle_seed: int | None = None
    overwrite: bool = False
    shuffle_mode: str = "auto"  # auto | permute | buckets (see order.py)
    bucket_samples: int | None = None  # buckets: samples per bucket (None: ~256 MiB of samples)
    part: tuple[int, int] | None = None  # (i, N): write only part i of N, into a part folder
    engine: str = "local"  # local (processes) | ray
    address: str | None = None  # ray: the cluster to join (None: a local instance)


def plan_parts(source, order, stage: str, opts: ConvertOptions, n: int) -> list[tuple[int, int]]:
    """[start, stop) of the output order for each part: ``processes`` parts, or
    with ``part=(i, N)`` part i of N, cut at a 1-process run's shard boundaries (part_bounds.py)."""
    count = opts.part[1] if opts.part is not None else opts.processes
    parts = [(0, n)] if min(count, n) <= 1 else load_plan(stage)
    if parts is None:
        workers = max(1, min(opts.processes, os.cpu_count() or 1, n))
        ranges = [(n * w // workers, n * (w + 1) // workers) for w in range(workers)]
        if workers == 1:
            sizes = [measure(source, _batches(source, order, 0, n), opts.format)]
        else:
            sizes = run_each(_measure_range, [(source, order, a, b, opts.format) for a, b in ranges], lambda x: None)
        parts = parts_at(shard_ends(np.concatenate(sizes), opts.max_shard_bytes, opts.max_shard_samples), count)
        save_plan(stage, parts)
    if opts.part is not None:  # fewer shards than parts: the last parts are empty
        return [parts[opts.part[0]] if opts.part[0] < len(parts) else (n, n)]
    return parts


def _batches(source, order, a: int, b: int):
    """Lists of samples at output positions a..b-1, in order."""
    if isinstance(order, BucketShuffle):
        for chunk in order.gather(a, b):
            for i in range(0, len(chunk), BATCH):
                yield chunk[i:i + BATCH]
        return
    for start in range(a, b, BATCH):
        yield source.load_many(order.ids(start, min(b, start + BATCH)))


def _keep_finished(writer: ShardWriter, base: int, part_dir: str, shards: list, fields: list) -> None:
    """Rename shards the writer finished into ``part_dir`` (part-local names
    after the ``base`` shards of earlier runs), then record them."""
    while len(shards) < base + len(writer.shards):
        info = writer.shards[len(shards) - base]
        name = f"{PART_PREFIX}-{len(shards):06d}{_SHARD_NAME.match(info.name).group(1)}"
        for suffix in (SIDECAR_SUFFIX, ""):  # the shard last: its name is what the manifest checks
            src = os.path.join(writer.root, info.name + suffix)
            if os.path.exists(src):
                os.replace(src, os.path.join(part_dir, name + suffix))
        fields += [f for f in writer.fields if f not in fields]
        shards.append(ShardInfo(name, info.format, info.samples, info.bytes, info.hash))
        append_manifest(part_dir, {"name": name, "format": info.format, "samples": info.samples,
                                   "bytes": info.bytes, "hash": info.hash, "fields": fields})


def write_part(source, order, a: int, b: int, part_dir: str, opts: ConvertOptions,
               report: Callable[[int], None]) -> tuple[list[ShardInfo], list[str]]:
    """Write output positions a..b-1 as shards under ``part_dir``, continuing
    after the shards its manifest records (see resume.py)."""
    os.makedirs(part_dir, exist_ok=True)
    shards, fields, done = read_manifest(part_dir)
    pos = a + sum(s.samples for s in shards)
    if pos > a:
        report(pos - a)
    if done:
        return shards, fields
    writing = os.path.join(part_dir, "writing")
    shutil.rmtree(writing, ignore_errors=True)  # what the killed run had half written
    prev_key = None
    base = len(shards)
    with ShardWriter(writing, format=opts.format, max_shard_bytes=opts.max_shard_bytes,
                     max_shard_samples=opts.max_shard_samples, compression=opts.compression,
                     prefix=PART_PREFIX) as writer:
        for batch in _batches(source, order, pos, b):
            for sample in batch:
                where = sample.pop("__src__", None) or source.describe()
                key = sample.get("__key__")
                if opts.format == "tar" and key == prev_key:
                    # Readers group consecutive tar members by key: two samples would merge.
                    raise ShardError(where, f"key {key!r} appears in two consecutive samples; make keys "
                                            "unique (or pass --shuffle-seed to separate them)")
                prev_key = key
                if opts.format != "tar":
                    sample = typed_for_columnar(sample, where)
                try:
                    writer.write(sample)
                except (ValueError, TypeError) as e:
                    hint = ""
                    if "one schema" in str(e) and getattr(source, "kind", "") == "images":
                        hint = "; the folder mixes image types: pass --image-field NAME (e.g. image) or --format tar"
                    raise ShardError(where, f"{e}{hint}") from None
                _keep_finished(writer, base, part_dir, shards, fields)
            report(len(batch))
    _keep_finished(writer, base, part_dir, shards, fields)
    append_manifest(part_dir, {"done": True})
    shutil.rmtree(writing, ignore_errors=True)
    source.close()
    return shards, fields


# --- worker processes -------------------------------------------------------

def _run_part(source, order, a, b, part_dir, opts, emit):
    return write_part(source, order, a, b, part_dir, opts, emit)


def _measure_range(source, order, a, b, fmt, _emit):
    try:
        return measure(source, _batches(source, order, a, b), fmt)
    finally:
        source.close()


def _write_parts(source, order, parts, stage, opts, progress) -> list[tuple[list[ShardInfo], list[str]]]:
    dirs = [os.path.join(stage, f"part-{p:03d}") for p in range(len(parts))]
    if opts.engine == "ray":
        from shardfeed.tools.convert.ray_engine import write_parts_on_ray

        return write_parts_on_ray(source, order, parts, dirs, opts, progress, write_part)
    if len(parts) == 1:
        return [write_part(source, order, *parts[0], dirs[0], opts, progress)]
    return run_each(_run_part, [(source, order, a, b, d, opts) for (a, b), d in zip(parts, dirs)], progress)


def _order(source, stage: str, opts: ConvertOptions, n: int):
    """The output order: identity, the keyed permutation, or the bucket shuffle for sequential sources."""
    if opts.shuffle_seed is None:
        return OutputOrder(n, None)
    mode = opts.shuffle_mode
    if mode == "auto":
        mode = "permute" if getattr(source, "random_access", True) else "buckets"
    if mode == "permute":
        return OutputOrder(n, opts.shuffle_seed)
    folder = os.path.join(stage, "buckets")
    size = opts.bucket_samples or bucket_samples_for(source.load_many(np.arange(min(n, BATCH))), n)
    shuffle = BucketShuffle(folder, n, opts.shuffle_seed, size)
    shuffle.scatter(source.load_many, BATCH)
    return shuffle


def run_key(source, opts: ConvertOptions, fingerprint: str | None = None) -> str:
    """The hash of everything that decides the output (names the stage a rerun resumes)."""
    what = {k: v for k, v in opts.__dict__.items() if k not in ("overwrite", "engine", "address")}
    # layout 2: parts cut at planned shard boundaries; a stage or part of the older cut is never mixed in
    return args_key({"options": what, "source": fingerprint or source.describe(), "samples": len(source),
                     "layout": 2})


def _assemble(stage: str, results) -> tuple[list[ShardInfo], list[str]]:
    """Parts' shards -> the stage root, renamed ``shard-NNNNNN`` in output order.

    The plan is written first (assembled.json) so a run killed half way
    through the renames finishes them on resume instead of redoing parts."""
    plan_path = os.path.join(stage, ASSEMBLED)
    if results is None:
        with open(plan_path, encoding="utf-8") as f:
            plan = json.load(f)
    else:
        plan = {"moves": [], "fields": []}
        for p, (infos, part_fields) in enumerate(results):
            for info in infos:
                name = f"{PART_PREFIX}-{len(plan['moves']):06d}{_SHARD_NAME.match(info.name).group(1)}"
                plan["moves"].append([f"part-{p:03d}/{info.name}", dict(info.__dict__, name=name)])
            plan["fields"] += [f for f in part_fields if f not in plan["fields"]]
        with open(plan_path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(plan, f)
        os.replace(plan_path + ".tmp", plan_path)
    shards = []
    for src, rec in plan["moves"]:
        for suffix in ("", SIDECAR_SUFFIX):
            path = os.path.join(stage, *src.split("/")) + suffix
            if os.path.exists(path):
                os.replace(path, os.path.join(stage, rec["name"] + suffix))
        shards.append(ShardInfo(**rec))
    for name in os.listdir(stage):
        if name.startswith("part-") or name == "buckets":
            shutil.rmtree(os.path.join(stage, name))
    if os.path.exists(os.path.join(stage, PLAN)):
        os.unlink(os.path.join(stage, PLAN))
    return shards, plan["fields"]


def convert(source, dst: str, opts: ConvertOptions, progress: Callable[[int], None] = lambda n: None,
            fingerprint: str | None = None) -> ConvertResult:
    """Write ``source`` as a dataset at ``dst`` (or, with ``opts.part``, as
    one part folder that ``merge_parts`` publishes); see the module docstring."""
    t0 = time.perf_counter()
    dst = os.path.abspath(dst)
    check_destination(dst, opts.overwrite)
    parent = os.path.dirname(dst)
    os.makedirs(parent, exist_ok=True)
    remove_stale_stages(parent)
    n = len(source)
    if n == 0:
        raise ShardError(source.describe(), "the source holds no samples")
    key = run_key(source, opts, fingerprint)
    remove_superseded(dst, key)
    stage = stage_path(dst, key)
    lock = StageLock(stage)  # raises if a live run with these arguments holds it
    try:
        if os.path.exists(os.path.join(stage, ASSEMBLED)):
            progress(n)
            shards, fields = _assemble(stage, None)
        else:
            order = _order(source, stage, opts, n)
            parts = plan_parts(source, order, stage, opts, n)
            results = _write_parts(source, order, parts, stage, opts, progress)
            shards, fields = _assemble(stage, results)
        for name, text in source.extra_files().items():
            with open(os.path.join(stage, name), "w", encoding="utf-8") as f:
                f.write(text)
        extra = {"convert": {"samples": n, "shuffle_seed": opts.shuffle_seed}}  # sorted, as part.json keeps it
        if opts.part is not None:
            write_part_manifest(stage, opts.part, key_without_part(source, opts, fingerprint), n, shards, fields,
                                extra)
        else:
            write_index(stage, shards, fields, extra=extra)
        os.unlink(os.path.join(stage, ASSEMBLED))
        lock.release(remove=True)
        publish_stage(stage, dst, opts.overwrite)
    except BaseException:
        # An error or an interrupt (SIGINT, SIGTERM) is the user's stop: nothing is kept.
        # Only a run killed outright leaves its stage, for a rerun to continue.
        shutil.rmtree(stage, ignore_errors=True)
        lock.release()
        raise
    return ConvertResult(dst, sum(s.samples for s in shards), len(shards), sum(s.bytes for s in shards),
                         time.perf_counter() - t0, fields)


def key_without_part(source, opts: ConvertOptions, fingerprint: str | None = None) -> str:
    """The key all parts of one conversion share (merge checks the parts agree on it)."""
    whole = ConvertOptions(**dict(opts.__dict__, part=None, processes=1))
    return run_key(source, whole, fingerprint)
