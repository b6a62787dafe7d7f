"""formats/arrow_ipc.py and own_tables.py, the pyarrow-free read of index.arrow and sidecars, against
pyarrow itself: on real files they give pyarrow's values; on every single-byte flip and every
truncation of real files, whatever they accept pyarrow accepts too, with the same values (they may
decline more: pyarrow then reads the file); and what they decline still reads, through pyarrow."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pytest

from shardfeed.formats import ShardError, ShardWriter, arrow_ipc, own_tables, sidecar

pytestmark = pytest.mark.hostile(timeout=240)  # bounded time and memory (conftest.py)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ipc") / "ds")
    with ShardWriter(root, format="tar", max_shard_samples=5) as w:
        for i in range(7):  # keys of 1-, 2- and 3-byte UTF-8 characters; members of two fields
            w.write({"__key__": f"k{i}-é€"[: 3 + i % 4], "bin": bytes([i]) * (i + 1), "cls": i})
    return root


def _pyarrow_columns(tbl: pa.Table) -> dict:
    out = {}
    for name in tbl.column_names:
        col = tbl.column(name).combine_chunks()
        if pa.types.is_dictionary(col.type):
            col = col.dictionary_decode()
        out[name] = col.to_pylist()
    return out


def _fast_columns(fields, columns) -> dict:
    out = {}
    for name, _, t in fields:
        col = columns[name]
        if t[0] == "utf8":
            offs, data = col
            out[name] = [bytes(data[a:b]).decode() for a, b in zip(offs[:-1], offs[1:])]
        elif t[0] in ("list", "large_list"):
            offs, values = col
            out[name] = [values[a:b].tolist() for a, b in zip(offs[:-1], offs[1:])]
        elif t[0] == "dict":
            out[name] = list(col)
        else:
            out[name] = col.tolist()
    return out


def _pyarrow(raw: bytes):
    try:
        tbl = pa.ipc.open_file(pa.py_buffer(raw)).read_all()
        tbl.validate(full=True)
        return tbl
    except (pa.ArrowException, OSError, ValueError, TypeError, KeyError, IndexError, OverflowError):
        return None


def _fast(raw: bytes):
    try:
        return arrow_ipc.read(raw)
    except arrow_ipc.Declined:
        return None


def _same(fast, tbl) -> bool:
    fields, meta, columns = fast
    return (meta == (tbl.schema.metadata or {}) and [f[0] for f in fields] == tbl.column_names
            and [f[1] for f in fields] == [f.nullable for f in tbl.schema]
            and _fast_columns(fields, columns) == _pyarrow_columns(tbl))


def _files(root):
    return [os.path.join(root, "index.arrow")] + sorted(
        os.path.join(root, n) for n in os.listdir(root) if n.endswith(".idx"))


def test_real_files_read_as_pyarrow_reads_them(ds):
    for path in _files(ds):
        raw = open(path, "rb").read()
        fast = arrow_ipc.read(raw)
        assert _same(fast, _pyarrow(raw)), path
        if path.endswith(".idx"):  # and own_tables builds exactly pyarrow's sample table
            mine, meta = own_tables.sidecar(raw)
            theirs, meta2 = own_tables._read_sidecar_pyarrow(path, path)
            assert meta == meta2 and list(mine.keys) == list(theirs.keys) and mine.fields == theirs.fields
            for k in ("member_start", "offset", "size", "member_field", "checksum"):
                a, b = getattr(mine, k), getattr(theirs, k)
                assert a.dtype == b.dtype and a.tolist() == b.tolist(), k
        else:
            m, cols = own_tables.index(raw, path)
            m2, cols2 = _parse_index_with_pyarrow(raw, path)
            assert m == m2 and [list(c) for c in cols] == [list(c) for c in cols2]
            assert [c.dtype for c in cols[2:4]] == [c.dtype for c in cols2[2:4]] == [np.int64, np.int64]


def _parse_index_with_pyarrow(raw, path, monkeypatch=None):
    real = own_tables.index
    own_tables.index = lambda *a: (_ for _ in ()).throw(own_tables.Declined("test: pyarrow's path"))
    try:
        return own_tables.parse_index_bytes(raw, path)
    finally:
        own_tables.index = real


@pytest.mark.parametrize("which", ["index", "sidecar"])
def test_every_flip_it_accepts_pyarrow_accepts_with_the_same_values(ds, which):
    path = _files(ds)[0 if which == "index" else 1]
    orig = open(path, "rb").read()
    taken = 0
    for i in range(len(orig)):
        for mask in (0x01, 0x80, 0xFF):
            b = bytearray(orig)
            b[i] ^= mask
            raw = bytes(b)
            fast = _fast(raw)
            if fast is None:
                continue
            taken += 1
            tbl = _pyarrow(raw)
            assert tbl is not None, f"byte {i} ^ {mask:#x}: accepted here, refused by pyarrow"
            assert _same(fast, tbl), f"byte {i} ^ {mask:#x}: values differ from pyarrow's"
            # and the table level accepts it only where pyarrow's path does, with the same result
            if which == "sidecar":
                try:
                    mine = own_tables.sidecar(raw)
                except own_tables.Declined:
                    continue
                tmp = path + ".flip"
                with open(tmp, "wb") as f:
                    f.write(raw)
                theirs = own_tables._read_sidecar_pyarrow(tmp, tmp)
                os.unlink(tmp)
                assert mine[1] == theirs[1] and list(mine[0].keys) == list(theirs[0].keys)
            else:
                try:
                    mine = own_tables.index(raw, path)
                except own_tables.Declined:
                    continue
                assert [list(c) for c in mine[1]] == [list(c) for c in _parse_index_with_pyarrow(raw, path)[1]]
    assert taken < len(orig) * 3  # most flips are declined (a flip in padding may be taken, as by pyarrow)


@pytest.mark.parametrize("which", ["index", "sidecar"])
def test_truncated_or_extended_files_are_declined_or_read_as_pyarrow_reads_them(ds, which):
    orig = open(_files(ds)[0 if which == "index" else 1], "rb").read()
    for raw in [orig[:n] for n in range(len(orig))] + [orig + b"\0" * k for k in (1, 8)] + [b"", b"ARROW1"]:
        fast = _fast(raw)
        if fast is not None:
            tbl = _pyarrow(raw)
            assert tbl is not None and _same(fast, tbl), len(raw)
    assert all(_fast(orig[:n]) is None for n in range(len(orig)))


def test_a_sidecar_laid_out_otherwise_is_read_through_pyarrow(ds, tmp_path):
    path = _files(ds)[1]
    tbl = pa.ipc.open_file(pa.memory_map(path)).read_all()
    # the same table in record batches of 2 rows: valid Arrow this reader does not take
    out = str(tmp_path / "s.tar.idx")
    with pa.OSFile(out, "wb") as sink, pa.ipc.new_file(sink, tbl.schema) as w:
        w.write_table(tbl, max_chunksize=2)
    with pytest.raises(arrow_ipc.Declined, match="exactly one record batch"):
        arrow_ipc.read(open(out, "rb").read())
    got, meta = own_tables.read_sidecar(out, "s.tar")
    want, meta2 = own_tables._read_sidecar_pyarrow(path, path)
    assert meta == meta2 and list(got.keys) == list(want.keys) and got.offset.tolist() == want.offset.tolist()


def test_large_list_sidecars_are_read_too(ds, tmp_path):
    path = _files(ds)[1]
    tbl = pa.ipc.open_file(pa.memory_map(path)).read_all()
    cols = {n: tbl.column(n).combine_chunks() for n in tbl.column_names}
    for n in ("offset", "size", "field"):
        cols[n] = cols[n].cast(pa.large_list(cols[n].type.value_type))
    big = pa.table(cols)
    meta = json.loads(tbl.schema.metadata[b"shardfeed.sidecar"])
    meta["digest"] = sidecar.table_digest(big, meta)
    big = big.replace_schema_metadata({b"shardfeed.sidecar": json.dumps(meta).encode()})
    out = str(tmp_path / "big.tar.idx")
    with pa.OSFile(out, "wb") as sink, pa.ipc.new_file(sink, big.schema) as w:
        w.write_table(big)
    raw = open(out, "rb").read()
    fields, _, _ = arrow_ipc.read(raw)
    assert fields[2][2][0] == "large_list"
    mine, m1 = own_tables.sidecar(raw)
    theirs, m2 = own_tables._read_sidecar_pyarrow(out, out)
    assert m1 == m2 and mine.offset.tolist() == theirs.offset.tolist() and list(mine.keys) == list(theirs.keys)


def test_a_damaged_sidecar_still_names_its_shard(ds, tmp_path):
    raw = bytearray(open(_files(ds)[1], "rb").read())
    raw[len(raw) // 2] ^= 0xFF
    bad = str(tmp_path / "x.tar.idx")
    open(bad, "wb").write(bytes(raw))
    with pytest.raises(ShardError, match="x.tar"):
        own_tables.read_sidecar(bad, "x.tar")


def test_types_outside_the_project_schemas_are_declined(tmp_path):
    # a list of lists (a forged file could nest them as deep as it is long), nulls, other widths
    for arr in (pa.array([[[1], [2, 3]]], pa.list_(pa.list_(pa.int64()))), pa.array(["a", None]),
                pa.array([1.5], pa.float64()), pa.array([1], pa.int8())):
        sink = pa.BufferOutputStream()
        tbl = pa.table({"x": arr})
        with pa.ipc.new_file(sink, tbl.schema) as w:
            w.write_table(tbl)
        with pytest.raises(arrow_ipc.Declined):
            arrow_ipc.read(sink.getvalue().to_pybytes())


def test_sidecars_with_the_same_footer_tail_parse_their_fields_once(ds, monkeypatch):
    """A fresh process's first ``global`` batch opens every sidecar; the fields (half of a parse) are read
    once per distinct footer tail (arrow_ipc._fields), and a tail that differs, even in one byte of a
    field's name, is parsed again and gives that file's own fields."""
    calls = []
    real = arrow_ipc._type
    monkeypatch.setattr(arrow_ipc, "_type", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(arrow_ipc, "_FIELDS_MEMO", {})
    sidecars = _files(ds)[1:]
    assert len(sidecars) == 2
    first = [arrow_ipc.read(open(p, "rb").read())[0] for p in sidecars]
    assert first[0] == first[1] and len(calls) == 8  # 5 fields, 3 of them lists: the first file only
    raw = bytearray(open(sidecars[1], "rb").read())
    at = raw.rindex(b"checksum")  # the field name, in the footer's tail
    raw[at:at + 8] = b"checksun"
    fields, meta, columns = arrow_ipc.read(bytes(raw))
    assert [f[0] for f in fields] == ["key", "checksun", "offset", "size", "field"] and len(calls) == 16
    assert _same((fields, meta, columns), _pyarrow(bytes(raw)))
