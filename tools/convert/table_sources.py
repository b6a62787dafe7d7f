"""JSONL, CSV and Parquet inputs for convert: one sample per row.

JSONL and CSV files are scanned once for the byte offset of every record,
so any row is read by seeking (shuffles and parallel parts stay cheap and
memory is 8-16 bytes per row). Parquet is read one row group at a time.
Rows become samples through ``field_map.RowMapper``.
"""

from __future__ import annotations

import csv
import io
import json
import mmap
import os
from typing import Any

import numpy as np

from shardfeed.formats import ShardError
from shardfeed.tools.convert.field_map import RowMapper
from shardfeed.tools.convert.source_base import UnitSource
from shardfeed.tools.text import plural


def _line_starts(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(start offset, 1-based line number) of every non-blank line."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            buf = np.frombuffer(mm, np.uint8)
            newlines = np.flatnonzero(buf == 10)
            starts = np.concatenate([[0], newlines + 1]).astype(np.int64)
            ends = np.concatenate([newlines, [size]]).astype(np.int64)
            numbers = np.arange(1, len(starts) + 1, dtype=np.int64)
            keep = ends > starts
            # a line holding only "\r" or spaces is blank too (rare: checked one by one)
            short = np.flatnonzero(keep & (ends - starts <= 2))
            for j in short.tolist():
                if not bytes(buf[starts[j]:ends[j]]).strip():
                    keep[j] = False
            del buf
    return starts[keep], numbers[keep]


class JsonlSource(UnitSource):
    kind = "jsonl"
    max_open = 8

    def __init__(self, files: list[str], fields=(), key_column: str | None = None):
        self.files = list(files)
        self.mapper = RowMapper("jsonl", list(fields), key_column)
        self.starts, self.lines = [], []
        for path in self.files:
            try:
                s, n = _line_starts(path)
            except OSError as e:
                raise ShardError(path, f"cannot read: {e.strerror or e}") from None
            self.starts.append(s)
            self.lines.append(n)
        super().__init__([len(s) for s in self.starts])

    def _open_unit(self, u: int):
        return open(self.files[u], "rb")

    def _read(self, f, u: int, local: int, sample_id: int) -> dict[str, Any]:
        f.seek(int(self.starts[u][local]))
        where = f"{self.files[u]}:{int(self.lines[u][local])}"
        line = f.readline()
        try:
            row = json.loads(line)
        except (ValueError, UnicodeDecodeError) as e:
            raise ShardError(where, f"malformed JSON line: {e}") from None
        if not isinstance(row, dict):
            raise ShardError(where, f"line holds a JSON {type(row).__name__}, not an object")
        return self.mapper.sample(row, sample_id, where, os.path.dirname(self.files[u]))

    def describe(self) -> str:
        return f"{plural(len(self.files), 'JSONL file')}, {plural(len(self), 'row')}"


class CsvSource(UnitSource):
    """CSV with a header row; quoted cells may span lines."""

    kind = "csv"
    max_open = 8

    def __init__(self, files: list[str], fields=(), key_column: str | None = None):
        self.files = list(files)
        self.mapper = RowMapper("csv", list(fields), key_column)
        self.headers, self.starts, self.lines = [], [], []
        for path in self.files:
            header, starts, lines = self._scan(path)
            self.headers.append(header)
            self.starts.append(starts)
            self.lines.append(lines)
        super().__init__([len(s) for s in self.starts])

    @staticmethod
    def _scan(path: str):
        offsets, numbers = [], []
        pos = [0, 0]  # byte offset and line number of the next line

        def lines(f):
            for raw in f:
                offsets.append(pos[0])
                numbers.append(pos[1] + 1)
                pos[0] += len(raw)
                pos[1] += 1
                try:
                    yield raw.decode("utf-8-sig" if pos[1] == 1 else "utf-8")
                except UnicodeDecodeError as e:
                    raise ShardError(f"{path}:{pos[1]}", f"not UTF-8 text: {e}") from None

        try:
            with open(path, "rb") as f:
                reader = csv.reader(lines(f))
                header = next(reader, None)
                if header is None:
                    raise ShardError(path, "empty CSV file (no header row)")
                starts, nums = [], []
                consumed = len(offsets)
                for row in reader:
                    if row:  # csv yields [] for blank lines
                        starts.append(offsets[consumed])
                        nums.append(numbers[consumed])
                    consumed = len(offsets)
        except OSError as e:
            raise ShardError(path, f"cannot read: {e.strerror or e}") from None
        except csv.Error as e:
            raise ShardError(f"{path}:{pos[1]}", f"malformed CSV: {e}") from None
        if len(set(header)) != len(header):
            raise ShardError(path, f"header {header} names a column twice")
        return header, np.asarray(starts, np.int64), np.asarray(nums, np.int64)

    def _open_unit(self, u: int):
        return open(self.files[u], "rb")

    def _read(self, f, u: int, local: int, sample_id: int) -> dict[str, Any]:
        f.seek(int(self.starts[u][local]))
        where = f"{self.files[u]}:{int(self.lines[u][local])}"
        text = io.TextIOWrapper(f, encoding="utf-8", newline="")
        try:
            row = next(csv.reader(text))
        except (csv.Error, UnicodeDecodeError, StopIteration) as e:
            raise ShardError(where, f"malformed CSV row: {e}") from None
        finally:
            text.detach()
        header = self.headers[u]
        if len(row) != len(header):
            raise ShardError(where, f"row has {len(row)} cells but the header has {len(header)} columns")
        return self.mapper.sample(dict(zip(header, row)), sample_id, where, os.path.dirname(self.files[u]))

    def describe(self) -> str:
        return f"{plural(len(self.files), 'CSV file')}, {plural(len(self), 'row')}"


class ParquetSource(UnitSource):
    """One unit per row group; only the columns the mapping needs are read."""

    kind = "parquet"
    max_open = 2

    def __init__(self, files: list[str], fields=(), key_column: str | None = None):
        import pyarrow.parquet as pq

        self.files = list(files)
        self.mapper = RowMapper("parquet", list(fields), key_column)
        self.groups: list[tuple[int, int]] = []
        counts = []
        from shardfeed.formats.readers import FOOTER_ERRORS

        for fi, path in enumerate(self.files):
            # a damaged footer breaks pyarrow's metadata parse (and each field read) in many ways
            try:
                md = pq.ParquetFile(path).metadata
                rows = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
            except FOOTER_ERRORS as e:
                raise ShardError(path, f"not a readable Parquet file: {type(e).__name__}: {e}") from None
            if any(n < 0 for n in rows):
                raise ShardError(path, f"not a readable Parquet file: a row group claims {min(rows)} rows")
            for g, n in enumerate(rows):
                self.groups.append((fi, g))
                counts.append(n)
        super().__init__(counts)
        self.columns = None
        if fields:
            wanted = [f.column for f in fields] + ([key_column] if key_column else [])
            self.columns = list(dict.fromkeys(wanted))

    def _open_unit(self, u: int):
        import pyarrow.parquet as pq

        from shardfeed.formats.readers import FOOTER_ERRORS

        fi, g = self.groups[u]
        path = self.files[fi]
        try:
            pf = pq.ParquetFile(path)
            cols = self.columns
            if cols is not None and "__key__" in pf.schema_arrow.names and "__key__" not in cols:
                cols = cols + ["__key__"]
            missing = [c for c in cols or () if c not in pf.schema_arrow.names]
            if missing:
                raise ShardError(path, f"columns {missing} are missing; the file has {pf.schema_arrow.names}")
            table = pf.read_row_group(g, columns=cols)
            table.validate(full=True)
            want = int(self.offsets[u + 1] - self.offsets[u])
            if table.num_rows != want:  # rows are addressed by the metadata's counts
                raise ShardError(path, f"row group {g} holds {table.num_rows} rows but the file's metadata says "
                                       f"{want} (corrupt file)")
            return {name: table.column(name).to_pylist() for name in table.column_names}
        except FOOTER_ERRORS as e:
            raise ShardError(path, f"row group {g} is unreadable: {type(e).__name__}: {e}") from None

    def _close_unit(self, unit) -> None:
        pass

    def _read(self, cols, u: int, local: int, sample_id: int) -> dict[str, Any]:
        fi, g = self.groups[u]
        row = {name: col[local] for name, col in cols.items()}
        where = f"{self.files[fi]} (row group {g}, row {local})"
        return self.mapper.sample(row, sample_id, where, os.path.dirname(self.files[fi]))

    def describe(self) -> str:
        return f"{plural(len(self.files), 'Parquet file')}, {plural(len(self), 'row')} in {plural(len(self.groups), 'row group')}"
