"""How a table row (JSONL, CSV, Parquet) becomes a sample.

``--field COL=EXT`` stores column COL as field EXT, encoded by EXT's codec
(``cls`` int, ``txt`` text, ``json`` JSON, ``npy`` array, ``jpg``/``png``/``bin``
bytes). Two suffixes read a text cell as bytes: ``COL=EXT:file`` (the cell is a
path, relative to the table's folder, whose bytes are stored) and
``COL=EXT:base64``. With no ``--field``: JSONL and CSV rows become one ``json``
field holding the whole row (lossless, one schema), and Parquet columns become
fields of the same name (so shardfeed's own Parquet shards round-trip).

The key is ``--key-column`` when given, else a ``__key__`` column when the
table has one, else the row's number in the whole source (``%010d``).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardfeed.formats import ShardError, codec_of
from shardfeed.formats.files import read_bounded
from shardfeed.formats.writer import check_field, check_key

_LOADERS = ("file", "base64")
# one file read into one field (an image, a clip): a bound the user can raise
MAX_FIELD_FILE_BYTES = int(os.environ.get("SHARDFEED_MAX_FIELD_FILE_BYTES", 1 << 30))


@dataclass(frozen=True)
class FieldSpec:
    column: str
    ext: str
    loader: str | None = None  # "file" | "base64" | None


def parse_field_specs(specs: list[str] | None) -> list[FieldSpec]:
    out, seen = [], set()
    for spec in specs or ():
        col, sep, target = spec.partition("=")
        ext, _, loader = target.partition(":")
        if not sep or not col or not ext:
            raise ValueError(f"--field {spec!r} is not COL=EXT (e.g. label=cls, caption=txt, path=jpg:file)")
        if loader and loader not in _LOADERS:
            raise ValueError(f"--field {spec!r}: loader {loader!r} is not one of {', '.join(_LOADERS)}")
        try:
            check_field(ext)
        except ValueError as e:
            raise ValueError(f"--field {spec!r}: {e}") from None
        if ext in seen:
            raise ValueError(f"--field {spec!r}: field {ext!r} is given twice")
        seen.add(ext)
        out.append(FieldSpec(col, ext, loader or None))
    return out


class RowMapper:
    """Turns ``{column: value}`` rows of one kind of table into samples."""

    def __init__(self, kind: str, specs: list[FieldSpec], key_column: str | None):
        self.kind = kind  # "jsonl" | "csv" | "parquet"
        self.specs = specs
        self.key_column = key_column

    def sample(self, row: dict[str, Any], row_number: int, where: str, base_dir: str) -> dict[str, Any]:
        key = self._key(row, row_number, where)
        if self.specs:
            fields = {}
            for spec in self.specs:
                if spec.column not in row:
                    raise ShardError(where, f"column {spec.column!r} (from --field) is missing; "
                                            f"the row has {sorted(row)}")
                fields[spec.ext] = self._value(spec, row[spec.column], where, base_dir)
        elif self.kind in ("jsonl", "csv"):
            fields = {"json": {c: v for c, v in row.items() if c not in (self.key_column, "__key__")}}
        else:
            fields = {}
            for col, value in row.items():
                if col in (self.key_column, "__key__"):
                    continue
                try:
                    check_field(col)
                except ValueError:
                    raise ShardError(where, f"column {col!r} is not a field name; map it with "
                                            f"--field '{col}=EXT' (e.g. {_safe(col)}.json)") from None
                fields[col] = self._value(FieldSpec(col, col), value, where, base_dir)
        return {"__key__": key, "__src__": where, **fields}

    def _key(self, row: dict, row_number: int, where: str) -> str:
        col = self.key_column or ("__key__" if "__key__" in row else None)
        if col is None:
            return f"{row_number:010d}"
        if col not in row or row[col] is None or row[col] == "":
            raise ShardError(where, f"key column {col!r} is missing or empty")
        try:
            return check_key(str(row[col]))
        except ValueError as e:
            raise ShardError(where, f"key column {col!r}: {e}") from None

    def _value(self, spec: FieldSpec, value: Any, where: str, base_dir: str) -> Any:
        ext, codec = spec.ext, codec_of(spec.ext)
        what = f"column {spec.column!r} -> field {ext!r}"
        if spec.loader == "file":
            if not isinstance(value, str) or not value:
                raise ShardError(where, f"{what}: expected a file path, got {value!r}")
            path = value if os.path.isabs(value) else os.path.join(base_dir, value)
            try:  # regular files only, bounded: /dev/zero or a FIFO would never end
                return read_bounded(path, MAX_FIELD_FILE_BYTES, where, f"{what}: file",
                                    "SHARDFEED_MAX_FIELD_FILE_BYTES")
            except OSError as e:
                raise ShardError(where, f"{what}: cannot read {path}: {e.strerror or e}") from None
        if spec.loader == "base64":
            try:
                return base64.b64decode(value, validate=True)
            except (binascii.Error, TypeError, ValueError) as e:
                raise ShardError(where, f"{what}: not valid base64 ({e})") from None
        if value is None:
            raise ShardError(where, f"{what}: value is null")
        if codec == "int":
            if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
                return int(value)
            if isinstance(value, str) and value.strip().lstrip("-").isdigit():
                return int(value)
            if isinstance(value, (bytes, bytearray)):
                return bytes(value)
            raise ShardError(where, f"{what}: {value!r} is not an integer")
        if codec == "text":
            if isinstance(value, str):
                return value
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return str(value)
            if isinstance(value, (bytes, bytearray)):
                return bytes(value)
            raise ShardError(where, f"{what}: {type(value).__name__} is not text; use {spec.column}=EXT.json")
        if codec == "json":
            if self.kind == "csv" and isinstance(value, str):
                try:  # a CSV cell mapped to json holds JSON text
                    return json.loads(value)
                except ValueError as e:
                    raise ShardError(where, f"{what}: cell is not JSON text ({e})") from None
            if isinstance(value, (bytes, bytearray)):
                return bytes(value)
            return value
        if codec == "npy":
            if isinstance(value, (bytes, bytearray)):
                return bytes(value)
            try:
                arr = np.asarray(value)
            except ValueError as e:
                raise ShardError(where, f"{what}: not an array ({e})") from None
            if arr.dtype.hasobject:
                raise ShardError(where, f"{what}: ragged or non-numeric values cannot be an .npy array")
            return arr
        if isinstance(value, (bytes, bytearray)):
            return bytes(value)
        if codec == "bytes" and isinstance(value, str):
            return value.encode("utf-8")
        hint = f" (if the cell is a path use --field {spec.column}={ext}:file)" if isinstance(value, str) else ""
        raise ShardError(where, f"{what}: a {type(value).__name__} cannot be stored as {codec} bytes{hint}")


def _safe(col: str) -> str:
    s = "".join(c if c.isalnum() or c in "_-" else "_" for c in col)
    return s if s and s[0].isalnum() else "f" + s
