"""Errors a new user meets first name the cause and the fix, in the public API's words.

Regressions, each met in a first hour: a raw ImageFolder tree gave "no
index.arrow, no commit log and no tar shards here" (convert reads exactly that
tree); a dataset URL that does not exist gave "no index.arrow and no readable
_log/ commit log here; write the dataset with ShardWriter..." (it was not
found); a truncated shard said nothing of on_error="skip"; S3 without credentials retried
and said "NoCredentialsError" with no word of where credentials go; an epoch Loader's
state loaded into a followed one gave "feed state version 2 / kind 'epoch' is
not 1 or 2 / 'follow'"; Loader(batch_size=0) gave "Stage: batch size 0".
"""

from __future__ import annotations

import os

import pytest

from cache_servers import RangeServer
from conftest import labelled_sample
from shardfeed.formats import ShardError, ShardWriter, open_index
from shardfeed.loader import Loader, ShardDataset


def test_an_image_folder_tree_points_at_convert(tmp_path):
    for cls in ("cat", "dog"):
        (tmp_path / "photos" / cls).mkdir(parents=True)
        (tmp_path / "photos" / cls / "1.jpg").write_bytes(b"\xff\xd8\xff")
    with pytest.raises(ShardError, match=r"not a dataset yet\. `shardfeed convert .*photos OUT` reads a folder "
                                         r"of images by class \(ImageFolder\)"):
        ShardDataset(str(tmp_path / "photos"))


def test_a_url_with_no_dataset_says_not_found(tmp_path):
    (tmp_path / "served").mkdir()
    with RangeServer(str(tmp_path / "served")) as srv:
        with pytest.raises(ShardError, match=r"/nothing-here: not found: no index\.arrow and no _log/ commit "
                                             r"log is there \(check the URL and bucket"):
            ShardDataset(srv.url + "/nothing-here", cache_dir=str(tmp_path / "cache"))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_truncated_shard_names_on_error_skip(make_dataset, workers):
    root = make_dataset(40, shard_samples=20)
    with open(open_index(root).path(1), "r+b") as f:
        f.truncate(1000)
    with Loader(ShardDataset(root, shuffle="none"), 8, num_workers=workers) as loader:
        with pytest.raises(ShardError) as e:
            list(loader)
    notes = "\n".join(getattr(e.value, "__notes__", ()))
    assert 'pass on_error="skip" to ShardDataset' in notes and "errors_skipped" in notes, notes


def test_an_epoch_state_in_a_followed_loader_is_a_plain_sentence(tmp_path, make_dataset):
    root = make_dataset(16, shard_samples=8)
    with Loader(ShardDataset(root), 4) as loader:
        next(iter(loader))
        state = loader.state_dict()
    stream = str(tmp_path / "stream")
    with ShardWriter(stream, append=True, max_shard_samples=4) as w:
        for i in range(8):
            w.write(labelled_sample(i))
    with Loader(ShardDataset(stream, follow=True, idle_timeout_s=5), 4) as followed:
        with pytest.raises(ValueError) as e:
            followed.load_state_dict(state)
    assert str(e.value).startswith("this state was saved by a Loader over a ShardDataset (epochs of a fixed "
                                   "dataset), and this is a Loader over a ShardDataset(follow=True)"), e.value
    assert "version" not in str(e.value)


@pytest.mark.parametrize("bs", [0, -3, [4, 0]])
def test_a_bad_batch_size_names_the_loader_argument(make_dataset, bs):
    with pytest.raises(ValueError) as e:
        Loader(ShardDataset(make_dataset(8, shard_samples=8)), bs)
    assert str(e.value).startswith(f"Loader(batch_size={bs!r}): batch size") and "Stage" not in str(e.value)


def test_s3_without_credentials_names_the_variables(moto_endpoint, tmp_path, monkeypatch):
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    for name in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        monkeypatch.setenv(name, str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("SHARDFEED_FETCH_ATTEMPTS", "1")
    options = {"client_kwargs": {"endpoint_url": moto_endpoint, "region_name": "us-east-1"}}
    with pytest.raises(ShardError, match=r"NoCredentialsError.*no AWS credentials were found: set AWS_ACCESS_KEY_ID "
                                         r"and AWS_SECRET_ACCESS_KEY .*AWS_ENDPOINT_URL"):
        ShardDataset("s3://bucket/ds", cache_dir=str(tmp_path / "cache"), storage_options=options)
