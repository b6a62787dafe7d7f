"""`shardfeed bench remote`'s peers at a tiny size: MosaicML Streaming and LitData read their own shards
from moto S3 behind the shaped link, and their bytes and requests are the link's own counts."""

from __future__ import annotations

import importlib.util
import os

import pytest

pytest.importorskip("moto.server")
pytest.importorskip("boto3")

from shardfeed.formats import open_index  # noqa: E402
from shardfeed.tools.bench import remote, remote_peers  # noqa: E402
from shardfeed.tools.bench.peers import peers_python  # noqa: E402
from shardfeed.tools.bench.s3_link import BUCKET, COUNTERS_PATH, KEYS, ShapedS3  # noqa: E402

SAMPLES, PAYLOAD, EPOCHS, BATCH = 128, 4096, 2, 8


def test_the_link_counts_what_a_client_receives(tmp_path):
    import boto3

    body = os.urandom(200_000)
    (tmp_path / "obj").mkdir()
    (tmp_path / "obj" / "x.bin").write_bytes(body)
    with ShapedS3(50e6, 0.001) as s3:
        s3.upload(str(tmp_path / "obj"), "p")  # directly to moto: not counted
        assert (s3.link.bytes_sent, s3.link.requests) == (0, 0)
        c = boto3.client("s3", endpoint_url=s3.endpoint, aws_access_key_id=KEYS["aws_access_key_id"],
                         aws_secret_access_key=KEYS["aws_secret_access_key"], region_name=KEYS["region_name"])
        got = c.get_object(Bucket=BUCKET, Key="p/x.bin")["Body"].read()
        part = c.get_object(Bucket=BUCKET, Key="p/x.bin", Range="bytes=10-1009")["Body"].read()
        assert got == body and part == body[10:1010]
        assert s3.link.requests == 2 and s3.link.bytes_sent == len(body) + 1000
        import json
        from urllib.request import urlopen
        with urlopen(s3.endpoint + COUNTERS_PATH) as r:  # what the peers' processes read; not counted itself
            assert json.loads(r.read()) == {"bytes": len(body) + 1000, "requests": 2}
        assert s3.link.requests == 2


def _missing(lib: str) -> str | None:
    if lib == "litdata":
        return None if importlib.util.find_spec("litdata") else "litdata is not installed"
    return None if peers_python(None) else "no venv for MosaicML Streaming (tools/bench/install_peers.sh)"


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    work = str(tmp_path_factory.mktemp("remote-peers"))
    root = os.path.join(work, "ds")
    remote.write_dataset(root, SAMPLES, PAYLOAD)
    ix = open_index(root)
    data = int(ix.sizes.sum())
    sidecars = sum(os.path.getsize(os.path.join(root, n + ".idx")) for n in ix.names)
    limit = int(0.5 * (data + sidecars))
    setup = (SAMPLES, PAYLOAD, EPOCHS, 200e6, 0.002, BATCH, 0.0)
    # the tuned Streaming row is the Streaming path with one more option: left out here to save a process
    return remote_peers.rows(setup, root, data, limit, 0.55, work, timeout=300,
                             readers=(remote_peers.S3_ROW, "MosaicML Streaming", "LitData"))


@pytest.mark.timeout(600)  # a module fixture of four processes (two of them each write and read a dataset)
@pytest.mark.parametrize("reader,lib", [*remote_peers.PEERS, (remote_peers.S3_ROW, None)])
def test_each_reader_is_counted_by_the_server(table, reader, lib):
    why = _missing(lib) if lib else None
    if why:
        pytest.skip(why)
    rows = [r for r in table if r["reader"] == reader]
    assert [r["epoch"] for r in rows] == list(range(EPOCHS)), rows
    assert rows[0]["bytes_fetched"] > 0 and rows[0]["requests"] > 0  # later epochs may hit the cache only
    for r in rows:
        assert r["bytes_fetched"] >= 0 and r["requests"] >= 0 and r["epoch_s"] > 0
        assert 0 <= r["stall"] <= 1 and 1 <= r["classes_per_batch"] <= BATCH
        assert "delivered" not in r["note"]  # every sample, every epoch
    # a cold cache: every payload byte crosses the link at least once (shardfeed's sample ranges may leave
    # out the tar headers, so the shards' size is no lower bound for it; the peers fetch whole shards)
    assert rows[0]["bytes_fetched"] >= SAMPLES * PAYLOAD
    if lib:
        assert rows[0]["x_dataset"] >= 1.0
