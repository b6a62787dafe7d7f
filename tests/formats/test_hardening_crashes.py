"""Hardening, class "crash instead of ShardError" (and the writer and
skip-count regressions found with it): bad input is a ShardError naming the
file, or a counted skip; never KeyError, OverflowError, UnicodeError..."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from shardfeed.formats import ShardError, ShardWriter, open_index, open_shard
from shardfeed.loader import Loader, ShardDataset

pytestmark = pytest.mark.hostile  # bounded time and memory (conftest.py)


def _raw_tar(path, members) -> str:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT, encoding="latin-1", errors="strict") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return str(path)


def test_non_utf8_member_name_is_a_shard_error_and_skippable(tmp_path):
    """Regression: UnicodeEncodeError (surrogates not allowed), even under skip."""
    folder = tmp_path / "f"
    folder.mkdir()
    _raw_tar(folder / "a.tar", [("good.txt", b"1")])
    _raw_tar(folder / "b.tar", [("caf\xe9.txt", b"2")])  # latin-1 byte 0xE9: not UTF-8
    with pytest.raises(ShardError, match="not UTF-8") as ei:
        open_index(str(folder))
    assert ei.value.shard.endswith("b.tar")
    idx = open_index(str(folder), on_error="skip")
    assert idx.names == ["a.tar"] and "not UTF-8" in idx.skipped[0][1]


def test_33000_distinct_extensions_in_one_foreign_shard(tmp_path):
    """Regression: OverflowError in an int16 field id."""
    path = _raw_tar(tmp_path / "many.tar", [(f"k{i}.e{i}", b"") for i in range(33_000)])
    idx = open_index(path)
    with open_shard(idx, 0) as r:
        assert r.read(32_999) == {"__key__": "k32999", "e32999": b""}


def test_writer_refuses_more_fields_than_a_sidecar_holds(tmp_path, monkeypatch):
    import shardfeed.formats.writer as writer
    monkeypatch.setattr(writer, "MAX_FIELDS", 3)
    with pytest.raises(ValueError, match="distinct field names"):
        with ShardWriter(str(tmp_path / "o")) as w:
            for i in range(4):
                w.write({"__key__": f"k{i}", f"e{i}": b"x"})


def test_file_url_naming_a_non_shard(tmp_path):
    """Regression: ValueError for a file:// source that is not a shard."""
    p = tmp_path / "notes.txt"
    p.write_text("hello")
    with pytest.raises(ShardError, match="not a shard"):
        open_index(f"file://{p}")


def test_writer_refuses_the_same_key_twice_in_a_row(tmp_path):
    """Regression: the shard read back with two samples merged and verify said
    'unreadable (BufferError: ...)'."""
    with pytest.raises(ValueError, match="twice in a row"):
        with ShardWriter(str(tmp_path / "o")) as w:
            w.write({"__key__": "a", "txt": "1"})
            w.write({"__key__": "a", "txt": "2"})
    with ShardWriter(str(tmp_path / "p")) as w:  # the same key apart is the writer's user's business
        w.write({"__key__": "a", "txt": "1"})
        w.write({"__key__": "b", "txt": "2"})


def test_verify_names_the_reason_of_a_merged_sample(tmp_path, capsys):
    """A foreign tar whose sample repeats a field is named with that reason."""
    from shardfeed.tools.cli import main
    folder = tmp_path / "f"
    folder.mkdir()
    _raw_tar(folder / "a.tar", [("k.txt", b"1"), ("k.txt", b"2")])
    assert main(["verify", str(folder)]) == 1
    out = capsys.readouterr()
    assert "two 'txt' members" in out.out + out.err
    assert "BufferError" not in out.out + out.err


@pytest.mark.parametrize("slow", ["transform", "collate_fn"])
def test_skip_counts_undecodable_samples_on_the_slow_path(tmp_path, slow):
    """Regression (found by a mutation test): with a transform or collate_fn
    set, a sample that failed to decode was dropped without being counted."""
    root = str(tmp_path / "d")
    with ShardWriter(root, max_shard_samples=10) as w:
        for i in range(10):
            w.write({"__key__": f"k{i}", "json": b"{not json" if i in (2, 7) else json.dumps({"i": i}).encode()})
    kwargs = {"transform": lambda s: s} if slow == "transform" else {}
    ds = ShardDataset(root, shuffle="none", on_error="skip", **kwargs)
    loader_kwargs = {"collate_fn": lambda samples: samples} if slow == "collate_fn" else {}
    with Loader(ds, batch_size=5, **loader_kwargs) as loader:
        got = [s for b in loader for s in (b if isinstance(b, list) else [])] if slow == "collate_fn" \
            else [k for b in loader for k in b["__key__"]]
        stats = loader.stats()
    n = len(got)
    assert n == 8
    assert stats["errors_skipped"] == 2, stats
