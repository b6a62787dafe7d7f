"""`shardfeed ingest SRC s3://...` against moto's S3 server on loopback:
ingest (two runs appending to one prefix), then read back with and without
follow=True, every sample once; URLs it cannot commit to are refused."""

from __future__ import annotations

import http.client
import json
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread
from urllib.parse import urlsplit

import pytest

from cache_servers import s3_options
from shardfeed.loader import Loader, ShardDataset
from shardfeed.tools import cli


def _jsonl(path, start: int, n: int) -> list[str]:
    with open(path, "w") as f:
        for i in range(start, start + n):
            f.write(json.dumps({"id": f"r{i:05d}", "cls": i % 7}) + "\n")
    return [f"r{i:05d}" for i in range(start, start + n)]


@pytest.fixture
def s3_env(moto_endpoint, monkeypatch):
    import boto3

    boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket="ingest")

    def point_at(endpoint: str) -> None:
        for k, v in dict(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                         AWS_DEFAULT_REGION="us-east-1").items():
            monkeypatch.setenv(k, v)

    point_at(moto_endpoint)
    return point_at


def test_ingest_into_s3_then_read_back_once(tmp_path, moto_endpoint, s3_env, capsys):
    keys = _jsonl(tmp_path / "a.jsonl", 0, 30) + _jsonl(tmp_path / "b.jsonl", 30, 21)
    url = "s3://ingest/ds"
    common = ["--key-column", "id", "--max-shard-samples", "8", "-q"]
    assert cli.main(["ingest", str(tmp_path / "a.jsonl"), url, *common]) == 0
    assert cli.main(["ingest", str(tmp_path / "b.jsonl"), url, *common, "--end"]) == 0
    out = capsys.readouterr().out
    assert "ingested 21 samples into 3 published shards" in out and "stream ended by commit 8" in out
    opts = s3_options(moto_endpoint)
    follow = ShardDataset(url, follow=True, cache_dir=str(tmp_path / "c1"), storage_options=opts, poll_s=0.02,
                          idle_timeout_s=30)
    got = Counter(k for b in Loader(follow, 5) for k in b["__key__"])
    assert sorted(got) == keys and set(got.values()) == {1}
    fixed = ShardDataset(url, cache_dir=str(tmp_path / "c2"), storage_options=opts, shuffle="none")
    assert [s["__key__"] for s in fixed] == keys
    from shardfeed.formats.remote_log import RemoteLog

    listed = RemoteLog(url, opts).fs.ls("ingest/ds", detail=False)
    assert not [p for p in listed if "probe" in p]  # the conditional-put probe leaves nothing behind


class _StripConditional(BaseHTTPRequestHandler):
    """A proxy in front of moto that drops If-None-Match: an S3-compatible store ignoring conditional puts."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _forward(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("if-none-match", "host")}
        up = urlsplit(self.server.upstream)
        conn = http.client.HTTPConnection(up.hostname, up.port, timeout=30)
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        conn.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward


def test_ingest_refuses_what_it_cannot_commit_to(tmp_path, moto_endpoint, s3_env, capsys):
    _jsonl(tmp_path / "a.jsonl", 0, 5)
    src = str(tmp_path / "a.jsonl")
    assert cli.main(["ingest", src, "https://example.invalid/ds", "-q"]) == 2
    assert "no atomic create-if-absent put" in capsys.readouterr().err
    assert cli.main(["ingest", src, "ftp://example.invalid/ds", "-q"]) == 2
    assert "unknown URL scheme 'ftp'" in capsys.readouterr().err
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), _StripConditional)
    proxy.upstream = moto_endpoint
    Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        s3_env(f"http://127.0.0.1:{proxy.server_address[1]}")
        assert cli.main(["ingest", src, "s3://ingest/lax", "--key-column", "id", "-q"]) == 2
        err = capsys.readouterr().err
        assert "s3://ingest/lax" in err and "ignores If-None-Match" in err
    finally:
        proxy.shutdown()
        proxy.server_close()
    import s3fs

    assert s3fs.S3FileSystem(**s3_options(moto_endpoint)).find("ingest/lax") == []  # nothing left at the prefix
