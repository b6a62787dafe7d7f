"""Convert's inputs by kind: which kind SRC holds, opened as a source (image folders and shards here,
tables in table_sources.py); each source is a numbered list of samples read by id.

Every source numbers its samples 0..n-1 in a fixed order (files sorted by
name, rows in file order) and reads any batch of ids, so the converter can
shuffle (a permutation of ids) and split the work into parts without the
source knowing. Sources are pickled to worker processes: open files live
in a small per-process cache dropped on pickling.

Kinds (``open_source``): ``images`` (a folder of class subfolders),
``jsonl``, ``csv``, ``parquet`` (files, a folder of them or a glob),
``tar`` (WebDataset tars: .tar, .tar.gz/.tgz, .tar.zst) and ``dataset``
(a shardfeed dataset folder with an index, any shard format).
"""

from __future__ import annotations

import glob
import io
import os
from typing import Any

import numpy as np

from shardfeed.formats import ShardError, codec_of, open_index, open_shard
from shardfeed.formats.writer import check_key
from shardfeed.tools.convert.source_base import Source, UnitSource
from shardfeed.tools.text import plural

KINDS = ("images", "jsonl", "csv", "parquet", "tar", "dataset")
_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet",
             ".tar": "tar", ".tgz": "tar", ".tar.gz": "tar", ".tar.zst": "tar"}


def kind_of_file(name: str) -> str | None:
    for suffix, kind in _SUFFIXES.items():
        if name.lower().endswith(suffix):
            return kind
    return None


class ImageFolderSource(Source):
    """``ROOT/<class>/**/<file>.<image ext>`` -> ``{"__key__": "<class>/<stem>", ext: bytes, "cls": i}``.

    ``ext`` is the file's extension (lower case, ``jpeg`` -> ``jpg``), or
    ``image_field`` for every image (one column when the folder mixes types).

    Classes are the subfolder names in sorted order (torchvision's
    ImageFolder convention); ``classes.txt`` beside the shards lists them,
    line ``i`` naming class ``i``. Hidden files and non-image files are
    skipped and counted.
    """

    kind = "images"

    def __init__(self, root: str, image_field: str | None = None):
        self.root = root
        self.image_field = image_field
        self.classes = sorted(d for d in os.listdir(root)
                              if not d.startswith(".") and os.path.isdir(os.path.join(root, d)))
        if not self.classes:
            raise ShardError(root, "no class subfolders: an image folder holds ROOT/<class>/<image>")
        self.paths: list[str] = []
        self.labels: list[int] = []
        self.keys: list[str] = []
        self.exts: list[str] = []
        self.skipped = 0
        owner: dict[str, str] = {}
        for label, cls in enumerate(self.classes):
            for dirpath, dirnames, filenames in os.walk(os.path.join(root, cls)):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
                for name in sorted(filenames):
                    stem, dot, ext = name.rpartition(".")
                    if name.startswith(".") or not dot or codec_of(ext) != "image":
                        self.skipped += 1
                        continue
                    rel = os.path.relpath(os.path.join(dirpath, name), root)
                    key = "/".join(os.path.dirname(rel).split(os.sep) + [stem.replace(".", "_")])
                    try:
                        check_key(key)
                    except ValueError as e:
                        raise ShardError(os.path.join(root, rel), f"cannot make a key: {e}") from None
                    if key in owner:
                        raise ShardError(os.path.join(root, rel), f"maps to key {key!r} like {owner[key]}; "
                                                                  "rename one of the two files")
                    owner[key] = rel
                    self.paths.append(rel)
                    self.labels.append(label)
                    self.keys.append(key)
                    ext = ext.lower()
                    self.exts.append(image_field or ("jpg" if ext == "jpeg" else ext))
        if not self.paths:
            raise ShardError(root, f"class folders {self.classes[:5]} hold no image files")

    def __len__(self) -> int:
        return len(self.paths)

    def load_many(self, ids) -> list[dict[str, Any]]:
        from PIL import Image, UnidentifiedImageError

        out = []
        for i in np.asarray(ids, np.int64).tolist():
            path = os.path.join(self.root, self.paths[i])
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as e:
                raise ShardError(path, f"cannot read image: {e.strerror or e}") from None
            try:  # header only: catches empty, truncated-at-header and non-image files cheaply
                with Image.open(io.BytesIO(data)):
                    pass
            except (UnidentifiedImageError, OSError, ValueError) as e:
                raise ShardError(path, f"not a readable image: {e}") from None
            out.append({"__key__": self.keys[i], self.exts[i]: data, "cls": self.labels[i], "__src__": path})
        return out

    def extra_files(self) -> dict[str, str]:
        return {"classes.txt": "".join(c + "\n" for c in self.classes)}

    def describe(self) -> str:
        skipped = f", {self.skipped} non-image files skipped" if self.skipped else ""
        return f"image folder, {len(self)} images in {len(self.classes)} classes{skipped}"


class ShardSource(UnitSource):
    """Samples of WebDataset tars (scanned once) or of a shardfeed dataset."""

    max_open = 2  # a compressed tar is held decompressed while open

    def __init__(self, indexes: list, kind: str):
        self.kind = kind
        self.units = [(idx, i) for idx in indexes for i in range(len(idx))]
        super().__init__([idx.counts[i] for idx, i in self.units])
        # A compressed tar is read front to back: a shuffled read decompresses its shard again and
        # again, so the write-time shuffle goes through buckets (order.py) instead.
        self.random_access = not any(idx.formats[i] in ("tar.gz", "tar.zst") for idx, i in self.units)
        self.extra = {}
        for idx in indexes:  # a dataset converted from images keeps its class names
            path = os.path.join(idx.root, "classes.txt")
            if kind == "dataset" and os.path.isfile(path) and os.path.getsize(path) < (16 << 20):
                with open(path, encoding="utf-8") as f:
                    self.extra["classes.txt"] = f.read()

    def _open_unit(self, u: int):
        idx, i = self.units[u]
        return open_shard(idx, i)

    def _read(self, reader, u: int, local: int, sample_id: int) -> dict[str, Any]:
        sample = reader.read(local)
        sample["__src__"] = reader.path
        return sample

    def extra_files(self) -> dict[str, str]:
        return dict(self.extra)

    def describe(self) -> str:
        what = "WebDataset tar" if self.kind == "tar" else "dataset shard"
        return f"{plural(len(self.units), what)}, {plural(len(self), 'sample')}"


def _table_source(kind: str, files: list[str], fields, key_column):
    from shardfeed.tools.convert.table_sources import (
        CsvSource,
        JsonlSource,
        ParquetSource,
    )

    cls = {"jsonl": JsonlSource, "csv": CsvSource, "parquet": ParquetSource}[kind]
    return cls(files, fields, key_column)


def resolve_inputs(src: str) -> tuple[str, list[str]]:
    """(kind, files) for SRC: a file, a glob, a folder of files, an image folder or a dataset."""
    if "://" in src:
        raise ShardError(src, "convert reads local files; copy remote data first")
    if os.path.isdir(src):
        if os.path.exists(os.path.join(src, "index.arrow")) or os.path.isdir(os.path.join(src, "_log")):
            return "dataset", [src]
        names = sorted(n for n in os.listdir(src) if not n.startswith(".") and os.path.isfile(os.path.join(src, n)))
        kinds = {kind_of_file(n) for n in names} - {None}
        if len(kinds) > 1:
            raise ShardError(src, f"holds several input kinds {sorted(kinds)}; pass one kind with a glob "
                                  "such as 'DIR/*.jsonl' or --source-type")
        if kinds:
            kind = kinds.pop()
            return kind, [os.path.join(src, n) for n in names if kind_of_file(n) == kind]
        return "images", [src]
    if os.path.isfile(src):
        kind = kind_of_file(src)
        if kind is None:
            raise ShardError(src, "unknown input type; expected .jsonl .csv .parquet .tar .tar.gz .tgz "
                                  ".tar.zst, a folder of class subfolders, or pass --source-type")
        return kind, [src]
    if glob.has_magic(src):
        files = sorted(f for f in glob.glob(src) if os.path.isfile(f))
        if not files:
            raise ShardError(src, "the pattern matches no files")
        kinds = {kind_of_file(f) for f in files}
        if len(kinds) != 1 or None in kinds:
            raise ShardError(src, f"the pattern matches files of kinds {sorted(map(str, kinds))}; "
                                  "match one kind (.jsonl, .csv, .parquet or tars)")
        return kinds.pop(), files
    raise ShardError(src, "no such file, folder or matching pattern")


def open_source(src: str, kind: str | None = None, fields=(), key_column: str | None = None,
                image_field: str | None = None) -> Source:
    """The source for SRC (``kind`` overrides detection)."""
    detected, files = resolve_inputs(src)
    if kind and kind != detected:
        if kind in ("images", "dataset") and os.path.isdir(src):
            files = [src]
        elif kind in ("images", "dataset"):
            raise ShardError(src, f"--source-type {kind} needs a folder")
        elif os.path.isdir(src):
            files = sorted(os.path.join(src, n) for n in os.listdir(src)
                           if not n.startswith(".") and os.path.isfile(os.path.join(src, n)))
    kind = kind or detected
    if kind not in KINDS:
        raise ValueError(f"source type {kind!r} is not one of {', '.join(KINDS)}")
    if (fields or key_column) and kind in ("images", "tar", "dataset"):
        raise ValueError(f"--field and --key-column apply to table sources (jsonl, csv, parquet), not {kind}")
    if image_field and kind != "images":
        raise ValueError(f"--image-field applies to image folders, not {kind}")
    if kind == "images":
        return ImageFolderSource(files[0], image_field)
    if kind == "dataset":
        return ShardSource([open_index(files[0])], "dataset")
    if kind == "tar":
        return ShardSource([open_index(f) for f in files], "tar")
    return _table_source(kind, files, fields, key_column)
