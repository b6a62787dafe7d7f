"""The conventions a torch, LitData or Mosaic user brings: shuffle=True/False and size strings.

Regressions: ``shuffle=True`` (a torch DataLoader's argument) was refused;
``cache_limit_bytes="50GB"`` was refused although the CLI took ``50GB``; a bad
size read three ways across commands (one leaking ``parse_size``), and
``--cache-limit -5MB`` was read by argparse as a missing argument.
"""

from __future__ import annotations

import shutil

import pytest

from shardfeed.loader import Loader, ShardDataset
from shardfeed.tools.cli import main


def _keys(ds) -> list[str]:
    with Loader(ds, 10) as loader:
        return [k for b in loader for k in b["__key__"]]


def test_shuffle_true_and_false_are_global_and_none(make_dataset):
    root = make_dataset(40, shard_samples=10)
    assert _keys(ShardDataset(root, shuffle=True, seed=5)) == _keys(ShardDataset(root, shuffle="global", seed=5))
    assert _keys(ShardDataset(root, shuffle=False)) == [f"{i:08d}" for i in range(40)]


@pytest.mark.parametrize("limit,expect", [("50GB", 50 * 10**9), ("64GiB", 64 * 2**30), (10**6, 10**6),
                                          (2e6, 2 * 10**6)])
def test_cache_limit_bytes_takes_sizes(make_dataset, tmp_path, limit, expect):
    ds = ShardDataset(make_dataset(20, shard_samples=10), cache_dir=str(tmp_path / "c"), cache_limit_bytes=limit)
    assert ds.cache.limit_bytes == expect


def test_cache_limit_bytes_takes_a_share_of_the_disk(make_dataset, tmp_path):
    ds = ShardDataset(make_dataset(20, shard_samples=10), cache_dir=str(tmp_path / "c"), cache_limit_bytes=0.25)
    assert ds.cache.limit_bytes == int(shutil.disk_usage(tmp_path / "c").total * 0.25)
    assert len(_keys(ds)) == 20


BAD = "size '-5MB' must be positive"


def test_a_bad_size_reads_the_same_in_the_api_and_every_command(make_dataset, tmp_path, capsys):
    root = make_dataset(20, shard_samples=10)
    with pytest.raises(ValueError, match=f"^cache_limit_bytes: {BAD}$"):
        ShardDataset(root, cache_dir=str(tmp_path / "c"), cache_limit_bytes="-5MB")
    for argv in (["verify", root, "--cache-limit", "-5MB"], ["plan", root, "--cache-limit", "-5MB"],
                 ["train", root, "--cache-dir", str(tmp_path), "--cache-limit", "-5MB"],
                 ["convert", root, str(tmp_path / "o"), "--max-shard-bytes", "-5MB"],
                 ["ingest", root, str(tmp_path / "o"), "--max-shard-bytes", "-5MB"]):
        try:
            code = main(argv)  # convert and ingest check their sizes after parsing
        except SystemExit as e:  # the others in argparse
            code = e.code
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert code == 2 and err == f"shardfeed {argv[0]}: error: argument {argv[-2]}: {BAD}", err
