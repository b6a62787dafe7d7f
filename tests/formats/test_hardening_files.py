"""Hardening, classes "hang on a non-regular file" and "silent truncation":
a FIFO, directory, device or symlink loop where a dataset file should be is
a ShardError at once; a zeroed block inside a tar is an error, not an end."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from shardfeed.formats import ShardError, open_index, open_shard
from shardfeed.formats.files import open_regular, read_bounded

pytestmark = pytest.mark.hostile  # bounded time and memory (conftest.py)


def _swap(path: str, kind: str) -> None:
    os.remove(path)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        os.mkdir(path)
    elif kind == "loop":
        os.symlink(path, path)  # points at itself: ELOOP
    elif kind == "device":
        os.symlink("/dev/zero", path)


KINDS = ["fifo", "dir", "loop", "device"]


@pytest.mark.parametrize("kind", KINDS)
def test_open_regular_refuses_anything_else(tmp_path, kind):
    p = str(tmp_path / "f")
    open(p, "wb").close()
    _swap(p, kind)
    with pytest.raises(ShardError, match="regular file|symlink loop"):
        open_regular(p)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("which", ["shard", "sidecar", "index"])
def test_special_file_in_a_dataset_is_a_shard_error_not_a_hang(make_dataset, kind, which):
    """Regression: a FIFO as a shard, sidecar or index.arrow blocked forever."""
    root = make_dataset(n=10, shard_samples=10)
    idx = open_index(root)
    target = {"shard": idx.path(0), "sidecar": idx.path(0) + ".idx",
              "index": os.path.join(root, "index.arrow")}[which]
    _swap(target, kind)
    with pytest.raises(ShardError):
        open_shard(open_index(root), 0)


@pytest.mark.parametrize("kind", KINDS)
def test_special_file_as_a_commit_log_entry(tmp_path, kind):
    from shardfeed.formats import ShardWriter
    root = str(tmp_path / "live")
    with ShardWriter(root, append=True, max_shard_samples=2) as w:
        for i in range(4):
            w.write({"__key__": f"k{i}", "cls": i})
    log = os.path.join(root, "_log")
    _swap(os.path.join(log, sorted(os.listdir(log))[-1]), kind)
    with pytest.raises(ShardError):
        open_index(root)


@pytest.mark.parametrize("kind", ["fifo", "dir", "loop"])
def test_special_file_named_like_a_foreign_tar(tmp_path, kind):
    """In a folder of foreign tars, a FIFO/dir/loop named x.tar is named and
    skipped under skip, a ShardError under raise."""
    folder = tmp_path / "f"
    folder.mkdir()
    good = folder / "a.tar"
    with tarfile.open(good, "w", format=tarfile.USTAR_FORMAT) as tf:
        info = tarfile.TarInfo("k.txt")
        info.size = 2
        tf.addfile(info, io.BytesIO(b"hi"))
    bad = folder / "b.tar"
    bad.write_bytes(b"")
    _swap(str(bad), kind)
    with pytest.raises(ShardError):
        open_index(str(folder))
    idx = open_index(str(folder), on_error="skip")
    assert idx.names == ["a.tar"] and idx.skipped[0][0].endswith("b.tar")


def test_read_bounded_stops_at_the_bound(tmp_path):
    p = tmp_path / "x"
    p.write_bytes(b"a" * 10)
    assert read_bounded(str(p), 10) == b"a" * 10
    with pytest.raises(ShardError, match="SETTING"):
        read_bounded(str(p), 9, setting="SETTING")


def _tar(members) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_zeroed_block_inside_a_tar_is_an_error_not_an_end(tmp_path):
    """Regression: a zeroed 512-byte header block ended the shard there and the
    samples after it vanished without a word (GNU tar warns)."""
    raw = bytearray(_tar([(f"k{i}.txt", b"x" * 100) for i in range(6)]))
    raw[3 * 1024:3 * 1024 + 512] = bytes(512)  # sample 3's header (each member: header + 1 data block)
    path = tmp_path / "z.tar"
    path.write_bytes(bytes(raw))
    with pytest.raises(ShardError, match="end-of-archive") as ei:
        open_index(str(path))
    assert "z.tar" in ei.value.shard


def test_zero_padding_after_the_end_marker_is_fine(tmp_path):
    path = tmp_path / "p.tar"
    path.write_bytes(_tar([("k.txt", b"x")]) + bytes(10 * 512))
    with open_shard(open_index(str(path)), 0) as r:
        assert list(r) == [{"__key__": "k", "txt": b"x"}]
