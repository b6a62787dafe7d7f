"""`shardfeed verify` and `inspect` on folders of foreign tars with damaged
members, and on glob / brace patterns of shards."""

from __future__ import annotations

import argparse
import io
import json
import os
import tarfile

from shardfeed.formats import open_index
from shardfeed.tools import inspect_cmd, verify


def main(argv: list[str]) -> int:
    """`shardfeed verify|inspect ARGS` through each command's own parser and main."""
    command = {"verify": verify, "inspect": inspect_cmd}[argv[0]]
    parser = argparse.ArgumentParser(prog=f"shardfeed {argv[0]}")
    command.add_arguments(parser)
    return command.main(parser.parse_args(argv[1:]))


def _foreign_folder(folder, shards: int = 4, per: int = 5) -> list[str]:
    os.makedirs(folder, exist_ok=True)
    paths = []
    for k in range(shards):
        path = os.path.join(folder, f"part-{k:03d}.tar")
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(k * per, (k + 1) * per):
                data = f"sample {i}".encode() * 40
                info = tarfile.TarInfo(f"{i:06d}.txt")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


def _bad_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("BAD ")]


def test_verify_names_every_truncated_foreign_tar(tmp_path, capsys):
    """Regression: verify stopped with exit 2 ("cannot be opened") naming only the
    first truncated tar of a folder; now each is a BAD line and the rest is checked."""
    paths = _foreign_folder(tmp_path / "wds")
    os.truncate(paths[1], 700)
    os.truncate(paths[3], 1100)
    assert main(["verify", str(tmp_path / "wds"), "--quiet"]) == 1
    out = capsys.readouterr().out
    bad = _bad_lines(out)
    assert [line.split(": ")[0] for line in bad] == [f"BAD {paths[1]}", f"BAD {paths[3]}"]
    assert all("truncated" in line for line in bad)
    assert "verified 4 shards, 10 samples" in out and "2 bad shards" in out
    assert "is not in the index" not in out  # the bad tars are named once, as BAD


def test_verify_a_single_truncated_foreign_tar_is_a_bad_shard(tmp_path, capsys):
    path = _foreign_folder(tmp_path / "wds", shards=1)[0]
    os.truncate(path, 700)
    assert main(["verify", path, "--quiet"]) == 1
    assert _bad_lines(capsys.readouterr().out)[0].startswith(f"BAD {path}: ")


def test_verify_cannot_open_a_missing_folder_or_an_empty_pattern(tmp_path, capsys):
    assert main(["verify", str(tmp_path / "missing"), "--quiet"]) == 2
    assert "missing" in capsys.readouterr().err
    pattern = str(tmp_path / "part-{000..009}.tar")
    assert main(["verify", str(tmp_path / "*.tar"), "--quiet"]) == 2
    assert main(["verify", pattern, "--quiet"]) == 2
    assert "part-000.tar" in capsys.readouterr().err


def test_verify_a_glob_inside_an_indexed_dataset(make_dataset, capsys):
    root = make_dataset(100, shard_samples=25)
    idx = open_index(root)
    assert main(["verify", os.path.join(root, "shard-00000[12].tar"), "--quiet"]) == 0
    assert "verified 2 shards, 50 samples" in capsys.readouterr().out
    os.truncate(idx.path(2), idx.sizes[2] // 2)
    assert main(["verify", os.path.join(root, "shard-{000000..000003}.tar"), "--quiet"]) == 1
    out = capsys.readouterr().out
    assert [line.split(": ")[0] for line in _bad_lines(out)] == [f"BAD {idx.path(2)}"]
    assert "verified 4 shards" in out and "1 bad shard" in out


def test_inspect_accepts_a_glob(make_dataset, capsys):
    root = make_dataset(100, shard_samples=25)
    assert main(["inspect", os.path.join(root, "shard-00000[01].tar"), "--json", "--samples", "2"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["indexed"], info["shards"], info["samples"]) == (True, 2, 50)
    assert [ex["key"] for ex in info["examples"]] == ["00000000", "00000049"]


def test_inspect_shows_a_foreign_folder_and_lists_its_unreadable_tar(tmp_path, capsys):
    paths = _foreign_folder(tmp_path / "wds")
    os.truncate(paths[2], 700)
    assert main(["inspect", str(tmp_path / "wds" / "part-*.tar"), "--samples", "1"]) == 0
    out = capsys.readouterr().out
    assert "shards         3 (tar: 3)" in out and "samples        15" in out
    assert f"unreadable     {paths[2]}: " in out and "truncated" in out
    for p in paths:
        os.truncate(p, 700)
    assert main(["inspect", str(tmp_path / "wds")]) == 2
    assert "and 3 more unreadable shards" in capsys.readouterr().err


def test_verify_names_a_member_name_that_is_not_utf8(tmp_path, capsys):
    """A name that is not UTF-8 leaves its sample out of a tar read under skip (the rest is read):
    verify still names the tar BAD."""
    from test_foreign_skips import _member

    folder = tmp_path / "wds"
    folder.mkdir()
    (folder / "a.tar").write_bytes(_member(b"caf\xe9.cls", b"1") + _member(b"ok.cls", b"2") + bytes(1024))
    assert main(["verify", str(folder), "--quiet"]) == 1
    out = capsys.readouterr().out
    assert _bad_lines(out) == [f"BAD {folder / 'a.tar'}: member name b'caf\\xe9.cls' at byte 0 is not UTF-8 (sample "
                               "keys must be text); rename the member or re-encode the archive's names"]
    assert "1 bad shard" in out
