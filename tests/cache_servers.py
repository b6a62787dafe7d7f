"""Real servers on loopback for the cache tests: an HTTP server with Range
support that counts requests and injects faults on demand, and moto's S3
server. No mock objects: bytes travel over sockets as they do in a job."""

from __future__ import annotations

import html
import os
import socket
import threading
import time
from dataclasses import dataclass
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from shardfeed.tools.range_server import start_range_reply


@dataclass
class Fault:
    """Misbehave on the next ``times`` requests (of ``methods``) of paths ending in ``suffix``:

    - "reset": cut the connection mid-body; "stall": wait ``stall_s`` before the body;
    - "500" / "503": answer that server error;
    - "endless": a 200 with no Content-Length and a body that never ends;
    - "ignore_range": answer a Range request with 200 and the whole file;
    - "trickle": send the body one byte every ``stall_s`` seconds;
    - "etag": answer with another ETag (the file changed between ranges);
    - "wrong_range": a 206 whose Content-Range names other bytes than asked;
    - "huge": claim a 600 MiB body (Content-Length) and send zeros for ever.
    """

    suffix: str
    kind: str
    times: int = 1
    stall_s: float = 3.0
    methods: tuple = ("GET",)
    skip: int = 0  # matching requests answered normally first


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # headers and body are two writes: with Nagle each response waited ~44 ms for the client's delayed ACK
    disable_nagle_algorithm = True
    server: RangeServer

    def log_message(self, *args):  # keep test output quiet
        pass

    def _file(self):
        rel = unquote(urlsplit(self.path).path).lstrip("/")
        path = os.path.realpath(os.path.join(self.server.root, rel))
        if not (path + os.sep).startswith(os.path.realpath(self.server.root) + os.sep) and \
                path != os.path.realpath(self.server.root):
            return None, rel
        return path, rel

    def do_HEAD(self):
        self._serve(body=False)

    def do_GET(self):
        self.server.began(1)
        try:
            if self.server.latency_s:
                time.sleep(self.server.latency_s)  # an object store's time to first byte
            self._serve(body=True)
        finally:
            self.server.began(-1)

    def _serve(self, body: bool):
        path, rel = self._file()
        self.server.count(rel, self.command)
        fault = self.server.take_fault(rel, self.command)
        kind = fault.kind if fault is not None else None
        if kind in ("500", "503"):
            return self._send(int(kind), b"injected failure", body=body)
        if path is None or not os.path.exists(path):
            return self._send(404, b"not found", body=body)  # a HEAD reply carries no body: keep-alive stays in step
        if os.path.isdir(path):
            names = sorted(os.listdir(path))
            links = "".join(f'<a href="{html.escape(n)}">{html.escape(n)}</a>\n' for n in names)
            return self._send(200, f"<html><body>{links}</body></html>".encode(), "text/html", body)
        st = os.stat(path)
        size = st.st_size
        etag = f'"{size:x}-{st.st_ino:x}-{st.st_mtime_ns:x}' + ('-other"' if kind == "etag" else '"')
        validators = {"ETag": etag, "Last-Modified": formatdate(st.st_mtime, usegmt=True)}
        if self.headers.get("If-None-Match") == etag:
            self.send_response(304)
            self.send_header("ETag", etag)
            self.end_headers()
            return
        if self.headers.get("If-Match") not in (None, etag):
            return self._send(412, b"precondition failed", body=body)
        if kind in ("endless", "huge"):
            self.send_response(200)
            if kind == "huge":
                self.send_header("Content-Length", str(600 << 20))
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            try:
                while body and not self.server.stopping:
                    self.wfile.write(b"\0" * 65536)
            except OSError:
                pass
            return
        if kind == "ignore_range":
            del self.headers["Range"]
        if kind == "wrong_range" and "Range" in self.headers:
            self.send_response(206)
            self.send_header("Content-Length", "1")
            self.send_header("Content-Range", f"bytes 0-0/{size}")
            self.end_headers()
            if body:
                self.wfile.write(b"x")
            return
        start, end = start_range_reply(self, size, validators)
        if not body:
            return
        with open(path, "rb") as f:
            data = os.pread(f.fileno(), end - start, start)
        if kind == "stall":
            time.sleep(fault.stall_s)
        if kind == "trickle":
            try:
                for i in range(len(data)):
                    if self.server.stopping:
                        break
                    self.wfile.write(data[i:i + 1])
                    self.wfile.flush()
                    time.sleep(fault.stall_s)
            except OSError:
                pass
            self.close_connection = True
            return
        if kind == "reset":
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(data)
        self.server.sent(rel, len(data))

    def _send(self, status: int, data: bytes, ctype: str = "text/plain", body: bool = True):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)


class RangeServer(ThreadingHTTPServer):
    """``RangeServer(root)``: serves ``root`` on 127.0.0.1 in a thread, with
    ETag / Last-Modified, If-None-Match (304) and If-Match (412); ``url``,
    ``requests`` (GETs per relative path), ``heads``, ``faults`` (list of Fault);
    ``latency_s``: a wait before answering each GET, the requests waiting side by side;
    ``max_in_flight``: the most GETs answered at once (set it to 0 to measure a span)."""

    daemon_threads = True
    # the listen backlog: at socketserver's 5, a client opening many connections at once lost SYNs and
    # waited the kernel's 1 s retransmit for some (an object store takes them all)
    request_queue_size = 128

    def __init__(self, root: str):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root = root
        self.requests: dict[str, int] = {}
        self.heads: dict[str, int] = {}
        self.body_bytes: dict[str, int] = {}
        self.faults: list[Fault] = []
        self.stopping = False
        self.latency_s = 0.0
        self.in_flight = self.max_in_flight = 0
        self._mu = threading.Lock()
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self._thread = threading.Thread(target=self.serve_forever, name="test-http", daemon=True)

    def began(self, n: int) -> None:
        with self._mu:
            self.in_flight += n
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def sent(self, rel: str, n: int) -> None:
        with self._mu:
            self.body_bytes[rel] = self.body_bytes.get(rel, 0) + n

    def bytes_sent(self, suffix: str = "") -> int:
        """Body bytes sent for paths ending in ``suffix`` (counted here, on the server's side)."""
        with self._mu:
            return sum(n for p, n in self.body_bytes.items() if p.endswith(suffix))

    def count(self, rel: str, method: str = "GET") -> None:
        with self._mu:
            d = self.requests if method == "GET" else self.heads
            d[rel] = d.get(rel, 0) + 1

    def gets(self, suffix: str) -> int:
        with self._mu:
            return sum(n for p, n in self.requests.items() if p.endswith(suffix))

    def head_count(self, suffix: str = "") -> int:
        with self._mu:
            return sum(n for p, n in self.heads.items() if p.endswith(suffix))

    def take_fault(self, rel: str, method: str = "GET") -> Fault | None:
        with self._mu:
            for f in self.faults:
                if f.times > 0 and rel.endswith(f.suffix) and method in f.methods:
                    if f.skip > 0:
                        f.skip -= 1
                        return None
                    f.times -= 1
                    return f
        return None

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.stopping = True
        self.shutdown()
        self.server_close()


S3_KEYS = {"key": "testing", "secret": "testing"}


def s3_options(endpoint: str) -> dict:
    return dict(S3_KEYS, client_kwargs={"endpoint_url": endpoint, "region_name": "us-east-1"})


def s3_client(endpoint: str):
    """A boto3 client of the loopback S3 server at ``endpoint`` (moto's test keys)."""
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                        region_name="us-east-1")


def upload_folder(endpoint: str, bucket: str, folder: str, prefix: str) -> None:
    s3 = s3_client(endpoint)
    for dirpath, _, files in os.walk(folder):
        for n in files:
            path = os.path.join(dirpath, n)
            key = prefix + "/" + os.path.relpath(path, folder).replace(os.sep, "/")
            s3.upload_file(path, bucket, key)


def fetch_in_child(cache_dir: str, limit: int, url: str, expected_hash, barrier_path: str):
    """A separate process's get() (multiprocessing target): announces itself
    with ``<barrier_path>.ready-<pid>``, then waits until ``barrier_path``
    exists so both children ask at the same moment. Returns (path, stats)."""
    from shardfeed.cache import ShardCache

    cache = ShardCache(cache_dir, limit)
    open(f"{barrier_path}.ready-{os.getpid()}", "w").close()
    while not os.path.exists(barrier_path):
        time.sleep(0.002)
    return cache.get(url, expected_hash), cache.stats()


def pin_in_child(cache_dir: str, limit: int, url: str, pinned_path: str, release_path: str) -> None:
    """Hold ``url`` pinned until ``release_path`` appears (multiprocessing target)."""
    from shardfeed.cache import ShardCache

    with ShardCache(cache_dir, limit).hold(url):
        open(pinned_path, "w").close()
        deadline = time.monotonic() + 240
        while not os.path.exists(release_path) and time.monotonic() < deadline:
            time.sleep(0.01)


class StaticServer(ThreadingHTTPServer):
    """The standard library's ``SimpleHTTPRequestHandler`` serving ``root`` on 127.0.0.1 in a
    thread, as ``python -m http.server`` does: no Range support (every GET of a file is a 200
    with the whole file). ``log`` lists (method, path, status, Range header or None). Each
    server of a process gets a port none before it had: clients remember what a server at a
    host and port does (http_source.note_ignores_range), as they would a real one."""

    daemon_threads = True
    ports: set = set()

    def __init__(self, root: str):
        import functools
        from http.server import SimpleHTTPRequestHandler

        log, mu = [], threading.Lock()

        class Handler(SimpleHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_request(self, code="-", size="-"):
                with mu:
                    log.append((self.command, unquote(urlsplit(self.path).path), int(getattr(code, "value", code)),
                                self.headers.get("Range")))

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), functools.partial(Handler, directory=root))
        while self.server_address[1] in StaticServer.ports:  # a client remembers a server by host and port
            self.server_close()
            super().__init__(("127.0.0.1", 0), functools.partial(Handler, directory=root))
        StaticServer.ports.add(self.server_address[1])
        self.log = log
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self._thread = threading.Thread(target=self.serve_forever, name="test-static-http", daemon=True)

    def gets(self, suffix: str = "") -> int:
        return sum(1 for m, p, _, _ in list(self.log) if m == "GET" and p.endswith(suffix))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()
