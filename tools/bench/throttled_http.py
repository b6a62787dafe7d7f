"""A loopback HTTP file server with Range support, a fixed bandwidth and a per-request latency.

One server stands for one node's link to remote storage: every response
body, whatever the number of connections, shares one byte budget per
second (paced, no bursts), so fetching N bytes takes N / rate seconds as it
would on a saturated link; each request first waits ``latency_s`` (an object
store's time to first byte), concurrent requests waiting side by side. The
link is shaped in the server itself (tc netem is not available in
containers). Counts requests and body bytes. For benchmarks; tests use
tests/cache_servers.py.
"""

from __future__ import annotations

import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from shardfeed.cache.range_server import resolve, start_range_reply

_CHUNK = 64 << 10


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ThrottledServer

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self._serve(False)

    def do_GET(self):
        self._serve(True)

    def _serve(self, body: bool):
        path = resolve(self.server.root, self.path)
        if path is None or not os.path.isfile(path):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.server.latency_s:
            time.sleep(self.server.latency_s)
        self.server.request()
        size = os.path.getsize(path)
        start, end = start_range_reply(self, size)
        if not body:
            return
        with open(path, "rb") as f:
            pos = start
            while pos < end:
                data = os.pread(f.fileno(), min(_CHUNK, end - pos), pos)
                self.server.pace(len(data))
                self.wfile.write(data)
                pos += len(data)
        self.server.count(end - start)


class ThrottledServer(ThreadingHTTPServer):
    """``ThrottledServer(root, bytes_per_s, latency_s=0)``: serves ``root`` on 127.0.0.1
    in a thread (``with`` starts and stops it); ``url``, ``bytes_sent``, ``requests``."""

    daemon_threads = True

    def __init__(self, root: str, bytes_per_s: float, latency_s: float = 0.0):
        super().__init__(("127.0.0.1", 0), _Handler)
        if bytes_per_s <= 0 or latency_s < 0:
            raise ValueError(f"bytes_per_s={bytes_per_s!r} must be > 0 and latency_s={latency_s!r} >= 0")
        self.root = root
        self.rate = float(bytes_per_s)
        self.latency_s = float(latency_s)
        self.bytes_sent = 0
        self.requests = 0
        self._mu = threading.Lock()
        self._free_at = 0.0  # when the link is next free (monotonic)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self._thread = threading.Thread(target=self.serve_forever, name="bench-http", daemon=True)

    def pace(self, n: int) -> None:
        """Wait until ``n`` more bytes fit the link."""
        with self._mu:
            now = time.monotonic()
            start = max(now, self._free_at)
            self._free_at = start + n / self.rate
        if start > now:
            time.sleep(start - now)

    def request(self) -> None:
        with self._mu:
            self.requests += 1

    def count(self, n: int) -> None:
        with self._mu:
            self.bytes_sent += n

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()
