"""A loopback HTTP server with Range support, for the demo's remote dataset.

``with serve(folder) as url:`` serves ``folder`` on 127.0.0.1 from a daemon
thread (the standard library's http.server answers whole files only; the
cache fetches shards in ranges). Paths outside the folder are refused.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self._serve(body=False)

    def do_GET(self):
        self._serve(body=True)

    def _serve(self, body: bool):
        root = os.path.realpath(self.server.root)
        path = os.path.realpath(os.path.join(root, unquote(urlsplit(self.path).path).lstrip("/")))
        if not path.startswith(root + os.sep) or not os.path.isfile(path):
            data = b"not found"
            self.send_response(404)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)
            return
        size = os.path.getsize(path)
        start, end, status = 0, size, 200
        m = _RANGE.match(self.headers.get("Range", ""))
        if m:
            start = int(m.group(1))
            end = min(size, int(m.group(2)) + 1) if m.group(2) else size
            status = 206
        self.send_response(status)
        self.send_header("Content-Length", str(max(0, end - start)))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        if body and end > start:
            with open(path, "rb") as f:
                self.wfile.write(os.pread(f.fileno(), end - start, start))


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a reader killed mid-transfer (the demo's SIGKILL) resets its connection: expected, not news


@contextlib.contextmanager
def serve(folder: str):
    """Yields the server's URL (``http://127.0.0.1:PORT``); stops it on exit."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.root = folder
    thread = threading.Thread(target=server.serve_forever, name="demo-http", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
