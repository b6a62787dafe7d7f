"""A loopback HTTP file server with Range support, a fixed bandwidth and a per-request latency.

One server stands for one node's link to remote storage: every response
body, whatever the number of connections, shares one byte budget per
second (paced, no bursts), so fetching N bytes takes N / rate seconds as it
would on a saturated link; each request first waits ``latency_s`` (an object
store's time to first byte), concurrent requests waiting side by side. The
link is shaped in the server itself (tc netem is not available in
containers). Counts requests and body bytes. For benchmarks; tests use
tests/cache_servers.py.

``inject(kind, suffix, times)`` makes the next ``times`` requests of paths
ending in ``suffix`` misbehave (the soak's server faults): ``"500"`` /
``"503"`` answer that error; ``"reset"`` sends half the body and resets
the connection; ``"stall"`` waits ``stall_s`` before the body; ``"trickle"``
sends the body a byte every ``trickle_s`` (until the client gives up).
``hits`` counts the faults served, by kind.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from shardfeed.tools.range_server import resolve, start_range_reply

_CHUNK = 64 << 10
FAULTS = ("500", "503", "reset", "stall", "trickle")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY: headers and body are two writes, and with Nagle the body waited for the
    # client's delayed ACK: 44 ms more per request on loopback, on top of the latency this
    # server shapes (measured on the demo's server, tools/train/serve.py)
    disable_nagle_algorithm = True
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
        kind = self.server.take_fault(self.path) if body else None  # on objects that exist: a fault, not a 404
        if kind in ("500", "503"):
            self.send_response(int(kind))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.server.began(1)
        try:
            if self.server.latency_s:
                time.sleep(self.server.latency_s)
            self.server.request()
            size = os.path.getsize(path)
            start, end = start_range_reply(self, size)
            if not body:
                return
            if kind is not None and self._misbehave(kind, path, start, end):
                return
            with open(path, "rb") as f:
                pos = start
                while pos < end:
                    data = os.pread(f.fileno(), min(_CHUNK, end - pos), pos)
                    self.server.pace(len(data))
                    self.server.send_counted(self.wfile, data)
                    pos += len(data)
        finally:
            self.server.began(-1)


    def _misbehave(self, kind: str, path: str, start: int, end: int) -> bool:
        """Serve fault ``kind`` (after the headers); True when the body is done with."""
        with open(path, "rb") as f:
            data = os.pread(f.fileno(), end - start, start)
        if kind == "stall":
            time.sleep(self.server.stall_s)
            return False
        self.close_connection = True
        try:
            if kind == "reset":
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.shutdown(socket.SHUT_RDWR)
            elif kind == "trickle":
                for i in range(len(data)):
                    self.wfile.write(data[i:i + 1])
                    self.wfile.flush()
                    time.sleep(self.server.trickle_s)
        except OSError:
            pass  # the client gave up: what a trickle is for
        return True


class ThrottledServer(ThreadingHTTPServer):
    """``ThrottledServer(root, bytes_per_s, latency_s=0)``: serves ``root`` on 127.0.0.1
    in a thread (``with`` starts and stops it); ``url``, ``bytes_sent``, ``requests``."""

    daemon_threads = True
    # the listen backlog: at socketserver's 5, a client opening many connections at once lost SYNs and
    # waited the kernel's 1 s retransmit for some (an object store takes them all)
    request_queue_size = 128

    def __init__(self, root: str, bytes_per_s: float, latency_s: float = 0.0):
        super().__init__(("127.0.0.1", 0), _Handler)
        if bytes_per_s <= 0 or latency_s < 0:
            raise ValueError(f"bytes_per_s={bytes_per_s!r} must be > 0 and latency_s={latency_s!r} >= 0")
        self.root = root
        self.rate = float(bytes_per_s)
        self.latency_s = float(latency_s)
        self.bytes_sent = 0
        self.requests = 0
        self.in_flight = 0  # requests being answered now
        self.max_in_flight = 0  # the most answered at once (reset it to measure a span)
        self._busy_s, self._busy_since = 0.0, 0.0  # time with at least one request answered (mean_in_flight)
        self._flight_s = 0.0  # integral of in_flight over time
        self._flight_at = time.monotonic()
        self._mu = threading.Lock()
        self._free_at = 0.0  # when the link is next free (monotonic)
        self.faults: list[list] = []  # [kind, suffix, times left] (inject)
        self.hits: Counter = Counter()
        self.stall_s, self.trickle_s = 8.0, 0.5
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

    def inject(self, kind: str, suffix: str, times: int = 1) -> None:
        if kind not in FAULTS:
            raise ValueError(f"fault kind {kind!r}: one of {', '.join(FAULTS)}")
        with self._mu:
            self.faults.append([kind, suffix, int(times)])

    def pending(self, suffix: str) -> bool:
        """Whether a fault armed on ``suffix`` has answers left to give."""
        with self._mu:
            return any(f[1] == suffix and f[2] > 0 for f in self.faults)

    def take_fault(self, request_path: str) -> str | None:
        with self._mu:
            for f in self.faults:
                if f[2] > 0 and request_path.split("?", 1)[0].endswith(f[1]):
                    f[2] -= 1
                    self.hits[f[0]] += 1
                    return f[0]
        return None

    def began(self, n: int) -> None:
        """A request began (``n`` = 1) or ended (-1) being answered."""
        with self._mu:
            now = time.monotonic()
            self._flight_s += self.in_flight * (now - self._flight_at)
            if self.in_flight:
                self._busy_s += now - self._flight_at
            self._flight_at = now
            self.in_flight += n
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def flight(self) -> tuple[float, float]:
        """(request-seconds answered, seconds with a request answered) so far: their ratio over a span is
        the mean number of requests in flight while any was."""
        with self._mu:
            now = time.monotonic()
            flight = self._flight_s + self.in_flight * (now - self._flight_at)
            busy = self._busy_s + (now - self._flight_at if self.in_flight else 0.0)
            return flight, busy

    def request(self) -> None:
        with self._mu:
            self.requests += 1

    def count(self, n: int) -> None:
        with self._mu:
            self.bytes_sent += n

    def send_counted(self, wfile, data: bytes) -> None:
        """Write ``data`` to a client, counted before the write: a client that has read every byte of a
        reply must find every byte counted (counting after the last write raced the client's read)."""
        self.count(len(data))
        try:
            wfile.write(data)
        except BaseException:
            self.count(-len(data))
            raise

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()


class ServerProcess:
    """A ThrottledServer in a process of its own (forked), so that its threads do not share the
    readers' interpreter lock (at thousands of small requests a second, a server in the readers'
    process took as much CPU as the readers). ``url``, ``bytes_sent``, ``requests``,
    ``max_in_flight`` (``reset_max()``) and ``flight()`` read the child's counters."""

    def __init__(self, root: str, bytes_per_s: float, latency_s: float = 0.0):
        import multiprocessing as mp

        ctx = mp.get_context("fork")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve_child, args=(child, root, bytes_per_s, latency_s), daemon=True)
        self.rate, self.latency_s = float(bytes_per_s), float(latency_s)
        self._proc.start()
        self.url = self._conn.recv()

    def _ask(self, what: str):
        self._conn.send(what)
        return self._conn.recv()

    @property
    def bytes_sent(self) -> int:
        return self._ask("bytes_sent")

    @property
    def requests(self) -> int:
        return self._ask("requests")

    @property
    def max_in_flight(self) -> int:
        return self._ask("max_in_flight")

    def reset_max(self) -> None:
        self._ask("reset_max")

    def flight(self) -> tuple[float, float]:
        return self._ask("flight")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self._ask("stop")
        except (OSError, EOFError):
            pass
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()


def _serve_child(conn, root: str, bytes_per_s: float, latency_s: float) -> None:
    with ThrottledServer(root, bytes_per_s, latency_s) as srv:
        conn.send(srv.url)
        while True:
            try:
                what = conn.recv()
            except EOFError:
                return
            if what == "stop":
                conn.send(None)
                return
            if what == "reset_max":
                with srv._mu:
                    srv.max_in_flight = srv.in_flight
                conn.send(None)
            elif what == "flight":
                conn.send(srv.flight())
            else:
                conn.send(getattr(srv, what))
