"""A loopback HTTP server with Range support, for the demo's remote dataset.

``with serve(folder) as url:`` serves ``folder`` on 127.0.0.1 from a daemon
thread (the standard library's http.server answers whole files only; the
cache fetches shards in ranges). Paths outside the folder are refused.
"""

from __future__ import annotations

import contextlib
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from shardfeed.tools.range_server import resolve, start_range_reply


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY: the headers and the body go out in two writes, and with Nagle's algorithm the body
    # waited for the client's delayed ACK of the headers: 44 ms a request on loopback whatever its size
    # (measured), which was most of the demo's data stall (readers fetch ~5 KiB sample ranges)
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self._serve(body=False)

    def do_GET(self):
        self._serve(body=True)

    def _serve(self, body: bool):
        path = resolve(self.server.root, self.path)
        if path is None or not os.path.isfile(path):
            data = b"not found"
            self.send_response(404)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)
            return
        size = os.path.getsize(path)
        start, end = start_range_reply(self, size)
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
