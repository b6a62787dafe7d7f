"""Ranged reads of an S3 object (moto's real server): every range after the first asks for
the first one's ETag (If-Match), so an object rewritten between two ranges is refused with
an error naming it, never stitched from two versions."""

from __future__ import annotations

import pytest

from cache_servers import s3_client, s3_options
from shardfeed.cache.fetching.url_sources import open_source
from shardfeed.formats import ShardError


@pytest.mark.timeout(120)
def test_object_rewritten_between_ranges_is_refused(moto_endpoint):
    s3 = s3_client(moto_endpoint)
    s3.create_bucket(Bucket="ranges")
    old, new = bytes(range(256)) * 64, bytes(reversed(range(256))) * 64
    s3.put_object(Bucket="ranges", Key="s.tar", Body=old)
    src = open_source("s3://ranges/s.tar", s3_options(moto_endpoint), 10.0)
    assert src.read_range(0, 1000) == old[:1000]
    assert src.read_range(4000, 5000) == old[4000:5000]  # same object: same ETag, served
    s3.put_object(Bucket="ranges", Key="s.tar", Body=new)  # rewritten between two ranges
    with pytest.raises(ShardError, match="changed on the source while it was read in ranges") as err:
        src.read_range(1000, 2000)
    assert "s3://ranges/s.tar" in str(err.value)
    fresh = open_source("s3://ranges/s.tar", s3_options(moto_endpoint), 10.0)  # a new read sees the new object
    assert fresh.read_range(1000, 2000) == new[1000:2000]


@pytest.mark.timeout(120)
def test_a_range_that_arrives_in_pieces_is_read_whole(tmp_path):
    """Through a paced link a body arrives in pieces and one read returns only the first: the
    range is read to its end (it failed every attempt as a "short read" before)."""
    from shardfeed.tools.bench.s3_link import BUCKET, ShapedS3

    blob = bytes(range(256)) * 2400  # 614,400 bytes: several of the link's 64 KiB chunks
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "s.tar").write_bytes(blob)
    with ShapedS3(4e6, 0.0) as s3:
        s3.upload(str(tmp_path / "d"), "paced")
        src = open_source(f"s3://{BUCKET}/paced/s.tar", s3_options(s3.endpoint), 10.0)
        assert src.read_range(0, 549_888) == blob[:549_888]
        assert src.read_range(549_888, len(blob)) == blob[549_888:]
