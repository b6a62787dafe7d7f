"""A reopened shard parses its sidecar once (formats/sidecar_memo.py), and changed bytes are parsed again."""

from __future__ import annotations

import os

import pytest

from shardfeed.formats import ShardError, ShardWriter, open_index, open_shard, sidecar_memo


def _dataset(tmp_path, n=12, per=4, fill=0):
    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=per) as w:
        for i in range(n):
            w.write({"__key__": f"k{i:03d}", "cls": i, "bin": bytes([i + fill]) * 64})
    return root


def _read_all(index, i):
    with open_shard(index, i) as r:
        return [r.read(j)["bin"] for j in range(len(r))]


def test_reopening_a_shard_parses_its_sidecar_once(tmp_path):
    index = open_index(_dataset(tmp_path))
    sidecar_memo.forget()
    before = sidecar_memo.parses
    first = [_read_all(index, i) for i in range(len(index))]
    assert sidecar_memo.parses - before == len(index)
    for _ in range(3):
        assert [_read_all(index, i) for i in range(len(index))] == first
    assert sidecar_memo.parses - before == len(index)  # 3 more opens of each shard, no parse


def test_damaged_sidecar_with_its_old_timestamps_is_parsed_again_and_refused(tmp_path):
    index = open_index(_dataset(tmp_path))
    sidecar_memo.forget()
    _read_all(index, 1)
    side = index.path(1) + ".idx"
    st = os.stat(side)
    raw = bytearray(open(side, "rb").read())
    raw[len(raw) // 2] ^= 0xFF  # same size, in place, timestamps put back: only the bytes tell
    with open(side, "r+b") as f:
        f.write(raw)
    os.utime(side, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(ShardError):
        _read_all(index, 1)


def test_a_replaced_sidecar_is_read_as_it_is_now(tmp_path):
    index = open_index(_dataset(tmp_path))
    sidecar_memo.forget()
    _read_all(index, 0)
    # another shard's sidecar of the same size (same keys and layout, other payloads), renamed into place
    other = _dataset(tmp_path / "other", n=4, per=4, fill=100)
    side = index.path(0) + ".idx"
    with open(os.path.join(other, os.path.basename(index.path(0)) + ".idx"), "rb") as f:
        replacement = f.read()
    assert len(replacement) == os.path.getsize(side) and replacement != open(side, "rb").read()
    with open(side + ".new", "wb") as f:
        f.write(replacement)
    os.replace(side + ".new", side)
    before = sidecar_memo.parses
    with pytest.raises(ShardError):  # written for another shard: refused, not the parse of the old one
        _read_all(index, 0)
    assert sidecar_memo.parses == before + 1


def test_a_kept_table_is_validated_once_per_shard_size(tmp_path, monkeypatch):
    from shardfeed.formats.sidecar import SampleTable

    index = open_index(_dataset(tmp_path))
    sidecar_memo.forget()
    checked = []
    real = SampleTable.validate
    monkeypatch.setattr(SampleTable, "validate", lambda self, shard, n: (checked.append((shard, n)), real(self, shard, n)))
    first = _read_all(index, 2)
    for _ in range(3):
        assert _read_all(index, 2) == first
    assert checked == [(index.path(2), os.path.getsize(index.path(2)))]
