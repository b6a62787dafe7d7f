"""Foreign tars damaged before any read are counted under on_error="skip", never lost in silence.

A folder of WebDataset tars has no index: each tar is scanned when the dataset opens. One that
cannot be scanned (a flipped header checksum, a cut inside a member) is left out whole; it used
to be left out with errors_skipped at 0, so a user lost a quarter of the data with no count. A
member name that is not UTF-8 made its whole tar unreadable, so a tar holding it and a good
sample raised "dataset holds no samples". Now: the good samples are delivered, what was left
out is counted in stats()["errors_skipped"] at each epoch's start (a shard left out whole counts
once: its samples are unknown; a sample with a bad name counts one), and one warning line names
the shard, through 0 and 2 workers.
"""

from __future__ import annotations

import io
import logging
import tarfile

import pytest

from shardfeed.formats import ShardError, open_index
from shardfeed.loader import Loader, ShardDataset

SHARDS, SAMPLES = 4, 100


def _member(name: bytes, data: bytes) -> bytes:
    """One ustar member whose name is ``name`` as raw bytes (tarfile would encode a str)."""
    info = tarfile.TarInfo("x")
    info.size = len(data)
    h = bytearray(info.tobuf(tarfile.USTAR_FORMAT))
    h[0:100] = name.ljust(100, b"\0")
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h) + data.ljust(-(-len(data) // 512) * 512, b"\0")


def _shard(s: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for k in range(SAMPLES):
            data = str(s * SAMPLES + k).encode()
            info = tarfile.TarInfo(f"s{s}_{k:03d}.cls")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _folder(tmp_path, damage: str):
    for s in range(SHARDS):
        raw = bytearray(_shard(s))
        if s == 2:
            if damage == "checksum":
                raw[50 * 1024 + 148] ^= 0x01  # member 50's header checksum (a member: header + one block)
            else:
                raw = raw[:len(raw) // 2 + 256]  # cut in half, inside a member
        (tmp_path / f"part-{s}.tar").write_bytes(bytes(raw))
    return str(tmp_path), str(tmp_path / "part-2.tar")


def _read(root, workers):
    with Loader(ShardDataset(root, shuffle="none", on_error="skip"), batch_size=16, num_workers=workers) as ld:
        keys = [k for b in ld for k in b["__key__"]]
        return keys, ld.stats()


def _warnings(caplog, shard):
    return [r for r in caplog.records if r.levelno == logging.WARNING and shard in r.getMessage()]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("damage", ["checksum", "cut"])
def test_damaged_foreign_tar_is_counted_and_named(tmp_path, caplog, damage, workers):
    root, bad = _folder(tmp_path, damage)
    with pytest.raises(ShardError) as raised:  # under raise: the damaged tar, named
        ShardDataset(root, shuffle="none")
    assert raised.value.shard == bad
    caplog.set_level(logging.WARNING, logger="shardfeed.loader")
    keys, stats = _read(root, workers)
    want = [f"s{s}_{k:03d}" for s in (0, 1, 3) for k in range(SAMPLES)]
    assert sorted(keys) == want  # the good samples, each once
    assert stats["errors_skipped"] == 1 and stats["epoch"]["errors_skipped"] == 1
    assert len(_warnings(caplog, bad)) == 1


def test_left_out_shard_is_counted_in_every_epoch(tmp_path):
    root, _ = _folder(tmp_path, "checksum")
    with Loader(ShardDataset(root, shuffle="none", on_error="skip"), batch_size=50) as ld:
        for epoch in range(2):
            ld.set_epoch(epoch)
            assert sum(len(b["__key__"]) for b in ld) == 3 * SAMPLES
            assert ld.stats()["epoch"]["errors_skipped"] == 1
        assert ld.stats()["total"]["errors_skipped"] == 2


@pytest.mark.parametrize("workers", [0, 2])
def test_non_utf8_member_name_skips_its_sample_only(tmp_path, caplog, workers):
    tar = tmp_path / "a.tar"
    tar.write_bytes(_member(b"caf\xe9.cls", b"1") + _member(b"ok.cls", b"2") + bytes(1024))
    with pytest.raises(ShardError, match="not UTF-8"):
        open_index(str(tmp_path))
    caplog.set_level(logging.WARNING, logger="shardfeed.loader")
    with Loader(ShardDataset(str(tmp_path), shuffle="none", on_error="skip"), batch_size=4,
                num_workers=workers) as ld:
        batches = list(ld)
        assert ld.stats()["errors_skipped"] == 1
    assert [k for b in batches for k in b["__key__"]] == ["ok"]
    assert [int(v) for b in batches for v in b["cls"]] == [2]
    assert len(_warnings(caplog, str(tar))) == 1


def test_two_bad_names_in_one_tar_count_two_and_log_one_line(tmp_path, caplog):
    tar = tmp_path / "a.tar"
    tar.write_bytes(_member(b"caf\xe9.cls", b"1") + _member(b"ok.cls", b"2") + _member(b"na\xefve.cls", b"3")
                    + _member(b"na\xefve.txt", b"x") + bytes(1024))
    caplog.set_level(logging.WARNING, logger="shardfeed.loader")
    with Loader(ShardDataset(str(tmp_path), shuffle="none", on_error="skip"), batch_size=4) as ld:
        assert [k for b in ld for k in b["__key__"]] == ["ok"]
        assert ld.stats()["errors_skipped"] == 2  # two samples: naïve's two members are one
    assert len(_warnings(caplog, str(tar))) == 1
