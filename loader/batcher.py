"""Sample ids in, one batch of columns out: read, decode, transform, collate.

This is the unit of work of a worker process (and of the main process when
``num_workers=0``). Without a user ``transform`` or ``collate_fn`` no sample
dict is ever built: the batch is read as one buffer (formats.engine.batch), ints are
parsed by a jitted loop into one int64 array, bytes stay in the buffer (and
cross to the main process as it is); only codecs that produce Python objects
(text, json, npy, images) decode sample by sample.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import numpy as np

from shardfeed.formats import ShardError, codec_of, decode_field
from shardfeed.formats.engine.batch import BatchReader, RawBatch, parse_ints
from shardfeed.formats.errors import ReadError
from shardfeed.loader import heap
from shardfeed.loader.batch_seeds import generator, seeded
from shardfeed.loader.bytes_column import BytesList
from shardfeed.loader.collate import Blob, Strs, collate_column, default_collate, gathered_column
from shardfeed.loader.error_policy import ErrorPolicy
from shardfeed.loader.makers import Maker
from shardfeed.loader.scratch import Scratch

AHEAD_BATCHES = 8  # of its own next batches whose compressed shards a reader decompresses ahead


def _accepts(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class BatchMaker(Maker):
    """Turns a batch's global sample ids into columns (see collate.py); the reading Maker (makers.py)."""

    def __init__(self, index, decode: bool = True, transform: Callable | None = None,
                 collate_fn: Callable | None = None, policy: ErrorPolicy | None = None,
                 unsafe: tuple[str, ...] = (), read_mode: str = "pread", cached=None, readers: int = 1,
                 in_order: bool = False):
        self.policy = policy or ErrorPolicy("raise")
        # cached: a cache.shard_access.ShardAccess when shards come through the node-local cache
        self.cached = cached
        self._refetched: set[int] = set()
        extra = {}
        if cached is not None:
            from shardfeed.cache.planning.sizing import reader_max_open
            from shardfeed.cache.readers.reads import max_entry_bytes

            biggest = max_entry_bytes(index)  # the shard and its sidecar, as the checks count it
            max_open = reader_max_open(cached.spec.limit_bytes, biggest, readers)
            if not cached.keep_open:
                max_open = 0  # a stream's shard sizes are unknown when sized: pins last one read
            if cached.ranged:
                from shardfeed.cache.readers.ranged_reads import RANGED_MAX_OPEN

                max_open = max(max_open, RANGED_MAX_OPEN)  # whole shards: partial copies close after each read
            extra = dict(path_of=cached.path_of, release=cached.release, max_open=max_open)
        self.reader = BatchReader(index, verify=True, skip=self.policy.skip, read_mode=read_mode, **extra)
        if cached is not None:  # a partial copy admitted whole since: reopened as the whole copy
            cached.forget_view = self.reader.shards.forget
        if cached is not None:  # a fetch waiting for room closes the shards this reader keeps open idle
            cached.let_go = self.reader.shards.close_idle
        self.decode = decode
        self.transform = transform
        self.transform_takes_size = transform is not None and _accepts(transform, "image_size")
        self.transform_takes_rng = transform is not None and _accepts(transform, "rng")
        # (seed, epoch, step, rank) of the next make(), set by the Loader: a
        # transform's draws are seeded per batch (batch_seeds.py); None: unseeded
        self.batch_key: tuple[int, ...] | None = None
        self.restore_rng = True  # put the process's global RNG states back after a batch (False in a worker)
        self.collate_fn = collate_fn
        self.unsafe = tuple(unsafe)
        self._scratch = Scratch()  # the fast path's batch buffer: its columns are valid until the next make()
        self._codecs: dict[str, str] = {}  # field name -> codec (_codec), as decode and unsafe are fixed
        # compressed tars in place: decompress the shards of this reader's next batches in a thread
        self.ahead = None
        self.stride = 1  # steps between this reader's batches (its Loader's num_workers)
        # the plan reads each shard in one run (stored order): a compressed shard that neither this
        # read nor the next needs is closed (hint), so memory holds a few shards, not all read so far
        self.in_order = in_order
        self._compressed = sum(f in ("tar.gz", "tar.zst") for f in index.formats)
        if cached is None and self._compressed:
            from shardfeed.formats.engine.decompress_thread import DecompressAhead

            self.ahead = DecompressAhead()

    def gather_into_bytes(self) -> bool:
        """Gather large undecoded byte fields straight into the ``bytes`` handed out
        (formats/engine/into_bytes.py): for the process that hands them out (the Loader at
        num_workers=0 with bytes_as="bytes"); only on the fast path (no transform, no collate_fn)."""
        if self.transform is not None or self.collate_fn is not None:
            return False
        return self.reader.gather_into_bytes(lambda name: self._codec(name) == "bytes", heap.reserve)

    def let_go(self) -> None:
        if self.cached is not None:
            self.reader.shards.close_idle()

    def close(self) -> None:
        if self.ahead is not None:
            self.ahead.close()
        self.reader.close()
        if self.cached is not None:
            self.cached.close()

    def hint(self, plan, start: int, stop: int) -> None:
        """This reader's batch is positions ``[start, stop)`` of ``plan``; its
        next ones are ``stride`` batches apart: start decompressing their shards."""
        if not self._compressed or stop <= start:
            return
        views = self.reader.shards.views
        if self.in_order and views:
            nxt = self.stride * (stop - start)
            ids = np.concatenate([plan.positions(start, stop),
                                  plan.positions(min(plan.num_samples, start + nxt), min(plan.num_samples, stop + nxt))])
            self.reader.shards.let_go(set(np.unique(self.reader.index.locate(ids)[0]).tolist()))
        if self.ahead is None:
            return
        from shardfeed.formats.engine.decompress_thread import upcoming

        if len(views) >= self._compressed:
            return  # every compressed shard is open (a random order after its first batches)
        # one range of positions (other workers' batches in it too): one plan call, ~30 us a batch
        n = plan.num_samples
        end = min(n, stop + AHEAD_BATCHES * self.stride * (stop - start))
        if end > stop:
            ids = plan.positions(start, end)
            shards = self.reader.shards
            # making room for a guess may close open shards, but not those this batch and the next read
            shards.keep = frozenset(views.keys() & set(np.unique(self.reader.index.locate(ids)[0]).tolist()))
            try:
                self.ahead.want(upcoming(self.reader.index, ids[stop - start:], views.__contains__))
            finally:
                shards.keep = frozenset()

    def _read(self, ids, alloc) -> RawBatch:
        """The reader's batch; a cached copy found damaged (checksums, size) is
        discarded and fetched again, verified, and the batch read once more.
        Damaged bytes are never returned either way. A cache that fetches
        sample ranges (cache/ranged_reads.py) brings the batch's first."""
        cached = self.cached
        if cached is None:
            return self._read_once(ids, alloc)
        # a prefetch for this step leaves what it consumes be
        from shardfeed.loader.caching import step_key  # a cache's read only: local reads import none of it

        key = self.batch_key
        cached.batch_step = None if key is None else step_key(key[1], key[2])
        token = cached.prepare(ids)
        try:
            return self._read_once(ids, alloc)
        finally:
            self.cached.finish(token)

    def _read_once(self, ids, alloc) -> RawBatch:
        try:
            raw = self.reader.read(ids, alloc)
        except ShardError as e:
            if not self._refetch([e.shard]):
                raise
            return self._read_again(ids, alloc)
        if raw.errors and self._refetch([err.shard for err in raw.errors]):
            return self._read_again(ids, alloc)
        return raw

    def _read_again(self, ids, alloc) -> RawBatch:
        if self.cached is None:
            return self.reader.read(ids, alloc)
        token = self.cached.prepare(ids)  # a discarded partial copy: its ranges again, checked
        try:
            return self.reader.read(ids, alloc)
        finally:
            self.cached.finish(token)

    def _refetch(self, paths) -> bool:
        if self.cached is None:
            return False
        shards = {s for s in (self.cached.shard_of_path(p) for p in paths) if s is not None} - self._refetched
        self._refetched |= shards  # once per shard: a source damaged at the source stays an error, not a loop
        for s in shards:
            self.reader.shards.forget(s)
            self.cached.refetch(s)
        return bool(shards)

    def make(self, ids: np.ndarray, image_size: int | None = None,
             alloc: Callable[[int], np.ndarray] | None = None) -> tuple[Any, dict]:
        """(columns, info): info has read_s, decode_s, collate_s, bytes, errors (ReadError records), samples."""
        t0 = time.perf_counter()
        fast = self.transform is None and self.collate_fn is None
        if fast and alloc is None:
            alloc = self._scratch.alloc
        raw = self._read(ids, alloc if fast else None)
        t1 = time.perf_counter()
        errors = list(raw.errors)
        if fast:
            columns = self._columns(raw, image_size, errors)
            t2 = t3 = time.perf_counter()
        else:
            key = self.batch_key
            with seeded(key, self.restore_rng) if key is not None else nullcontext():
                rng = generator(key) if self.transform_takes_rng and key is not None else None
                samples = self._samples(raw, image_size, errors, rng)
                t2 = time.perf_counter()
                columns = (self.collate_fn or default_collate)(samples)
            t3 = time.perf_counter()
        info = {"read_s": t1 - t0, "decode_s": t2 - t1, "collate_s": t3 - t2, "bytes": raw.bytes_read,
                "errors": errors, "samples": _rows(columns, raw)}
        if self.cached is not None:
            info["cache"] = self.cached.take()
        return columns, info

    # -- fast path: whole columns ---------------------------------------
    def _columns(self, raw: RawBatch, image_size, errors) -> dict:
        n = len(raw)
        cols: dict[str, Any] = {"__key__": raw.keys if raw.key_blob is None else Strs(raw.key_blob, n)}
        bad = np.zeros(n, np.bool_)
        reasons: dict[int, str] = {}
        for name, spec in raw.fields.items():
            kind = spec[0]
            if kind == "objects":  # bytes made by the gather itself (gather_into_bytes)
                cols[name] = BytesList(spec[1])
                continue
            if kind == "array":
                vals = spec[1]
                cols[name] = vals if vals.dtype != object else vals.tolist()
                continue
            starts, sizes = spec[1], spec[2]
            if kind == "text":
                cols[name] = Blob(raw.buf, starts, sizes, text=True)
                continue
            codec = self._codecs.get(name)
            if codec is None:
                codec = self._codecs[name] = self._codec(name)
            if codec == "bytes":
                cols[name] = Blob(raw.buf, starts, sizes)
            elif codec in ("npy", "numeric") and (
                    arr := gathered_column(codec, name, raw.buf, starts, sizes)) is not None:
                cols[name] = arr  # equal shapes: one jitted gather, no decode per sample
            elif codec == "int":
                vals, ok = parse_ints(raw.buf, starts, sizes)
                if ok.all():  # every value present and an integer: the usual case, no masks
                    cols[name] = vals
                    continue
                missing = sizes < 0
                if (~ok & ~missing).any():
                    for r in np.flatnonzero(~ok & ~missing).tolist():
                        bad[r] = True
                        reasons.setdefault(r, f"field {name!r} is not an integer")
                cols[name] = vals if not missing.any() else [None if m else int(v) for v, m in zip(vals, missing)]
            else:
                mv = memoryview(raw.buf)
                values = []
                for r, (a, s) in enumerate(zip(starts.tolist(), sizes.tolist())):
                    if s < 0:
                        values.append(None)
                        continue
                    try:
                        if codec == "text":
                            values.append(str(mv[a:a + s], "utf-8"))
                        else:
                            values.append(decode_field(name, mv[a:a + s], self.unsafe, image_size))
                    except Exception as e:  # a corrupt payload in any codec: attributed to its sample
                        bad[r] = True
                        reasons.setdefault(r, f"field {name!r} does not decode: {type(e).__name__}: {e}")
                        values.append(None)
                cols[name] = values
        if reasons:  # a reason is recorded for every bad sample
            self._bad_samples(raw, bad, reasons, errors)
            cols = _drop_rows(cols, ~bad)
        for name, col in list(cols.items()):
            if isinstance(col, list) and name != "__key__" and col and all(v is not None for v in col):
                cols[name] = collate_column(col)
        return cols

    def _codec(self, name: str) -> str:
        """How a byte field is turned into values (codecs.codec_of, or bytes when not decoding or unsafe)."""
        codec = codec_of(name) if self.decode else "bytes"
        return "bytes" if codec == "pickle" and not self._unsafe(name) else codec

    def _unsafe(self, name: str) -> bool:
        return name in self.unsafe or name.rsplit(".", 1)[-1] in self.unsafe

    def _bad_samples(self, raw: RawBatch, bad: np.ndarray, reasons: dict, errors: list) -> None:
        rows = np.flatnonzero(bad).tolist()
        paths = [self.reader.index.path(int(raw.shards[r])) for r in rows]
        if not self.policy.skip:
            r = rows[0]
            raise ShardError(paths[0], f"sample {raw.keys[r]!r}: {reasons[r]}")
        for r, p in zip(rows, paths):
            errors.append(ReadError(p, f"sample {raw.keys[r]!r}: {reasons[r]}", 1))

    # -- slow path: per-sample dicts for a transform or a custom collate --
    def _samples(self, raw: RawBatch, image_size, errors, rng=None) -> list[dict]:
        mv = memoryview(raw.buf)
        out = []
        kw = {}
        if self.transform_takes_size:
            kw["image_size"] = image_size
        if self.transform_takes_rng:
            kw["rng"] = rng if rng is not None else np.random.default_rng()
        columns = {name: spec for name, spec in raw.fields.items()}
        for r in range(len(raw)):
            sample: dict[str, Any] = {"__key__": raw.keys[r]}
            try:
                for name, spec in columns.items():
                    if spec[0] == "array":
                        v = spec[1][r]
                        sample[name] = v.item() if isinstance(v, np.generic) else v
                        continue
                    a, s = int(spec[1][r]), int(spec[2][r])
                    if s < 0:
                        continue
                    if spec[0] == "text":
                        sample[name] = str(mv[a:a + s], "utf-8")
                    elif self.decode:
                        sample[name] = decode_field(name, mv[a:a + s], self.unsafe, image_size)
                    else:
                        sample[name] = bytes(mv[a:a + s])
            except Exception as e:
                path = self.reader.index.path(int(raw.shards[r]))
                reason = f"sample {raw.keys[r]!r} does not decode: {type(e).__name__}: {e}"
                if not self.policy.skip:
                    raise ShardError(path, reason) from e
                errors.append(ReadError(path, reason, 1))
                continue
            if self.transform is not None:
                sample = self.transform(sample, **kw)
            out.append(sample)
        return out


def _drop_rows(cols: dict, keep: np.ndarray) -> dict:
    idx = np.flatnonzero(keep)
    out = {}
    for name, col in cols.items():
        if isinstance(col, np.ndarray):
            out[name] = col[idx]
        elif isinstance(col, Blob):
            out[name] = Blob(col.buf, col.starts[idx], col.sizes[idx], col.text)
        elif isinstance(col, Strs):
            items = col.to_list()
            out[name] = [items[i] for i in idx.tolist()]
        else:
            out[name] = [col[i] for i in idx.tolist()]
    return out


def _rows(columns, raw: RawBatch) -> int:
    if isinstance(columns, dict) and "__key__" in columns:
        return len(columns["__key__"])
    return len(raw)
