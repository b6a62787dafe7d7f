"""`shardfeed inspect URL` and `shardfeed verify URL --cache-dir DIR` over a
loopback HTTP server and moto's S3; open_index(url) points at the cache."""

from __future__ import annotations

import json
import os

import pytest

from cache_servers import RangeServer, upload_folder
from conftest import flip_byte
from shardfeed.cache import ShardCache, open_remote_index
from shardfeed.formats import ShardError, open_index, open_shard, read_sidecar
from shardfeed.tools.cli import main


def _payload_offset(shard_path: str, sample: int) -> int:
    table, _ = read_sidecar(shard_path + ".idx", shard_path)
    return int(table.offset[table.member_start[sample] + 2])


def _bad_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("BAD ")]


def test_verify_url_good_then_from_the_cache(tmp_path, make_dataset, capsys):
    root = make_dataset(60, shard_samples=20)
    cdir = str(tmp_path / "c")
    with RangeServer(root) as srv:
        assert main(["verify", srv.url, "--quiet", "--cache-dir", cdir]) == 0
        out = capsys.readouterr().out
        assert "verified 3 shards, 60 samples" in out and "all good" in out and "BAD" not in out
        assert f"into the cache at {cdir}" in out and "fetched 0 B" not in out
        shard_gets = srv.gets(".tar")
        assert shard_gets >= 3
        assert main(["verify", srv.url + "/", "--quiet", "--cache-dir", cdir]) == 0  # copies re-hashed, not fetched
        assert "fetched 0 B" in capsys.readouterr().out and srv.gets(".tar") == shard_gets


def test_verify_url_names_each_damage_by_url(tmp_path, make_dataset, capsys):
    root = make_dataset(80, shard_samples=20)
    idx = open_index(root)
    flip_byte(idx.path(1), _payload_offset(idx.path(1), 5))  # damaged at the source after indexing
    os.unlink(idx.path(2) + ".idx")  # no sidecar: readers scan, but lose the per-sample checksums
    os.unlink(idx.path(3))
    cdir = str(tmp_path / "c")
    with RangeServer(root) as srv:
        assert main(["verify", srv.url, "--quiet", "--cache-dir", cdir, "--jobs", "2"]) == 1
    out = capsys.readouterr().out
    bad = _bad_lines(out)
    assert [line.split(": ")[0] for line in bad] == [f"BAD {srv.url}/{idx.names[i]}" for i in (1, 2, 3)]
    assert "does not match" in bad[0] and "damaged at the source" in bad[0]
    assert "sidecar" in bad[1] and "missing" in bad[1]
    assert "not found" in bad[2]
    assert "3 bad shards" in out
    assert ShardCache(cdir, 1 << 20).contains(f"{srv.url}/{idx.names[0]}", idx.hashes[0])
    assert not ShardCache(cdir, 1 << 20).contains(f"{srv.url}/{idx.names[1]}", idx.hashes[1])  # nothing trusted


def test_verify_url_refetches_a_copy_damaged_in_the_cache(tmp_path, make_dataset, capsys):
    """Damage on the local disk is not the source's: the cached copy is
    dropped and fetched again, and the dataset verifies."""
    root = make_dataset(40, shard_samples=20)
    idx = open_index(root)
    cdir = str(tmp_path / "c")
    with RangeServer(root) as srv:
        assert main(["verify", srv.url, "--quiet", "--cache-dir", cdir]) == 0
        url = f"{srv.url}/{idx.names[0]}"
        copy = ShardCache(cdir, 1 << 20).path_for(url, idx.hashes[0])
        flip_byte(copy, _payload_offset(copy, 3))
        before = srv.gets(idx.names[0])
        capsys.readouterr()
        assert main(["verify", srv.url, "--quiet", "--cache-dir", cdir]) == 0
        assert "all good" in capsys.readouterr().out
        assert srv.gets(idx.names[0]) == before + 1
    with open(copy, "rb") as f, open(idx.path(0), "rb") as g:
        assert f.read() == g.read()


def test_inspect_url_shows_the_remote_dataset(tmp_path, make_dataset, capsys):
    root = make_dataset(60, shard_samples=20)
    with RangeServer(root) as srv:
        assert main(["inspect", srv.url, "--json", "--samples", "2", "--class-shards", "1",
                     "--cache-dir", str(tmp_path / "c")]) == 0
        info = json.loads(capsys.readouterr().out)
        names = open_index(root).names
        assert srv.gets(names[0]) >= 1 and srv.gets(names[1]) == 0  # only the shards it samples are fetched
    assert info["root"] == srv.url and info["shards"] == 3 and info["samples"] == 60
    assert [e["key"] for e in info["examples"]] == ["00000000", "00000059"]
    assert info["class_stats"]["classes"] == 10


def test_inspect_and_verify_over_s3(tmp_path, make_dataset, capsys, moto_endpoint, monkeypatch):
    """Credentials and the endpoint come from the environment, as for any
    boto-based tool (AWS_ENDPOINT_URL)."""
    import boto3

    root = make_dataset(40, shard_samples=20, format="parquet")
    boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket="cli")
    upload_folder(moto_endpoint, "cli", root, "ds")
    for k, v in dict(AWS_ENDPOINT_URL=moto_endpoint, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                     AWS_DEFAULT_REGION="us-east-1").items():
        monkeypatch.setenv(k, v)
    cdir = str(tmp_path / "c")
    assert main(["verify", "s3://cli/ds", "--quiet", "--cache-dir", cdir]) == 0
    assert "verified 2 shards, 40 samples" in capsys.readouterr().out
    assert main(["inspect", "s3://cli/ds", "--cache-dir", cdir, "--samples", "1"]) == 0
    out = capsys.readouterr().out
    assert "s3://cli/ds" in out and "parquet: 2" in out


def test_url_that_is_no_dataset_exits_2_naming_it(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    with RangeServer(str(empty)) as srv:
        for cmd in ("verify", "inspect"):
            assert main([cmd, srv.url + "/nothing", "--cache-dir", str(tmp_path / "c")]) == 2
            err = capsys.readouterr().err
            assert f"{srv.url}/nothing" in err and "no index.arrow" in err


def test_open_index_of_a_url_names_the_cache_helper():
    with pytest.raises(ShardError, match=r"shardfeed.cache.open_remote_index\(url, cache_dir\)") as err:
        open_index("https://example.invalid/ds")
    assert err.value.shard == "https://example.invalid/ds"


def test_open_remote_index_paths_are_verified_cached_copies(tmp_path, make_dataset):
    root = make_dataset(40, shard_samples=20)
    cdir = str(tmp_path / "c")
    with RangeServer(root) as srv:
        index = open_remote_index(srv.url, cdir, limit_bytes=1 << 20)
        assert index.root == srv.url and index.num_samples == 40
        path = index.path(1)
        assert path.startswith(os.path.join(cdir, "data")) and os.path.exists(path + ".idx")
        with open_shard(index, 1) as reader:
            assert [reader.read(j)["__key__"] for j in (0, 19)] == ["00000020", "00000039"]
