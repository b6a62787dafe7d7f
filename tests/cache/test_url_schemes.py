"""A URL whose scheme shardfeed has no reader for is refused at once, in one line.

Regression: ``pipe:`` and ``ftp://`` sources were routed into the node-local
cache (with a warning naming a default cache folder) and failed later, ftp
with a bare socket error.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from shardfeed.cache.fetching.url_sources import open_source
from shardfeed.formats import ShardError
from shardfeed.loader import ShardDataset

EXE = str(Path(sys.executable).with_name("shardfeed"))
BAD = ["pipe:curl -s http://host/shard-{000..009}.tar", "ftp://host/ds", "FTP://host/ds", "sftp://host/ds",
       "hdfs://nn/ds", "shell:cat a.tar"]


@pytest.mark.parametrize("url", BAD)
def test_dataset_refuses_a_scheme_without_a_reader_at_once(tmp_path, url):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "read through a node-local cache" warning first
        with pytest.raises(ShardError) as err:
            ShardDataset(url, cache_dir=str(tmp_path / "cache"))
    assert err.value.shard == url
    text = str(err.value)
    assert "\n" not in text and "http(s)://" in text and "s3://" in text and "file://" in text, text
    assert not (tmp_path / "cache").exists()  # no cache was set up for it
    with pytest.raises(ShardError):
        open_source(url)


def test_train_refuses_it_in_one_line_before_starting_ranks(tmp_path):
    out = subprocess.run([EXE, "train", "ftp://host/ds", "--ranks", "2"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "shardfeed train: error: ftp://host/ds: unknown URL scheme 'ftp': shardfeed has no reader for it; give a "
        "local path or a file://, http(s)://, s3://, gs:// or az:// URL"]
