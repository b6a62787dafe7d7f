"""moto's S3 server behind the benchmark's shaped link: the S3 endpoint `bench remote`'s peers read.

MosaicML Streaming 0.13 has no http(s) downloader (its remotes are s3://, gs://, oci://, azure://,
hf://, dbfs:, sftp://, alipan://) and LitData reads s3://, gs://, azure://, hf://; so the peers read
an S3 bucket. The bucket lives in moto's real S3 server on loopback (the server the tests use); the
clients talk to a forwarding proxy in front of it, a ThrottledServer (tools/bench/throttled_http.py)
whose handler forwards each request to moto: the same pacing of every response body through one
byte budget per second, the same per-request latency and the same counters (``bytes_sent`` counts
response bodies, ``requests`` counts requests, ``max_in_flight`` the most answered at once) as the
HTTP server shardfeed reads. Uploads go to
moto directly, so they are not counted.

``GET /__bench_counters__`` on the proxy answers the counters as JSON without counting itself:
the peers run in processes of their own (Streaming in its own venv) and read the server's figures
at their epoch boundaries from there.
"""

from __future__ import annotations

import http.client
import json
import os
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit

from shardfeed.tools.bench.throttled_http import _CHUNK, ThrottledServer

COUNTERS_PATH = "/__bench_counters__"
BUCKET = "bench"
KEYS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}
# headers of one hop, not forwarded (RFC 9110 section 7.6.1)
_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
        "server", "date"}


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # as throttled_http: no 44 ms delayed-ACK wait per request
    server: ShapedProxy

    def log_message(self, *args):
        pass

    def do_GET(self):
        self._forward(True)

    def do_HEAD(self):
        self._forward(False)

    def _forward(self, body: bool) -> None:
        srv = self.server
        if self.path == COUNTERS_PATH:
            with srv._mu:
                data = json.dumps({"bytes": srv.bytes_sent, "requests": srv.requests}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        srv.began(1)
        try:
            self._relay(body)
        finally:
            srv.began(-1)

    def _relay(self, body: bool) -> None:
        srv = self.server
        if srv.latency_s:
            time.sleep(srv.latency_s)
        srv.request()
        up = http.client.HTTPConnection(srv.upstream[0], srv.upstream[1], timeout=120)
        try:
            up.request(self.command, self.path,
                       headers={k: v for k, v in self.headers.items() if k.lower() not in _HOP})
            resp = up.getresponse()
            data = resp.read() if resp.getheader("Content-Length") is None and body else None
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in _HOP and not (data is not None and k.lower() == "content-length"):
                    self.send_header(k, v)
            if data is not None:
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if not body:
                return
            sent = 0
            while True:
                chunk = data[sent:sent + _CHUNK] if data is not None else resp.read(_CHUNK)
                if not chunk:
                    break
                srv.pace(len(chunk))
                srv.send_counted(self.wfile, chunk)
                sent += len(chunk)
        finally:
            up.close()


class ShapedProxy(ThrottledServer):
    """``ShapedProxy(upstream_url, bytes_per_s, latency_s)``: forwards GET and HEAD to ``upstream_url``
    through the ThrottledServer's link (``url``, ``bytes_sent``, ``requests`` as there)."""

    def __init__(self, upstream_url: str, bytes_per_s: float, latency_s: float = 0.0):
        super().__init__(os.devnull, bytes_per_s, latency_s)
        self.RequestHandlerClass = _ProxyHandler
        parts = urlsplit(upstream_url)
        self.upstream = (parts.hostname, parts.port)

    def handle_error(self, request, client_address):
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client closing its keep-alive is no error
            super().handle_error(request, client_address)


class ShapedS3:
    """``with ShapedS3(rate, latency) as s3``: moto on loopback with bucket ``BUCKET``; ``s3.endpoint``
    (the shaped proxy the readers use), ``s3.link`` (its counters), ``s3.upload(folder, prefix)``."""

    def __init__(self, bytes_per_s: float, latency_s: float):
        self.rate, self.latency = bytes_per_s, latency_s

    def __enter__(self):
        import logging

        import boto3
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
        self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._moto.start()
        host, port = self._moto.get_host_and_port()
        self.direct = f"http://{host}:{port}"
        self._client = boto3.client("s3", endpoint_url=self.direct, aws_access_key_id=KEYS["aws_access_key_id"],
                                    aws_secret_access_key=KEYS["aws_secret_access_key"],
                                    region_name=KEYS["region_name"])
        self._client.create_bucket(Bucket=BUCKET)
        self.link = ShapedProxy(self.direct, self.rate, self.latency).__enter__()
        self.endpoint = self.link.url
        return self

    def upload(self, folder: str, prefix: str) -> str:
        """Every file under ``folder`` to ``s3://BUCKET/prefix/`` (directly, not counted); the URL."""
        for dirpath, _, files in os.walk(folder):
            for n in sorted(files):
                path = os.path.join(dirpath, n)
                key = prefix + "/" + os.path.relpath(path, folder).replace(os.sep, "/")
                self._client.upload_file(path, BUCKET, key)
        return f"s3://{BUCKET}/{prefix}"

    def env(self) -> dict:
        """What the peers' processes need to find the bucket: boto3's variables, Streaming's endpoint."""
        return {"AWS_ACCESS_KEY_ID": KEYS["aws_access_key_id"], "AWS_SECRET_ACCESS_KEY": KEYS["aws_secret_access_key"],
                "AWS_DEFAULT_REGION": KEYS["region_name"], "S3_ENDPOINT_URL": self.endpoint,
                "AWS_ALLOW_HTTP": "true", "AWS_ENDPOINT_URL": self.endpoint}

    def __exit__(self, *exc):
        self.link.__exit__(*exc)
        self._moto.stop()
